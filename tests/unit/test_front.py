"""The lanes' front (nginx): its fact, its operation, its site, the key maps it writes from the
keys on the box, and the settings that shape it.

Captures:
- lab-front-bare.txt: FrontState's command (lanes coder and fast) under sudo on a bare lab host
  (Debian 12, no nginx).
- lab-front-deployed.txt: the same on spark-1 of the lab after a deploy of the two default lanes
  (nginx 1.22.1 from Debian 12).
- lab-front-map-stale.txt: the same after `rm /etc/nginx/spark-keys/fast.conf`, a copy of
  coder.conf as old.conf, and a key byte changed in coder.conf, on the lab's spark-1.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest

import endpoints
from operations import front
from spark.inventory import ConfigError, load_from_dicts
from tests.unit.certificates import made
from tests.unit.harness import FakeHost, captured, file_facts, process, run_op
from tests.unit.test_config import TWO_SPARKS, merged

SITE = "/etc/nginx/conf.d/spark-lanes.conf"
LANES = [
    front.FrontLane("coder", 10101, 11101, key=True, timeout_s=3600),
    front.FrontLane("fast", 10102, 11102, key=True, timeout_s=3600),
]
RELOAD = "nginx -t -q && systemctl reload-or-restart nginx.service"


def site(lanes: list[front.FrontLane] = LANES, allow: list[str] | None = None, tls: bool = False):
    """The site as the operation renders it (pyinfra's files.template reads the same file)."""
    source = (Path(__file__).parents[2] / "templates" / "nginx-spark-lanes.conf.j2").read_text()
    return jinja2.Template(source, keep_trailing_newline=True).render(
        lanes=lanes,
        allow_networks=allow or [],
        tls=tls,
        keys_dir="/etc/nginx/spark-keys",
        key_variables={lane.name: front.key_variable(lane.name) for lane in lanes if lane.key},
        certificate="/etc/spark/front/certificate.pem",
        certificate_key="/etc/spark/front/key.pem",
    )


def front_host(capture: str, site_text: str | None) -> FakeHost:
    return FakeHost({front.FrontState: captured(capture), **file_facts({SITE: site_text})})


def test_the_fact_reads_a_bare_box() -> None:
    assert process(front.FrontState, captured("lab-front-bare.txt")) == {
        "installed": False,
        "active": "inactive",
        "enabled": None,
        "default_site": False,
        "keys_dir": None,
        "map_files": [],
        "key_maps": {"coder": "differs", "fast": "differs"},
    }


def test_the_fact_reads_a_deployed_box() -> None:
    assert process(front.FrontState, captured("lab-front-deployed.txt")) == {
        "installed": True,
        "active": "active",
        "enabled": "enabled",
        "default_site": False,
        "keys_dir": "root 700",
        "map_files": ["coder", "fast"],
        "key_maps": {"coder": "same", "fast": "same"},
    }


def test_a_bare_box_gets_nginx_the_key_maps_and_the_site() -> None:
    host = front_host("lab-front-bare.txt", None)
    commands = run_op(front.lanes_front, host=host, lanes=LANES, allow_networks=[])
    assert commands[0].startswith("apt-get update -qq && ")
    assert commands[0].endswith(" install -y -o Dpkg::Options::=--force-confdef"
                                " -o Dpkg::Options::=--force-confold nginx")  # fmt: skip
    # The package's welcome site goes with the install (the fact could not see it yet).
    assert commands[1] == "rm -f /etc/nginx/sites-enabled/default"
    assert commands[2] == "install -d -m 700 -o root -g root /etc/nginx/spark-keys"
    for command, lane in zip(commands[3:5], ("coder", "fast"), strict=True):
        assert command.startswith(
            "install -d -m 700 -o root -g root /etc/spark/secrets"
            f" && [ -s /etc/spark/secrets/{lane}.key ] || ( umask 077;"
        )
        assert command.endswith(
            f" > /etc/nginx/spark-keys/{lane}.conf.new"
            f" && mv /etc/nginx/spark-keys/{lane}.conf.new /etc/nginx/spark-keys/{lane}.conf )"
        )
    assert commands[-2:] == ["systemctl enable nginx.service", RELOAD]
    assert host.uploads[SITE] == site()


def test_a_deployed_box_needs_nothing() -> None:
    host = front_host("lab-front-deployed.txt", site())
    assert run_op(front.lanes_front, host=host, lanes=LANES, allow_networks=[]) == []
    assert host.noops[-1] == "nginx asks the key on every path of 2 lane(s)"


def test_a_changed_key_a_missing_map_and_a_stale_one_are_put_right_then_reloaded() -> None:
    host = front_host("lab-front-map-stale.txt", site())
    commands = run_op(front.lanes_front, host=host, lanes=LANES, allow_networks=[])
    written = [c.rpartition(" && mv ")[2].split()[-2] for c in commands if " && mv " in c]
    assert written == ["/etc/nginx/spark-keys/coder.conf", "/etc/nginx/spark-keys/fast.conf"]
    assert "rm -f /etc/nginx/spark-keys/old.conf" in commands
    assert commands[-1] == RELOAD
    assert SITE not in host.uploads  # the site itself was right


def test_a_new_allow_list_rewrites_the_site_and_reloads() -> None:
    host = front_host("lab-front-deployed.txt", site())
    commands = run_op(front.lanes_front, host=host, lanes=LANES, allow_networks=["192.168.1.0/24"])
    assert commands[0].startswith("FileUploadCommand(") and SITE in commands[0]
    assert commands[-1] == RELOAD
    text = host.uploads[SITE]
    assert text.count("    allow 192.168.1.0/24;\n    deny all;\n") == 2


def test_tls_puts_the_files_root_only_and_listens_with_ssl(tmp_path: Path) -> None:
    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    certificate.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")
    host = front_host("lab-front-deployed.txt", site())
    host.outputs |= file_facts(
        {"/etc/spark/front/certificate.pem": None, "/etc/spark/front/key.pem": None}
    )
    commands = run_op(
        front.lanes_front,
        host=host,
        lanes=LANES,
        allow_networks=[],
        tls=(str(certificate), str(key)),
    )
    assert "chmod 600 /etc/spark/front/key.pem" in commands
    assert "chmod 644 /etc/spark/front/certificate.pem" in commands
    assert host.uploads["/etc/spark/front/key.pem"] == key.read_text()
    assert (
        "    listen 10101 ssl;\n    ssl_certificate /etc/spark/front/certificate.pem;\n"
        in (host.uploads[SITE])
    )
    assert commands[-1] == RELOAD


def test_the_site_asks_the_key_first_and_forwards_v1_and_health_only() -> None:
    text = site([front.FrontLane("coder", 10101, 11101, key=True, timeout_s=3600)])
    server = text[text.index("server {") :]
    # The key map is included beside the server, from the root-only directory.
    assert "include /etc/nginx/spark-keys/coder.conf;\nserver {" in text
    # The key check comes before the first location, so it holds for every path.
    assert server.index("if ($spark_key_coder = 0) {") < server.index("    location ")
    assert "    listen 10101;\n" in server
    assert "proxy_buffering off;" in server
    assert "proxy_read_timeout 3600s;\n    proxy_send_timeout 3600s;\n" in server
    locations = [line.strip() for line in server.splitlines() if line.startswith("    location")]
    assert locations == ["location /v1/ {", "location = /health {", "location / {"]
    assert server.count("proxy_pass http://127.0.0.1:11101;") == 2
    assert "return 404" in server[server.index("location / {") :]


def test_a_lane_without_a_key_is_forwarded_without_asking() -> None:
    text = site([front.FrontLane("open", 10105, 11105, key=False, timeout_s=3600)])
    assert "include" not in text and "$spark_key" not in text
    assert "proxy_pass http://127.0.0.1:11105;" in text


def run_key_map(tmp_path: Path, key: str) -> subprocess.CompletedProcess:
    key_file = tmp_path / "coder.key"
    key_file.write_text(key)
    shell = front.key_map("coder").replace("/etc/spark/secrets/coder.key", str(key_file))
    return subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=False)


def test_the_key_map_is_printed_from_the_key_file(tmp_path: Path) -> None:
    printed = run_key_map(tmp_path, "Zm9v-YmFy_0123")
    assert printed.returncode == 0
    assert printed.stdout == (
        "map $http_authorization $spark_key_coder {\n"
        "    default 0;\n"
        '    "Bearer Zm9v-YmFy_0123" 1;\n'
        "}\n"
    )
    # The key is never an argument of the command: only the file's path is.
    assert "Zm9v" not in front.key_map("coder")


@pytest.mark.parametrize("key", ['x" 1; } server { listen 80', "", "two words"])
def test_a_key_that_is_no_bearer_token_is_refused(tmp_path: Path, key: str) -> None:
    printed = run_key_map(tmp_path, key)
    assert printed.returncode != 0
    assert printed.stdout == ""
    assert "not a Bearer token" in printed.stderr
    assert not key or key not in printed.stderr  # the message names the file, not the key


def refused(**data: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load_from_dicts(merged({**TWO_SPARKS, "spark-1": TWO_SPARKS["spark-1"] | data}))
    return str(caught.value)


def test_allow_networks_must_be_ipv4_networks() -> None:
    message = refused(front_allow_networks=["192.168.1.0/24", "lan"])
    assert (
        "spark-1: front_allow_networks: 'lan' is not an IPv4 network; write it as a string"
        ' A.B.C.D/prefix, e.g. "192.168.1.0/24"'
    ) in message


def test_tls_needs_both_files_pem_and_unencrypted(tmp_path: Path) -> None:
    certificate = tmp_path / "cert.pem"
    certificate.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    assert (
        "spark-1: front_tls_key_file: front_tls_certificate_file and front_tls_key_file: give"
        " both, or neither"
    ) in refused(front_tls_certificate_file=str(certificate))

    encrypted = tmp_path / "key.pem"
    encrypted.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIE\n")
    assert "spark-1: front_tls_key_file: the key is encrypted; give nginx an unencrypted key" in (
        refused(front_tls_certificate_file=str(certificate), front_tls_key_file=str(encrypted))
    )
    assert "spark-1: front_tls_certificate_file: the file holds no PEM certificate" in refused(
        front_tls_certificate_file=str(encrypted), front_tls_key_file=str(encrypted)
    )


def test_a_key_pasted_for_its_path_is_never_shown() -> None:
    pasted = "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
    message = refused(front_tls_key_file=pasted, front_tls_certificate_file=None)
    assert "front_tls_key_file: the value is no file on this machine (not shown)" in message
    assert "MIIEvQ" not in message


def test_the_settings_reach_the_host_config(tmp_path: Path) -> None:
    front = made(tmp_path / "front", "spark-1", ("spark-1",))
    certificate, key = front.path, front.key_path
    data = {
        "front_allow_networks": ["192.168.1.7/24"],
        "front_tls_certificate_file": str(certificate),
        "front_tls_key_file": str(key),
    }
    spark = load_from_dicts(merged({**TWO_SPARKS, "spark-1": TWO_SPARKS["spark-1"] | data}))
    head = spark.host("spark-1")
    assert head.front_allow_networks == ("192.168.1.0/24",)  # the network of a host address
    assert head.front_tls == (str(certificate), str(key))
    assert spark.host("spark-2").front_tls is None


def test_clients_are_given_https_urls_when_the_front_has_a_certificate(tmp_path: Path) -> None:
    front = made(tmp_path / "front", "spark-1", ("spark-1",))
    certificate, key = front.path, front.key_path
    data = {"front_tls_certificate_file": str(certificate), "front_tls_key_file": str(key)}
    spark = load_from_dicts(merged({**TWO_SPARKS, "spark-1": TWO_SPARKS["spark-1"] | data}))
    urls = [e.url for e in endpoints.endpoints_of(spark.host("spark-1"), "spark-1.local")]
    assert urls == ["https://spark-1.local:10101/v1", "https://spark-1.local:10102/v1"]
    urls = [e.url for e in endpoints.endpoints_of(spark.host("spark-2"), "spark-2.local")]
    assert urls == ["http://spark-2.local:10101/v1", "http://spark-2.local:10102/v1"]
