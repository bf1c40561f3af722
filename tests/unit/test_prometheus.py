"""The fleet's Prometheus configuration (spark/prometheus.py): a job per box, checked with
`promtool check config`, and its alert rules unit-tested with `promtool test rules`, both the
distribution's (Debian 12's prometheus 2.42, unpacked by tests/simlab/rootfs.py).

The series fed to the rules are named and labelled as files/spark_metrics.py writes them and as
Prometheus attaches a job's labels (job, instance, and the static config's box).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark import prometheus
from spark.inventory import load_from_dicts
from spark.plan import Plan, plan
from stages import prometheus_config
from tests.simlab.rootfs import prometheus_binaries
from tests.unit.certificates import made
from tests.unit.harness import captured
from tests.unit.test_config import TWO_SPARKS, merged


@pytest.fixture(scope="module")
def promtool() -> str:
    return str(prometheus_binaries() / "promtool")


def pair() -> Plan:
    return plan(load_from_dicts(merged(TWO_SPARKS)))


def written(tmp_path: Path) -> Path:
    """prometheus.yml and its rules in tmp_path, with a key file per box."""
    fleet = pair()
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "fleet").mkdir()
    for box in fleet.boxes:
        (keys / f"{box.name}.key").write_text("k\n")
        (keys / "fleet" / f"{box.name}.key").write_text("k\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus.dump(prometheus.scrape_config(fleet, str(keys))))
    (tmp_path / prometheus.RULES_FILE).write_text(prometheus.dump(prometheus.rules(fleet)))
    return config


def test_a_job_per_box_with_its_key_and_interval(tmp_path: Path) -> None:
    """The address pyinfra connects to (the inventory's name, TWO_SPARKS has no ssh_hostname),
    group_data's metrics_port 9100 and interval 30 s, each box's key file; then a job for each
    of its lanes (group_data's coder and fast), at the lane's path, with the same key."""
    jobs = prometheus.scrape_config(pair(), "/k")["scrape_configs"]
    assert [
        (
            job["job_name"],
            job["metrics_path"],
            job["static_configs"],
            job["authorization"],
            job["scrape_interval"],
            job["scheme"],
        )
        for job in jobs
    ] == [
        (
            f"spark-{name}{suffix}",
            path,
            [{"targets": [f"{name}:9100"], "labels": {"box": name} | labels}],
            {"type": "Bearer", "credentials_file": f"/k/{name}.key"},
            "30s",
            "http",
        )
        for name in ("spark-1", "spark-2")
        for suffix, path, labels in (
            ("", "/metrics", {}),
            ("/coder", "/lanes/coder/metrics", {"lane": "coder"}),
            ("/fast", "/lanes/fast/metrics", {"lane": "fast"}),
        )
    ] + [
        # The router on the head (group_data: router_box None), its port 10100 on the front,
        # its fleet key where make clients copies it.
        (
            "spark-router/spark-1",
            "/metrics/",
            [{"targets": ["spark-1:10100"], "labels": {"box": "spark-1"}}],
            {"type": "Bearer", "credentials_file": "/k/fleet/spark-1.key"},
            "30s",
            "http",
        )
    ]


def test_promtool_checks_the_config_and_its_rules(tmp_path: Path, promtool: str) -> None:
    done = subprocess.run(
        [promtool, "check", "config", str(written(tmp_path))], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 12 rules found" in done.stdout


def series(name: str, values: str, **labels: str) -> dict:
    labels = {"job": "spark-spark-1", "box": "spark-1", "instance": "spark-1:9100"} | labels
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


BOX = {"job": "spark-spark-1", "box": "spark-1", "instance": "spark-1:9100"}


def fires(alert: str, at: str, severity: str, summary: str, **labels: str) -> dict:
    return {
        "eval_time": at,
        "alertname": alert,
        "exp_alerts": [
            {
                "exp_labels": BOX | labels | {"severity": severity},
                "exp_annotations": {"summary": summary},
            }
        ],
    }


def quiet(alert: str, at: str) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def test_the_alert_rules_fire_on_each_fault_and_not_before(tmp_path: Path, promtool: str) -> None:
    """Scraped every 30 s; an alert with `for: 60s` (two collections) is pending at 30 s and
    fires at 60 s; the canary, memory and NCCL verdict alerts fire at once."""
    written(tmp_path)
    now = 600  # the collector's timestamp series, as time() runs in the test (from 0)
    tests = {
        "rule_files": [prometheus.RULES_FILE],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [
                    series("up", "0 0 0 0"),
                    series("spark_lane_up", "1 0 0 0", lane="fast"),
                    series("spark_lane_canary_passed", "0 0 0 0", lane="fast"),
                    series("spark_memory_available_bytes", "4294967296+0x3"),
                    series("spark_memory_guard_floor_bytes", "8589934592+0x3"),
                    series(
                        "spark_drift",
                        "1 1 1 1",
                        kind="mtu",
                        subject="enp1s0f1np1",
                        expected="9000",
                        found="1500",
                        severity="critical",
                    ),
                    # A twin at 100G on a box whose inventory accepts it (fabric_link_speed_low
                    # = "warn"): the collector's severity "warning".
                    series(
                        "spark_drift",
                        "1 1 1 1",
                        kind="rate",
                        subject="enP2p1s0f1np1",
                        expected=">= 200000",
                        found="100000",
                        severity="warning",
                    ),
                    series("spark_nccl_passed", "1 1 1 1"),
                    series("spark_nccl_age_seconds", "604900+0x3"),
                    series("spark_metrics_timestamp_seconds", f"{now}+0x3"),
                ],
                "alert_rule_test": [
                    quiet("SparkBoxDown", "30s"),
                    fires(
                        "SparkBoxDown",
                        "60s",
                        "critical",
                        "spark-1: its metrics endpoint does not answer (box down, nginx or the"
                        " node exporter stopped, or the key refused)",
                    ),
                    quiet("SparkLaneDown", "60s"),  # down from 30 s: pending
                    fires(
                        "SparkLaneDown",
                        "90s",
                        "critical",
                        "spark-1: lane fast is not active (journalctl -u spark-lane-fast)",
                        lane="fast",
                    ),
                    fires(
                        "SparkCanaryFailing",
                        "0s",
                        "critical",
                        "spark-1: lane fast failed its answer canary at its last start"
                        " (journalctl -u spark-lane-fast)",
                        lane="fast",
                    ),
                    fires(
                        "SparkMemoryBelowFloor",
                        "0s",
                        "critical",
                        "spark-1: MemAvailable below the memory guard's floor; it stops the"
                        " lowest-priority lane (journalctl -u spark-memguard)",
                    ),
                    {
                        "eval_time": "60s",
                        "alertname": "SparkFabricDrifted",
                        "exp_alerts": [
                            {
                                "exp_labels": BOX | labels | {"severity": severity},
                                "exp_annotations": {
                                    "summary": f"spark-1: {kind} of {subject} is {found}, the plan"
                                    f" says {expected}; deploy again (--limit spark-1)"
                                },
                            }
                            for kind, subject, expected, found, severity in (
                                ("mtu", "enp1s0f1np1", "9000", "1500", "critical"),
                                ("rate", "enP2p1s0f1np1", ">= 200000", "100000", "warning"),
                            )
                            for labels in [
                                {
                                    "kind": kind,
                                    "subject": subject,
                                    "expected": expected,
                                    "found": found,
                                }
                            ]
                        ],
                    },
                    quiet("SparkNcclFailing", "60s"),
                    fires(
                        "SparkNcclStale",
                        "0s",
                        "warning",
                        "spark-1: the NCCL test's verdict is older than a week (sudo"
                        " spark-nccl-test on every box)",
                    ),
                    quiet("SparkMetricsStale", "0s"),
                    quiet("SparkDriverDrifted", "60s"),
                ],
            },
            {
                "interval": "30s",
                "input_series": [
                    series("spark_nccl_passed", "0 0"),
                    series("spark_nccl_age_seconds", "60+0x1"),
                    series(
                        "spark_drift",
                        "1 1 1",
                        kind="driver",
                        subject="branch",
                        expected="580",
                        found="590",
                    ),
                    # the collector's line where the lock unit's journal has no lock this boot
                    # (files/spark_metrics.py gpu_clock)
                    series(
                        "spark_drift",
                        "1 1 1",
                        kind="gpu_clock",
                        subject="spark-gpu-clock-lock.service",
                        expected="300,2200",
                        found="none",
                    ),
                    # written at 0 and never again: stale once 90 s (three intervals) pass
                    series("spark_metrics_timestamp_seconds", "0+0x10"),
                ],
                "alert_rule_test": [
                    fires(
                        "SparkNcclFailing",
                        "0s",
                        "critical",
                        "spark-1: the NCCL test's last verdict failed (sudo cat"
                        " /var/lib/spark/nccl-test/run/report.txt)",
                    ),
                    quiet("SparkNcclStale", "0s"),
                    fires(
                        "SparkDriverDrifted",
                        "60s",
                        "critical",
                        "spark-1: driver branch 590 loaded, the plan says 580 (590 deadlocks"
                        " CUDA graphs on GB10)",
                        kind="driver",
                        subject="branch",
                        expected="580",
                        found="590",
                    ),
                    fires(
                        "SparkGpuClockUnlocked",
                        "60s",
                        "critical",
                        "spark-1: its GPU clock lock this boot is none, the plan says 300,2200"
                        " (GB10s power off under long prefills unlocked; journalctl -b -u"
                        " spark-gpu-clock-lock.service)",
                        kind="gpu_clock",
                        subject="spark-gpu-clock-lock.service",
                        expected="300,2200",
                        found="none",
                    ),
                    quiet("SparkMetricsStale", "90s"),  # 90 s behind: not more than 90
                    fires(
                        "SparkMetricsStale",
                        "210s",  # more than 90 s behind from 105 s, then 60 s pending
                        "warning",
                        "spark-1: the collector has not written for 3m 30s (systemctl status"
                        " spark-metrics.timer)",
                    ),
                ],
            },
        ],
    }
    test_file = tmp_path / "spark-rules.test.yml"
    test_file.write_text(json.dumps(tests, indent=1))
    done = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_make_prometheus_config_writes_both_files_for_the_owners_inventory(
    tmp_path: Path, promtool: str
) -> None:
    """inventories/lab.py's two boxes (spark-1.local, spark-2.local), no box contacted."""
    out, keys = tmp_path / "out", tmp_path / "keys"
    keys.mkdir()
    assert prometheus_config.main(["--inventory", "inventories/lab.py", "--out", str(out),
                                   "--keys-dir", str(keys)]) == 0  # fmt: skip
    config = json.loads((out / "prometheus.yml").read_text())
    assert [
        (job["static_configs"][0]["targets"], job["metrics_path"])
        for job in config["scrape_configs"]
    ] == [
        (["spark-1.local:9100"], "/metrics"),
        (["spark-1.local:9100"], "/lanes/coder/metrics"),
        (["spark-1.local:9100"], "/lanes/fast/metrics"),
        (["spark-2.local:9100"], "/metrics"),
        (["spark-2.local:9100"], "/lanes/coder/metrics"),
        (["spark-2.local:9100"], "/lanes/fast/metrics"),
        (["spark-1.local:10100"], "/metrics/"),
    ]
    (keys / "fleet").mkdir()
    (keys / "fleet/spark-1.local.key").write_text("k\n")
    for name in ("spark-1.local", "spark-2.local"):
        (keys / f"{name}.key").write_text("k\n")
    done = subprocess.run([promtool, "check", "config", str(out / "prometheus.yml")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_router_job_per_router_box_https_where_its_front_has_tls(tmp_path: Path) -> None:
    """The router on spark-2 (router_box), its failover on spark-1, whose front has a
    certificate: https there; spark-2's metrics at 15 s, the failover box's at 30 s."""
    front = made(tmp_path / "front", "spark-1", ("spark-1",))  # self-signed, for spark-1
    certificate, key = front.path, front.key_path
    router = {"router_box": "spark-2", "router_failover_box": "spark-1"}
    hosts = {
        "spark-1": TWO_SPARKS["spark-1"]
        | router
        | {"front_tls_certificate_file": str(certificate), "front_tls_key_file": str(key)},
        "spark-2": TWO_SPARKS["spark-2"] | router | {"metrics_interval_s": 15},
    }
    jobs = prometheus.scrape_config(plan(load_from_dicts(merged(hosts))), "/k")["scrape_configs"]
    assert [job for job in jobs if job["job_name"].startswith("spark-router/")] == [
        {
            "job_name": "spark-router/spark-2",
            "scrape_interval": "15s",
            "scheme": "http",
            "metrics_path": "/metrics/",
            "authorization": {"type": "Bearer", "credentials_file": "/k/fleet/spark-2.key"},
            "static_configs": [{"targets": ["spark-2:10100"], "labels": {"box": "spark-2"}}],
            # LiteLLM's hashed_api_key label: the hash of a client's key, kept out of Prometheus.
            "metric_relabel_configs": [{"action": "labeldrop", "regex": "hashed_api_key"}],
        },
        {
            "job_name": "spark-router/spark-1",
            "scrape_interval": "30s",
            "scheme": "https",
            "metrics_path": "/metrics/",
            "authorization": {"type": "Bearer", "credentials_file": "/k/fleet/spark-1.key"},
            "static_configs": [{"targets": ["spark-1:10100"], "labels": {"box": "spark-1"}}],
            # LiteLLM's hashed_api_key label: the hash of a client's key, kept out of Prometheus.
            "metric_relabel_configs": [{"action": "labeldrop", "regex": "hashed_api_key"}],
        },
    ]


ROUTER = {"job": "spark-router/spark-1", "box": "spark-1", "instance": "spark-1:10100"}
# LiteLLM 1.106.12's own lines (tests/unit/captured/real-litellm-1.106.12-metrics-replica-
# killed.txt): its proxy on loopback (bench/router.py's configuration) before `alpha` and a
# replica pair `beta`, lanes of the lab's vLLM stand-in; the replica at 127.0.0.4 killed, then
# 30 requests to beta, all answered: its requests' series at 1 (a failed request), its
# cooldown's at 2. The other deployments' series, at 0 throughout, are left out here.
BETA_DOWN = (
    "69500cd682b2249bf9180969962ae4c6ebe06c47f77eac6ffd0fe1ea8414d9e8",
    "http://127.0.0.4:38000",
)


def router_series(values: str, api_base: str) -> dict:
    model_id, address = BETA_DOWN
    labels = ROUTER | {"api_base": f"{address}{api_base}", "api_provider": "hosted_vllm",
                       "litellm_model_name": "beta", "model_id": model_id}  # fmt: skip
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"litellm_deployment_state{{{inner}}}", "values": values}


def test_the_routers_alerts_fire_on_its_faults_and_not_before(
    tmp_path: Path, promtool: str
) -> None:
    """The router's /metrics/ not answering for two collections; a lane it cooled down, from
    LiteLLM's own series, until a request to it is answered again (its requests' series back
    to 0): then no alert, though the cooldown's series stays at 2 (nothing resets it)."""
    written(tmp_path)
    lane_out = (
        "spark-1: the router took beta at http://127.0.0.4:38000/v1 out after failed requests;"
        " its replicas answer, if it has any (that box's alerts say why)"
    )
    tests = {
        "rule_files": [prometheus.RULES_FILE],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [
                    {
                        "series": 'up{job="spark-router/spark-1",box="spark-1",'
                        'instance="spark-1:10100"}',
                        "values": "1 0 0 0",
                    },
                    # healthy, then the captured state from 30 s to 120 s, answered at 150 s
                    router_series("0 1 1 1 1 0 0", "/v1/chat/completions"),
                    router_series("_ 2 2 2 2 2 2", "/v1"),
                ],
                "alert_rule_test": [
                    quiet("SparkRouterDown", "60s"),  # down from 30 s: pending
                    {
                        "eval_time": "90s",
                        "alertname": "SparkRouterDown",
                        "exp_alerts": [
                            {
                                "exp_labels": ROUTER | {"severity": "critical"},
                                "exp_annotations": {
                                    "summary": "spark-1: the fleet's router does not answer on"
                                    " /metrics/ (the router or its box down, the front stopped,"
                                    " or the fleet key refused)"
                                },
                            }
                        ],
                    },
                    quiet("SparkRouterLaneOut", "60s"),  # out from 30 s: pending
                    {
                        "eval_time": "90s",
                        "alertname": "SparkRouterLaneOut",
                        "exp_alerts": [
                            {
                                "exp_labels": ROUTER
                                | {
                                    "severity": "critical",
                                    "api_base": "http://127.0.0.4:38000/v1",
                                    "api_provider": "hosted_vllm",
                                    "litellm_model_name": "beta",
                                    "model_id": BETA_DOWN[0],
                                },
                                "exp_annotations": {"summary": lane_out},
                            }
                        ],
                    },
                    quiet("SparkRouterLaneOut", "150s"),  # answered again
                ],
            }
        ],
    }
    test_file = tmp_path / "router-rules.test.yml"
    test_file.write_text(json.dumps(tests, indent=1))
    done = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_router_alert_reads_the_series_litellm_writes() -> None:
    """Every label the rule names is one LiteLLM 1.106.12 writes on litellm_deployment_state
    (the captured exposition, parsed as Prometheus' text format), and the captured lines hold
    what the rule keys on: the cooled-down lane at 2 under its configured api_base."""
    text = captured("real-litellm-1.106.12-metrics-replica-killed.txt")
    samples = [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "litellm_deployment_state"
        for sample in family.samples
    ]
    assert {frozenset(labels) for labels, _ in samples} == {
        frozenset({"api_base", "api_provider", "litellm_model_name", "model_id"})
    }
    model_id, address = BETA_DOWN
    assert [
        (labels["api_base"], value) for labels, value in samples if labels["model_id"] == model_id
    ] == [(f"{address}/v1/chat/completions", 1.0), (f"{address}/v1", 2.0)]
