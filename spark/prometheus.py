"""A Prometheus configuration for the fleet, from the boxes' plans (issue 28): one scrape job per
box at its metrics endpoint (the address the inventory connects to, the plan's metrics port,
the box's own metrics key as a bearer credentials file), and the alert rules on what the
collector (files/spark_metrics.py) writes.

Both files are JSON, which is YAML (YAML 1.2, "JSON is a subset"), so Prometheus and promtool
read them as they are and nothing beyond the standard library writes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from spark.plan import BoxPlan, Plan

RULES_FILE = "spark-rules.yml"
# Where `make clients` copies each box's metrics key on this machine: one file per box,
# <box>.key (0600, in a 0700 directory), each that box's /etc/spark/secrets/_metrics.key
# (operations/metrics.py). `make status` reads them there, and the prometheus.yml of `make
# prometheus-config` names them there, as an absolute path (no shell expands its ~).
KEYS_DIR = "~/.config/spark-provisioning/metrics-keys"
# Where `make clients` copies the fleet key of each router box (spark/fleet.py), beside the
# metrics keys: FLEET_KEYS/<box>.key under KEYS_DIR, apart from every box's own <box>.key.
FLEET_KEYS = "fleet"
# The router's metrics (LiteLLM's proxy: litellm/integrations/prometheus.py
# _mount_metrics_endpoint mounts prometheus_client's app at /metrics, which answers 307 to
# /metrics/; that asks the fleet key, require_auth_for_metrics_endpoint defaulting to True:
# litellm/__init__.py).
ROUTER_METRICS_PATH = "/metrics/"
# LiteLLM labels its request series with the hash of the key the client sent, and where the key
# is none it knows, the hash of what was sent (litellm/types/integrations/prometheus.py
# UserAPIKeyLabelNames.API_KEY_HASH; litellm/integrations/prometheus.py _get_hashed_api_key):
# a key's fingerprint has no place in a time series database. Dropped at the scrape, before
# Prometheus stores the sample (Prometheus' configuration: metric_relabel_configs, labeldrop).
ROUTER_DROPPED_LABELS = "hashed_api_key"
ROUTER_SCRAPE_INTERVAL_S = 30  # group_data/all.py's metrics_interval_s, where its box has none
NCCL_MAX_AGE_S = 7 * 24 * 3600  # a verdict older than a week: run the test again (issue 28)
# Alerts wait this many collections before firing, so one late or slow collection is no page.
FOR_COLLECTIONS = 2


def job_name(box: str) -> str:
    return f"spark-{box}"


def lane_job_name(box: str, lane: str) -> str:
    """Apart from every box's job: no box name holds a '/' (a host name does not)."""
    return f"spark-{box}/{lane}"


def router_job_name(box: str) -> str:
    """Apart from every box's and lane's job: "spark-router/" begins no "spark-<box>" job's name
    that the box alerts' regex matches whole."""
    return f"spark-router/{box}"


def fleet_key_file(keys_dir: str, box: str) -> str:
    """The fleet key of the router on ``box``, where `make clients` copies it."""
    return f"{keys_dir}/{FLEET_KEYS}/{box}.key"


def router_jobs(plan: Plan, keys_dir: str) -> list[dict]:
    """A job per router box: its /metrics/ through the box's front on router_port (https with
    the front's TLS), the fleet key as the bearer token from a file, every metrics interval;
    the key hash LiteLLM labels its series with dropped (ROUTER_DROPPED_LABELS)."""
    jobs = []
    for router in plan.fleet.boxes:
        box = plan.box(router.name)
        interval = box.metrics.interval_s if box.metrics else ROUTER_SCRAPE_INTERVAL_S
        jobs.append(
            {
                "job_name": router_job_name(box.name),
                "scrape_interval": f"{interval}s",
                "scheme": "https" if box.front.tls else "http",
                "metrics_path": ROUTER_METRICS_PATH,
                "authorization": {
                    "type": "Bearer",
                    "credentials_file": fleet_key_file(keys_dir, box.name),
                },
                "static_configs": [
                    {
                        "targets": [f"{router.address}:{plan.fleet.port}"],
                        "labels": {"box": box.name},
                    }
                ],
                "metric_relabel_configs": [{"action": "labeldrop", "regex": ROUTER_DROPPED_LABELS}],
            }
        )
    return jobs


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
    TLS; a job per lane, its own metrics at its path on the same endpoint, with the same key
    (scrape_config: metrics_path); and a job per router box (router_jobs)."""
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
        "scrape_configs": jobs + router_jobs(plan, keys_dir),
    }


def rules(plan: Plan) -> dict:
    """The alert rules (Prometheus' alerting rules format): box down, lane down, canary failing,
    memory below the guard's floor, fabric drifted, the driver off its branch, the GPU clock not
    locked as planned, NCCL failing or older than a week, the collector stopped; the router
    down, and a lane the router took out of its rotation (router_rules)."""
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
            },
            {"name": "spark-router", "rules": router_rules(plan, alert)},
        ]
    }


# LiteLLM 1.106.12's state of a deployment (a lane of a served name): the gauge
# litellm_deployment_state, "0 = healthy, 1 = partial outage, 2 = complete outage"
# (litellm/integrations/prometheus.py). A lane the router cools down after failed requests is
# set to 2 under its api_base as configured, ".../v1" (litellm/router_utils/cooldown_callbacks.py
# router_cooldown_event_callback: set_deployment_complete_outage), and nothing sets that series
# back; a request's failure and success set 1 and 0 under the request's api_base,
# ".../v1/chat/completions" (prometheus.py set_llm_deployment_failure_metrics and _success_). So
# a lane is out while its cooldown series says 2 and its requests' series is not back to 0.
# The background health checks' answers are written with an empty model_id, which the match on
# model_id leaves aside (tests/unit/captured/real-litellm-1.106.12-metrics-replica-killed.txt).
DEPLOYMENT_COOLED_DOWN = 2
REQUEST_API_BASE = ".*/chat/completions"


def router_rules(plan: Plan, alert: Callable[..., dict]) -> list[dict]:
    """The router's alerts: its /metrics/ not answering, and a lane it took out of its rotation
    (LiteLLM's cooldown, until a request to it is answered again)."""
    jobs = "|".join(router_job_name(router.name) for router in plan.fleet.boxes)
    router = f'job=~"{jobs}"'
    state = "litellm_deployment_state"
    return [
        alert(
            "SparkRouterDown",
            f"up{{{router}}} == 0",
            "{{ $labels.box }}: the fleet's router does not answer on /metrics/ (the router"
            " or its box down, the front stopped, or the fleet key refused)",
        ),
        alert(
            "SparkRouterLaneOut",
            f'{state}{{{router},api_base!~"{REQUEST_API_BASE}"}} == {DEPLOYMENT_COOLED_DOWN}'
            f' unless on(job, model_id) {state}{{{router},api_base=~"{REQUEST_API_BASE}"}} == 0',
            "{{ $labels.box }}: the router took {{ $labels.litellm_model_name }} at"
            " {{ $labels.api_base }} out after failed requests; its replicas answer, if it has"
            " any (that box's alerts say why)",
        ),
    ]


def dump(document: dict) -> str:
    return json.dumps(document, indent=2) + "\n"
