"""Real PEM certificates for the unit tests of the front's TLS, made with cryptography as an
owner makes them with openssl: an authority (self-signed, CA:TRUE), and certificates it or
their own key signed, naming subjectAltName entries."""

from __future__ import annotations

import datetime
from ipaddress import ip_address
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class Made:
    """A certificate and its key, written to ``<stem>.pem`` and ``<stem>.key``."""

    def __init__(self, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey, stem: Path):
        self.certificate, self.key = certificate, key
        self.path, self.key_path = stem.with_suffix(".pem"), stem.with_suffix(".key")
        self.path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        self.key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def made(
    stem: Path, common_name: str, names: tuple[str, ...] = (), issuer: Made | None = None
) -> Made:
    """A certificate for ``names`` (IP addresses as IP entries, others as DNS ones), signed by
    ``issuer``, else by its own key; an authority where ``names`` is empty."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.certificate.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=not names, path_length=None), critical=True)
    )
    if names:
        entries = [
            x509.IPAddress(ip_address(name)) if name[0].isdigit() else x509.DNSName(name)
            for name in names
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(entries), critical=False)
    certificate = builder.sign(issuer.key if issuer else key, hashes.SHA256())
    return Made(certificate, key, stem)
