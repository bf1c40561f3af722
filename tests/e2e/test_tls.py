"""The front's TLS options (front_tls_certificate_file, front_tls_key_file, front_tls_ca_file)
with real clients: curl and the OpenAI Python client talk to a lane over HTTPS with a
certificate of a lab authority they are given, a streamed chat included, and refuse it where
they trust only the system's authorities; the fleet's router (LiteLLM, on for this deploy:
tests/e2e/router_inventory.py) reaches the TLS lanes trusting that authority, and answers a
client over HTTPS at its own port.

The router's virtualenv is what the router's module (test_router, before this one on the
shared deployed lab) left on the head; the module after this one deploys the lab's own
inventory again, which takes the router off (its virtualenv kept)."""

from __future__ import annotations

import json
import ssl
import subprocess
from pathlib import Path

import pytest

from spark.router import CA_BUNDLE
from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.test_lanes import A, key_of
from tests.e2e.test_router import API_BASE, fleet_key_of
from tests.e2e.test_router import INVENTORY as ROUTED
from tests.e2e.test_router import endpoint as fleet_endpoint
from tests.simlab.waits import patiently

pytestmark = pytest.mark.lab

CHAT = [{"role": "user", "content": "count to 3"}]
SAID = f"{A['served_name']} got: count to 3"  # what the stand-in answers (test_lanes)


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def lab_authority(directory: Path, ips: list[str]) -> tuple[Path, Path, Path]:
    """A certificate authority made for the test, and a server certificate it signed for
    these addresses (subjectAltName IP entries: clients match an address against them)."""
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    certificate, key = directory / "certificate.pem", directory / "key.pem"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-noenc"]
    openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
            "-subj", "/CN=spark lab authority")  # fmt: skip
    san = "subjectAltName=" + ",".join(f"IP:{ip}" for ip in ips)
    request = directory / "request.pem"
    openssl("req", "-new", *ec, "-keyout", str(key), "-out", str(request),
            "-subj", "/CN=spark lanes", "-addext", san)  # fmt: skip
    openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "2", "-copy_extensions", "copy",
            "-out", str(certificate))  # fmt: skip
    return ca, certificate, key


def curl(url: str, key: str, *args: str) -> subprocess.CompletedProcess:
    # The key goes in on stdin (`-H @-`), never on the command line.
    return patiently(lambda: subprocess.run(
        ["curl", "-sS", "--no-buffer", "-H", "@-", *args, url],
        input=f"Authorization: Bearer {key}\n", capture_output=True, text=True, timeout=30,
    ), 120, url)  # fmt: skip


def test_clients_talk_to_a_lane_over_tls_and_refuse_an_untrusted_certificate(
    deployed_lab: Deployed, tmp_path: Path
) -> None:
    # Here, not at the top: a checkout whose .venv predates it (`make venv` installs it) still
    # collects the other tests.
    import openai

    hosts = deployed_lab.lab.hosts
    ca, certificate, key = lab_authority(tmp_path, [host.mgmt_ip for host in hosts])
    pyinfra(ROUTED, "deploy.py", "--data", f"front_tls_certificate_file={certificate}",
            "--data", f"front_tls_key_file={key}", "--data", f"front_tls_ca_file={ca}",
            timeout=1500)  # fmt: skip
    host = hosts[1]
    lane_key = key_of(host, A)
    base = f"https://{host.mgmt_ip}:{A['port']}/v1"
    assert run_on(host, "sudo stat -c '%U %a' /etc/spark/front/key.pem").strip() == "root 600"

    # curl, given the authority: a streamed chat, its events in order, [DONE] last.
    body = json.dumps({"model": A["served_name"], "messages": CHAT, "stream": True})
    done = curl(f"{base}/chat/completions", lane_key, "--cacert", str(ca),
                "-H", "Content-Type: application/json", "-d", body)  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = [line[6:] for line in done.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", done.stdout
    said = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert said.endswith(SAID), said
    # curl trusting the system's authorities only: refused (60: peer certificate not verified).
    refused = curl(f"{base}/models", lane_key)
    assert refused.returncode == 60, refused.stderr

    # The OpenAI Python client, given the authority: the models, a chat, a streamed chat.
    trusted = ssl.create_default_context(cafile=str(ca))
    http_client = openai.DefaultHttpxClient(verify=trusted)
    with openai.OpenAI(
        base_url=base, api_key=lane_key, max_retries=0, http_client=http_client
    ) as client:
        assert [model.id for model in client.models.list()] == [A["served_name"]]
        reply = client.chat.completions.create(model=A["served_name"], messages=CHAT)
        assert reply.choices[0].message.content.endswith(SAID)
        chunks = list(client.chat.completions.create(model=A["served_name"], messages=CHAT,
                                                     stream=True))  # fmt: skip
        said = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        assert said.endswith(SAID), said
        assert chunks[-1].choices[0].finish_reason == "stop"
    # ...and with its own default trust: no connection, for the certificate.
    with (
        openai.OpenAI(base_url=base, api_key=lane_key, max_retries=0) as client,
        pytest.raises(openai.APIConnectionError) as refusal,
    ):
        client.models.list()
    cause = refusal.value.__cause__
    while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
        cause = cause.__cause__ or cause.__context__
    assert isinstance(cause, ssl.SSLCertVerificationError), repr(refusal.value)

    # The fleet's router, at its own port of the head's front (TLS too), with the fleet key: a
    # chat answered by a lane it reached over HTTPS, trusting the lab's authority (its bundle).
    fleet = fleet_endpoint()
    router = deployed_lab.lab.host(fleet.boxes[0].name)
    assert run_on(router, f"sudo stat -c '%U %a' {CA_BUNDLE}").strip() == "root 644"
    body = json.dumps({"model": A["served_name"], "messages": CHAT})
    routed = curl(f"https://{router.mgmt_ip}:{fleet.port}/v1/chat/completions",
                  fleet_key_of(router), "--cacert", str(ca), "-D", "-",
                  "-H", "Content-Type: application/json", "-d", body)  # fmt: skip
    assert routed.returncode == 0, routed.stderr
    head, _, answer = routed.stdout.partition("\n\n")  # curl's CRLFs read as text
    assert head.startswith("HTTP/1.1 200"), routed.stdout
    fields = (line.partition(":") for line in head.splitlines()[1:])
    headers = {name.strip().lower(): value.strip() for name, _, value in fields}
    lanes = {f"https://{host.mgmt_ip}:{A['port']}/v1" for host in hosts}
    assert headers[API_BASE] in lanes, headers
    assert json.loads(answer)["choices"][0]["message"]["content"].endswith(SAID), answer
