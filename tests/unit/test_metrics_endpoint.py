"""The metrics endpoint (operations/metrics.py): its fact, its operation, the key map it writes
from the key on the box, its nginx site, the settings that shape it and the plan's values.

Captures:
- lab-metrics-bare.txt: MetricsState's command under sudo on a bare lab host (Debian 12, no
  node exporter, no nginx), the lab of SIMLAB_ID 51.
- lab-metrics-deployed.txt: the same on spark-1 of that lab after a deploy of the default
  inventory (prometheus-node-exporter 1.5.0 from Debian 12).
- lab-metrics-not-reloaded.txt: the same after the site was moved away, nginx reloaded and the
  site put back without a reload (what a run cut off between the two leaves): nothing listens
  on 9100.
Each asked for ports 9100 and 9101 (metrics_port and the exporter's).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest

from operations import metrics
from spark.inventory import ConfigError, load_from_dicts
from spark.plan import plan
from stages import lanes_front
from tests.unit.harness import FakeHost, captured, file_facts, process, run_op
from tests.unit.test_config import TWO_SPARKS, merged

TEMPLATES = Path(__file__).parents[2] / "templates"
EXPECTED = {"floor_gib": 8, "mtu": 9000, "lanes": []}
RELOAD = "nginx -t -q && systemctl reload-or-restart nginx.service"
UNITS = "/etc/systemd/system"


def render(name: str, **variables: Any) -> str:
    source = (TEMPLATES / name).read_text()
    return jinja2.Template(source, keep_trailing_newline=True).render(**variables)


def site(allow: list[str] | None = None, tls: bool = False, lanes: list[dict] | None = None) -> str:
    return render(
        "nginx-spark-metrics.conf.j2",
        port=9100,
        exporter_port=9101,
        allow_networks=allow or [],
        tls=tls,
        certificate="/etc/spark/front/certificate.pem",
        certificate_key="/etc/spark/front/key.pem",
        key_map="/etc/nginx/spark-metrics/key.conf",
        key_variable="$spark_metrics_key",
        lanes=[lane | {"auth": f"$spark_lane_auth_{lane['name']}"} for lane in lanes or []],
    )


def deployed_files() -> dict[str, str | None]:
    """The files as a deploy with these arguments leaves them."""
    collector = (Path(__file__).parents[2] / "files/spark_metrics.py").read_text()
    # The twins' readings, shared with the deploy, installed beside the collector (it imports it).
    readings = (Path(__file__).parents[2] / "spark/twin.py").read_text()
    return {
        "/etc/default/prometheus-node-exporter": render(
            "prometheus-node-exporter.default.j2",
            port=9100,
            exporter_port=9101,
            textfile_dir="/var/lib/prometheus/node-exporter",
        ),
        "/usr/local/lib/spark/spark_twin.py": readings,
        "/usr/local/lib/spark/spark_metrics.py": collector,
        "/etc/spark/metrics/expected.json": None,  # its mode (0600) differs from file_facts'
        f"{UNITS}/spark-metrics.service": render(
            "spark-metrics.service.j2",
            collector="/usr/local/lib/spark/spark_metrics.py",
            expected="/etc/spark/metrics/expected.json",
            out="/var/lib/prometheus/node-exporter/spark.prom",
        ),
        f"{UNITS}/spark-metrics.timer": render("spark-metrics.timer.j2", interval_s=30),
        "/etc/nginx/conf.d/spark-metrics.conf": site(),
    }


def run(capture: str, files: dict[str, str | None], **changes: Any) -> tuple[list[str], FakeHost]:
    host = FakeHost({metrics.MetricsState: captured(capture), **file_facts(files)})
    arguments = {"port": 9100, "exporter_port": 9101, "interval_s": 30, "allow_networks": []}
    arguments |= {"tls": False, "expected": EXPECTED, "lanes": []} | changes
    return run_op(metrics.endpoint, host=host, **arguments), host


def test_the_fact_reads_a_bare_and_a_deployed_box() -> None:
    assert process(metrics.MetricsState, captured("lab-metrics-bare.txt")) == {
        "installed": False,
        "units": {
            "prometheus-node-exporter.service": {"ActiveState": "inactive", "UnitFileState": ""},
            "spark-metrics.timer": {"ActiveState": "inactive", "UnitFileState": ""},
        },
        "textfile_dir": False,
        "key_map": "differs",
        "listening": [],
    }
    assert process(metrics.MetricsState, captured("lab-metrics-deployed.txt")) == {
        "installed": True,
        "units": {
            "prometheus-node-exporter.service": {
                "ActiveState": "active",
                "UnitFileState": "enabled",
            },
            "spark-metrics.timer": {"ActiveState": "active", "UnitFileState": "enabled"},
        },
        "textfile_dir": True,
        "key_map": "same",
        "listening": [9100, 9101],
    }
    assert process(metrics.MetricsState, captured("lab-metrics-not-reloaded.txt"))["listening"] == [
        9101
    ]


def test_a_bare_box_gets_the_exporter_the_collector_its_timer_and_the_front() -> None:
    commands, host = run("lab-metrics-bare.txt", dict.fromkeys(deployed_files()))
    # Its arguments before the package: its first start listens on 127.0.0.1 already (dpkg
    # keeps a conffile that is there: --force-confold), never on the LAN without the key.
    install = next(i for i, c in enumerate(commands) if c.startswith("apt-get update -qq && "))
    written = [i for i, c in enumerate(commands) if "/etc/default/prometheus-node-exporter" in c]
    assert written and max(written) < install
    assert commands[install].endswith(" prometheus-node-exporter")
    assert commands[install + 1] == (
        "install -d -m 755 -o root -g root /var/lib/prometheus/node-exporter"
    )
    assert host.uploads["/etc/default/prometheus-node-exporter"].endswith(
        'ARGS="--web.listen-address=127.0.0.1:9101'
        ' --collector.textfile.directory=/var/lib/prometheus/node-exporter"\n'
    )
    assert host.uploads["/etc/spark/metrics/expected.json"] == (
        '{\n "floor_gib": 8,\n "mtu": 9000,\n "lanes": []\n}\n'
    )
    assert "chmod 600 /etc/spark/metrics/expected.json" in commands
    assert host.uploads["/etc/nginx/conf.d/spark-metrics.conf"] == site()
    key = next(c for c in commands if "_metrics.key" in c)
    assert key.startswith(
        "install -d -m 700 -o root -g root /etc/spark/secrets /etc/nginx/spark-metrics"
        " && [ -s /etc/spark/secrets/_metrics.key ] || ( umask 077;"
    )
    assert commands[-7:] == [
        "systemctl enable prometheus-node-exporter.service",
        "systemctl restart prometheus-node-exporter.service",  # its arguments were written
        "systemctl daemon-reload",
        "systemctl enable spark-metrics.timer",
        "systemctl restart spark-metrics.timer",
        "systemctl start spark-metrics.service",  # the figures now, not an interval later
        RELOAD,
    ]


def deployed_host(capture: str) -> FakeHost:
    """A box whose files are as the deploy wrote them, its state as ``capture`` says."""
    expected = '{\n "floor_gib": 8,\n "mtu": 9000,\n "lanes": []\n}\n'
    host = FakeHost(
        {
            metrics.MetricsState: captured(capture),
            **file_facts(deployed_files() | {"/etc/spark/metrics/expected.json": expected}),
        }
    )
    # file_facts answers 0644; the collector is 0755, the expected values' file 0600.
    for path, mode in (
        ("/usr/local/lib/spark/spark_metrics.py", "755"),
        ("/etc/spark/metrics/expected.json", "600"),
    ):
        host.outputs[metrics.util.RootFiles] = host.outputs[metrics.util.RootFiles].replace(
            f"{path}\troot root 644", f"{path}\troot root {mode}"
        )
    return host


ARGUMENTS = {
    "port": 9100,
    "exporter_port": 9101,
    "interval_s": 30,
    "allow_networks": [],
    "lanes": [],
}


def test_a_deployed_box_needs_nothing() -> None:
    host = deployed_host("lab-metrics-deployed.txt")
    commands = run_op(metrics.endpoint, host=host, tls=False, expected=EXPECTED, **ARGUMENTS)
    assert commands == []
    assert host.noops[-1] == "the metrics endpoint asks its key on port 9100"


def test_a_site_written_but_never_loaded_is_loaded() -> None:
    host = deployed_host("lab-metrics-not-reloaded.txt")
    commands = run_op(metrics.endpoint, host=host, tls=False, expected=EXPECTED, **ARGUMENTS)
    assert commands == [RELOAD]


def test_a_new_plan_value_runs_the_collector_again_without_restarting_the_exporter() -> None:
    files = deployed_files() | {"/etc/spark/metrics/expected.json": "{}\n"}
    commands, _host = run("lab-metrics-deployed.txt", files, expected={"floor_gib": 16})
    assert "systemctl restart prometheus-node-exporter.service" not in commands
    assert commands[-1] == "systemctl start spark-metrics.service"


def test_an_allow_list_and_tls_shape_the_site() -> None:
    text = site(allow=["192.168.1.0/24"], tls=True)
    assert "    listen 9100 ssl;\n    ssl_certificate /etc/spark/front/certificate.pem;" in text
    assert "    allow 192.168.1.0/24;\n    deny all;\n" in text
    # Before any location: no path answers without the key; /metrics alone is forwarded.
    assert text.index("if ($spark_metrics_key = 0)") < text.index("    location ")
    assert "location = /metrics {\n        proxy_pass http://127.0.0.1:9101;" in text


LANES = [
    {"name": "coder", "path": "/lanes/coder/metrics", "backend_port": 11101, "key": True},
    {"name": "fast", "path": "/lanes/fast/metrics", "backend_port": 11102, "key": False},
]


def test_each_lanes_own_metrics_behind_the_metrics_key() -> None:
    """A lane's /metrics at its path on the metrics port, from its server on loopback, after
    the key's check (a lane's key is not the metrics key: the map holds that one alone). The
    metrics key goes no further: a lane with a key gets its own, one without gets none."""
    text = site(lanes=LANES)
    for lane, auth in ((LANES[0], "$spark_lane_auth_coder"), (LANES[1], '""')):
        location = (
            f"    location = {lane['path']} {{\n        proxy_set_header Authorization {auth};\n"
            f"        proxy_pass http://127.0.0.1:{lane['backend_port']}/metrics;\n    }}\n"
        )
        assert location in text
        assert text.index("if ($spark_metrics_key = 0)") < text.index(location)
    commands, host = run("lab-metrics-deployed.txt", deployed_files(), lanes=LANES)
    assert host.uploads["/etc/nginx/conf.d/spark-metrics.conf"] == text
    assert commands[-1] == RELOAD
    assert "location = /lanes/" not in site()
    # A bare box: the key map is written with the keyed lane's "Bearer <key>" beside it.
    commands, _host = run("lab-metrics-bare.txt", dict.fromkeys(deployed_files()), lanes=LANES)
    key = next(c for c in commands if "_metrics.key" in c)
    assert metrics.key_map(("coder",)) in key and "/etc/spark/secrets/fast.key" not in key


def key_map_from(path: Path) -> subprocess.CompletedProcess:
    shell = metrics.key_map().replace(metrics.KEY_PATH, str(path))
    return subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=False)


def test_the_key_map_matches_the_key_alone(tmp_path: Path) -> None:
    """The key as key_made writes it (URL-safe base64, no padding, no newline) gives a map whose
    one regular expression matches "Bearer <key>" from start to end; anything else is refused."""
    key = tmp_path / "k"
    key.write_text("aB3-_x" * 7 + "z")
    done = key_map_from(key)
    assert done.returncode == 0
    assert done.stdout == (
        "map $http_authorization $spark_metrics_key {\n    default 0;\n"
        f'    "~^Bearer {"aB3-_x" * 7 + "z"}$" 1;\n}}\n'
    )
    for bad in ("", "a.b", "a b", "a$b", 'a"b'):
        key.write_text(bad)
        refused = key_map_from(key)
        assert refused.returncode != 0 and refused.stdout == ""


def test_a_keyed_lanes_key_is_printed_for_its_metrics(tmp_path: Path) -> None:
    """The lane's key file (a Bearer token, as the front checks it) gives a map whose one
    default is "Bearer <key>"; a key that is not a Bearer token prints nothing and fails."""
    metrics_key, lane_key = tmp_path / "m", tmp_path / "l"
    metrics_key.write_text("m" * 43)
    lane_key.write_text("aB3-_x.~+/=")
    shell = metrics.key_map(("coder",)).replace(metrics.KEY_PATH, str(metrics_key))
    shell = shell.replace("/etc/spark/secrets/coder.key", str(lane_key))
    # Redirected as the operation writes it: every map goes to the file.
    out = tmp_path / "key.conf"
    done = subprocess.run(["sh", "-c", f"{shell} > {out}"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert out.read_text() == (
        "map $http_authorization $spark_metrics_key {\n    default 0;\n"
        f'    "~^Bearer {"m" * 43}$" 1;\n}}\n'
        'map $host $spark_lane_auth_coder {\n    default "Bearer aB3-_x.~+/=";\n}\n'
    )
    lane_key.write_text('a"b')
    refused = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=False)
    assert refused.returncode != 0 and "spark_lane_auth" not in refused.stdout


def test_a_lane_on_the_metrics_ports_is_refused() -> None:
    hosts = merged(TWO_SPARKS)
    lane = dict(hosts["spark-1"]["lanes"][0], port=9101)
    hosts["spark-1"]["lanes"] = [lane]
    with pytest.raises(ConfigError) as refused:
        load_from_dicts(hosts)
    assert "port 9101 is the node exporter's (on 127.0.0.1)" in str(refused.value)


def test_a_metrics_port_among_the_boxs_services_ports_is_refused() -> None:
    """32768-60999: the kernel's ephemeral range (spark/ports.py, Linux's ip-sysctl docs);
    8265: Ray's dashboard, where metrics_port 8264 puts the exporter (the port after it)."""
    for port, said in (
        (40000, "port 40000 (the metrics endpoint's) is in the kernel's ephemeral range"),
        (8264, "port 8265 (the node exporter's (on 127.0.0.1)) is Ray's"),
    ):
        hosts = merged(TWO_SPARKS)
        hosts["spark-1"]["metrics_port"] = port
        with pytest.raises(ConfigError) as refused:
            load_from_dicts(hosts)
        assert said in str(refused.value)


def test_the_plan_gives_the_collector_the_boxes_values() -> None:
    """group_data's defaults: MTU 9000, 200000 Mb/s, GID index 3, driver 580, the guard's 8.5
    GiB, the two lanes coder (10101, vLLM on 11101) and fast (10102, 11102); a pair runs the
    NCCL test, whose verdict is kept in /var/lib/spark/nccl-test/verdict.json."""
    head = plan(load_from_dicts(merged(TWO_SPARKS))).box("spark-1")
    assert head.metrics is not None
    assert (head.metrics.port, head.metrics.exporter_port, head.metrics.interval_s) == (
        9100,
        9101,
        30,
    )
    expected = head.metrics.expected.model_dump(mode="json")
    assert {key: expected[key] for key in ("floor_gib", "mtu", "rate_mbps", "gid_index")} == {
        "floor_gib": 8.5,
        "mtu": 9000,
        "rate_mbps": 200000,
        "gid_index": 3,
    }
    assert expected["driver_branch"] == 580
    assert expected["twins"] == [
        {"ifname": "enp1s0f1np1", "hca": "rocep1s0f1", "address": "192.168.100.10"},
        {"ifname": "enP2p1s0f1np1", "hca": "roceP2p1s0f1", "address": "192.168.101.10"},
    ]
    assert [(lane["name"], lane["port"], lane["backend_port"]) for lane in expected["lanes"]] == [
        ("coder", 10101, 11101),
        ("fast", 10102, 11102),
    ]
    # As the stage hands them to the operation: every lane with its key (group_data's lanes
    # have api_key True).
    assert lanes_front.metrics_lanes(head.metrics) == [
        {"name": "coder", "path": "/lanes/coder/metrics", "backend_port": 11101, "key": True},
        {"name": "fast", "path": "/lanes/fast/metrics", "backend_port": 11102, "key": True},
    ]
    assert (expected["nccl"], expected["nccl_verdict"]) == (
        True,
        "/var/lib/spark/nccl-test/verdict.json",
    )
    hosts = merged(TWO_SPARKS)
    for data in hosts.values():
        data["metrics"] = False
    assert plan(load_from_dicts(hosts)).box("spark-1").metrics is None
