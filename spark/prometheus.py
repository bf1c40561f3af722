"""A Prometheus configuration for the fleet, from the boxes' plans (issue 28): one scrape job per
box at its metrics endpoint (the address the inventory connects to, the plan's metrics port,
the box's own metrics key as a bearer credentials file), and the alert rules on what the
collector (files/spark_metrics.py) writes.

Both files are JSON, which is YAML (YAML 1.2, "JSON is a subset"), so Prometheus and promtool
read them as they are and nothing beyond the standard library writes them.
"""

from __future__ import annotations

import json

from spark.plan import BoxPlan, Plan

RULES_FILE = "spark-rules.yml"
# Where `make clients` copies each box's metrics key on this machine: one file per box,
# <box>.key (0600, in a 0700 directory), each that box's /etc/spark/secrets/_metrics.key
# (operations/metrics.py). `make status` reads them there, and the prometheus.yml of `make
# prometheus-config` names them there, as an absolute path (no shell expands its ~).
KEYS_DIR = "~/.config/spark-provisioning/metrics-keys"
NCCL_MAX_AGE_S = 7 * 24 * 3600  # a verdict older than a week: run the test again (issue 28)
# Alerts wait this many collections before firing, so one late or slow collection is no page.
FOR_COLLECTIONS = 2


def job_name(box: str) -> str:
    return f"spark-{box}"


def lane_job_name(box: str, lane: str) -> str:
    """Apart from every box's job: no box name holds a '/' (a host name does not)."""
    return f"spark-{box}/{lane}"


def scrape_job(
    name: str, box: BoxPlan, keys_dir: str, labels: dict[str, str], path: str = "/metrics"
) -> dict:
    """One target on the box's metrics endpoint, with the box's key."""
    assert box.metrics is not None
    return {
        "job_name": name,
        "scrape_interval": f"{box.metrics.interval_s}s",
        "scheme": "https" if box.metrics.tls else "http",
        "metrics_path": path,
        "authorization": {"type": "Bearer", "credentials_file": f"{keys_dir}/{box.name}.key"},
        "static_configs": [{"targets": [f"{box.address}:{box.metrics.port}"], "labels": labels}],
    }


def scrape_config(plan: Plan, keys_dir: str) -> dict:
    """prometheus.yml: a job per box with a metrics endpoint, scraped every collection
    interval (the collector writes no oftener), its key as the bearer token from a file
    (Prometheus' scrape_config: authorization.credentials_file) and https with the front's
    TLS; and a job per lane, its own metrics at its path on the same endpoint, with the same
    key (scrape_config: metrics_path)."""
    jobs = []
    for box in plan.boxes:
        if box.metrics is None:
            continue
        labels = {"box": box.name}
        jobs.append(scrape_job(job_name(box.name), box, keys_dir, labels))
        jobs += [
            scrape_job(
                lane_job_name(box.name, lane.name),
                box,
                keys_dir,
                labels | {"lane": lane.name},
                lane.path,
            )
            for lane in box.metrics.lanes
        ]
    return {
        "global": {"evaluation_interval": "15s"},
        "rule_files": [RULES_FILE],
        "scrape_configs": jobs,
    }


def rules(plan: Plan) -> dict:
    """The alert rules (Prometheus' alerting rules format): box down, lane down, canary failing,
    memory below the guard's floor, fabric drifted, the driver off its branch, the GPU clock not
    locked as planned, NCCL failing or older than a week, the collector stopped."""
    intervals = [box.metrics.interval_s for box in plan.boxes if box.metrics is not None]
    interval = max(intervals, default=30)
    wait = f"{interval * FOR_COLLECTIONS}s"
    jobs = "|".join(job_name(box.name) for box in plan.boxes if box.metrics is not None)
    spark = f'job=~"{jobs}"'

    def alert(
        name: str, expr: str, summary: str, severity: str = "critical", wait: str = wait
    ) -> dict:
        return {
            "alert": name,
            "expr": expr,
            "for": wait,
            "labels": {"severity": severity},
            "annotations": {"summary": summary},
        }

    return {
        "groups": [
            {
                "name": "spark",
                "rules": [
                    alert(
                        "SparkBoxDown",
                        f"up{{{spark}}} == 0",
                        "{{ $labels.box }}: its metrics endpoint does not answer (box down,"
                        " nginx or the node exporter stopped, or the key refused)",
                    ),
                    alert(
                        "SparkMetricsStale",
                        f"time() - spark_metrics_timestamp_seconds{{{spark}}} > {interval * 3}",
                        "{{ $labels.box }}: the collector has not written for"
                        " {{ $value | humanizeDuration }} (systemctl status spark-metrics.timer)",
                        "warning",
                    ),
                    alert(
                        "SparkLaneDown",
                        f"spark_lane_up{{{spark}}} == 0",
                        "{{ $labels.box }}: lane {{ $labels.lane }} is not active"
                        " (journalctl -u spark-lane-{{ $labels.lane }})",
                    ),
                    alert(
                        "SparkCanaryFailing",
                        f"spark_lane_canary_passed{{{spark}}} == 0",
                        "{{ $labels.box }}: lane {{ $labels.lane }} failed its answer canary at"
                        " its last start (journalctl -u spark-lane-{{ $labels.lane }})",
                        wait="0s",
                    ),
                    alert(
                        "SparkMemoryBelowFloor",
                        f"spark_memory_available_bytes{{{spark}}}"
                        f" < spark_memory_guard_floor_bytes{{{spark}}}",
                        "{{ $labels.box }}: MemAvailable below the memory guard's floor; it"
                        " stops the lowest-priority lane (journalctl -u spark-memguard)",
                        wait="0s",
                    ),
                    alert(
                        "SparkFabricDrifted",
                        f'spark_drift{{{spark},kind=~"mtu|gid|rate|carrier|link"}} == 1',
                        "{{ $labels.box }}: {{ $labels.kind }} of {{ $labels.subject }} is"
                        " {{ $labels.found }}, the plan says {{ $labels.expected }}; deploy"
                        " again (--limit {{ $labels.box }})",
                        # The collector's own judgement of each drift (spark/twin.py): critical,
                        # or warning where the inventory accepts it (fabric_link_speed_low =
                        # "warn") or NCCL does (a RoCE v2 entry off its usual index). Label
                        # values are templated (Prometheus docs, alerting rules).
                        "{{ $labels.severity }}",
                    ),
                    alert(
                        "SparkDriverDrifted",
                        f'spark_drift{{{spark},kind="driver"}} == 1',
                        "{{ $labels.box }}: driver branch {{ $labels.found }} loaded, the plan"
                        " says {{ $labels.expected }} (590 deadlocks CUDA graphs on GB10)",
                    ),
                    alert(
                        "SparkGpuClockUnlocked",
                        f'spark_drift{{{spark},kind="gpu_clock"}} == 1',
                        "{{ $labels.box }}: its GPU clock lock this boot is {{ $labels.found }},"
                        " the plan says {{ $labels.expected }} (GB10s power off under long"
                        " prefills unlocked; journalctl -b -u {{ $labels.subject }})",
                    ),
                    alert(
                        "SparkNcclFailing",
                        f"spark_nccl_passed{{{spark}}} == 0",
                        "{{ $labels.box }}: the NCCL test's last verdict failed (sudo cat"
                        " /var/lib/spark/nccl-test/run/report.txt)",
                        wait="0s",
                    ),
                    alert(
                        "SparkNcclStale",
                        f"spark_nccl_age_seconds{{{spark}}} > {NCCL_MAX_AGE_S}",
                        "{{ $labels.box }}: the NCCL test's verdict is older than a week"
                        " (sudo spark-nccl-test on every box)",
                        "warning",
                        wait="0s",
                    ),
                ],
            }
        ]
    }


def dump(document: dict) -> str:
    return json.dumps(document, indent=2) + "\n"
