"""Whether the router can trust a TLS front, read from the certificates on this machine before
any box is contacted: the router verifies each front as Python's ssl does (LiteLLM builds its
httpx client's context with ssl.create_default_context(cafile=<its ssl_verify>):
litellm/llms/custom_httpx/http_handler.py `_create_ssl_context`, LiteLLM 1.106.12), so the
front's certificate must chain to a self-signed certificate of the router's bundle, and its
subjectAltName must cover the address the router connects to.

cryptography reads the certificates: paramiko's own dependency (requirements.txt pins paramiko).
"""

from __future__ import annotations

from ipaddress import ip_address
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID


def certificates(path: str) -> list[x509.Certificate]:
    """The PEM certificates of a file, in its order (ValueError where none can be read)."""
    return x509.load_pem_x509_certificates(Path(path).expanduser().read_bytes())


def issued_by(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether ``issuer`` signed ``certificate`` (its name and its signature)."""
    try:
        certificate.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def name_of(certificate: x509.Certificate) -> str:
    common = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return repr(str(common[0].value)) if common else certificate.subject.rfc4514_string()


def chain_problem(chain: list[x509.Certificate], trusted: list[x509.Certificate]) -> str | None:
    """Why ``chain`` (the front's certificate, then what nginx sends with it) does not end at a
    self-signed certificate among ``trusted``; None where it does. OpenSSL, as Python 3.11 and
    3.12 set it up, anchors a chain at a self-signed certificate only (no partial chains)."""
    pool = trusted + chain[1:]
    current = chain[0]
    for _ in range(len(pool) + 1):
        if issued_by(current, current):
            return None if current in trusted else f"{name_of(current)} is not among them"
        issuer = next(
            (other for other in pool if other != current and issued_by(current, other)), None
        )
        if issuer is None:
            signer = current.issuer.rfc4514_string()
            return f"{name_of(current)} is signed by {signer!r}, which is not among them"
        current = issuer
    return "its chain does not end"


def alt_names(certificate: x509.Certificate) -> x509.SubjectAlternativeName | None:
    """The certificate's subjectAltName extension; None where it has none."""
    try:
        return certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None


def covers(certificate: x509.Certificate, address: str) -> bool:
    """Whether the certificate's subjectAltName names ``address``: an IP address against its IP
    entries, a name against its DNS entries (a wildcard for the leftmost label), as Python's
    ssl matches a host name since 3.7 (OpenSSL's X509_check_host, X509_check_ip)."""
    names = alt_names(certificate)
    if names is None:
        return False
    if is_ip(address):
        return ip_address(address) in names.get_values_for_type(x509.IPAddress)
    wanted = address.lower().rstrip(".").split(".")
    for name in names.get_values_for_type(x509.DNSName):
        labels = name.lower().rstrip(".").split(".")
        if len(labels) == len(wanted) and all(
            theirs == ours or (index == 0 and theirs == "*")
            for index, (theirs, ours) in enumerate(zip(labels, wanted, strict=True))
        ):
            return True
    return False


def san_entries(certificate: x509.Certificate) -> str:
    """The certificate's subjectAltName as openssl writes it (IP:..., DNS:...); none: (none)."""
    names = alt_names(certificate)
    if names is None:
        return "(none)"
    entries = [f"IP:{ip}" for ip in names.get_values_for_type(x509.IPAddress)]
    entries += [f"DNS:{name}" for name in names.get_values_for_type(x509.DNSName)]
    return ", ".join(entries) or "(none)"


def front_problems(box: str, address: str, certificate_file: str, ca_file: str | None) -> list[str]:
    """Why the router cannot reach ``box``'s TLS front at ``address``, each
    "<box>: <key>: <what>; <do>"; none where it can."""
    read: dict[str, list[x509.Certificate]] = {}
    unread = []
    # Each file read alone: the problem names the key whose file cryptography cannot read.
    for name, path in (
        ("front_tls_certificate_file", certificate_file),
        ("front_tls_ca_file", ca_file),
    ):
        if not path:
            continue
        try:
            read[name] = certificates(path)
        except ValueError as error:
            unread.append(
                f"{box}: {name}: cryptography reads no certificate there ({error}); give PEM ones"
            )
    if unread:
        return unread
    chain = read["front_tls_certificate_file"]
    trusted = read.get("front_tls_ca_file", chain)
    key = "front_tls_ca_file" if ca_file else "front_tls_certificate_file"
    found = []
    problem = chain_problem(chain, trusted)
    if problem:
        given = "front_tls_ca_file's" if ca_file else "the certificate file's own"
        found.append(
            f"{box}: {key}: the fleet's router trusts {given} certificates, and the front's"
            f" certificate does not chain to one: {problem}; give the authority that signed it"
            " (its self-signed root) in front_tls_ca_file"
        )
    if not covers(chain[0], address):
        kind = "IP" if is_ip(address) else "DNS"
        found.append(
            f"{box}: front_tls_certificate_file: its subjectAltName ({san_entries(chain[0])})"
            f" does not cover {address}, where the router reaches the box (its ssh_hostname,"
            f" else its name); make the certificate with subjectAltName {kind}:{address}"
        )
    return found


def is_ip(address: str) -> bool:
    try:
        ip_address(address)
    except ValueError:
        return False
    return True
