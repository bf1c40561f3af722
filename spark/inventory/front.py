"""The front's keys: who may reach the lanes' ports (nginx, asking each lane's key) and the
TLS certificate they speak HTTPS with."""

from __future__ import annotations

import re
from ipaddress import IPv4Network
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ValidationInfo, field_validator

from spark.options import option

PEM_PRIVATE_KEY = re.compile(r"-----BEGIN (RSA |EC )?PRIVATE KEY-----")


def networks(value: object) -> object:
    """A list of networks as group_data writes them, strings, parsed (strict=False for this one:
    a string is no IPv4Network to pydantic's strict mode)."""
    if not isinstance(value, list):
        return value
    parsed = []
    for item in value:
        try:
            if not isinstance(item, str):
                raise TypeError
            parsed.append(IPv4Network(item, strict=False))
        except (ValueError, TypeError):
            raise ValueError(
                f"{item!r} is not an IPv4 network; write it as a string A.B.C.D/prefix,"
                ' e.g. "192.168.1.0/24"'
            ) from None
    return parsed


# An allow-list of client networks (the front's, the metrics endpoint's).
Networks = Annotated[list[IPv4Network], BeforeValidator(networks)]


class FrontKeys(BaseModel):
    """A box's keys for the front that owns its lanes' ports."""

    front_allow_networks: Networks = option(
        'client networks the lanes\' front admits, e.g. ["192.168.1.0/24"];'
        " [] admits any (each lane still asks its key)",
        why="nginx owns each lane's port and asks the lane's key on every path: vLLM's own"
        " --api-key leaves /invocations, /tokenize and /metrics open (vLLM's security guide);"
        " this narrows who may connect at all.",
    )
    front_tls_certificate_file: str | None = option(
        "None, or a PEM certificate (chain) file on this machine: the lanes' ports speak HTTPS",
        why="TLS at the front: the file is copied to each box.",
    )
    front_tls_key_file: str | None = option(
        "None, or the certificate's PEM private key file on this machine",
        why="The certificate's key, unencrypted, copied root-only to each box (/etc/spark/front/).",
    )
    front_tls_ca_file: str | None = option(
        "None (the router trusts the box's certificate file as it is: right for a self-signed"
        " one), or a PEM file on this machine holding the authority that signed it",
        why="The fleet's router reaches each lane over HTTPS through its front and verifies the"
        " certificate against the bundle it is given (LiteLLM's litellm_settings.ssl_verify:"
        ' docs, guides/security_settings, "Custom CA Bundle"), not the system\'s authorities.',
    )

    @field_validator("front_tls_certificate_file", "front_tls_key_file", "front_tls_ca_file")
    @classmethod
    def _pem_file(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is None:
            return None
        file = Path(path).expanduser()
        if not file.is_file():
            # Not shown: a key pasted in place of its path would be printed.
            raise ValueError("the value is no file on this machine (not shown); give a path")
        text = file.read_text(errors="replace")
        if info.field_name in ("front_tls_certificate_file", "front_tls_ca_file"):
            if "-----BEGIN CERTIFICATE-----" not in text:
                raise ValueError("the file holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        elif "-----BEGIN ENCRYPTED PRIVATE KEY-----" in text:
            # nginx would ask for the passphrase at every start, with nobody to type it.
            raise ValueError("the key is encrypted; give nginx an unencrypted key (root 0600)")
        elif not PEM_PRIVATE_KEY.search(text):
            raise ValueError("the file holds no PEM private key (-----BEGIN PRIVATE KEY-----)")
        return path

    def front_problems(self) -> dict[str, list[str]]:
        """The certificate and its key go together."""
        return {
            "front_tls_key_file": (
                ["front_tls_certificate_file and front_tls_key_file: give both, or neither"]
                if (self.front_tls_certificate_file is None) != (self.front_tls_key_file is None)
                else []
            ),
        }
