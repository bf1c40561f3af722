"""The fleet's router as a box runs it: LiteLLM's proxy, pinned, in a virtualenv under systemd,
listening on 127.0.0.1 behind the box's front, and its configuration, made from the route table.

Standard library only: bench/router.py, which runs where the repository's virtualenv is not,
takes its pins from here. spark/plan.py puts what this module makes into the plan
(FleetEndpoint); operations/router.py renders those values and never derives them again.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from spark.box_paths import SECRETS_DIR

LITELLM_VERSION = "1.106.12"
# LiteLLM's proxy, pinned. 1.106.12: the newest release whose `proxy` extra installs from PyPI
# alone (from 1.108.0 it needs a `litellm-proxy` package that PyPI does not serve, and 1.107.0
# was a compromised release, taken down). Its /metrics needs prometheus_client, which the extra
# leaves out (LiteLLM's docs: proxy/prometheus, "Quick Start").
LITELLM = (f"litellm[proxy]=={LITELLM_VERSION}", "prometheus-client==0.26.0")
# Everything those two resolved to, each package pinned (the file's header says how it was made).
REQUIREMENTS_FILE = Path(__file__).parent / "data" / f"litellm-{LITELLM_VERSION}-requirements.txt"

# On the box. The virtualenv, its requirements and the copy of them pip installed last (written
# once pip has succeeded: what the deploy compares).
ROUTER_DIR = "/var/lib/spark/router"
VENV = f"{ROUTER_DIR}/venv"
REQUIREMENTS = f"{ROUTER_DIR}/requirements.txt"
INSTALLED = f"{VENV}/spark-installed.txt"
CONFIG = "/etc/spark/router/litellm.yaml"  # no secret in it: os.environ/<name> for each key
# The authorities of the TLS fronts the router reaches (certificates are public: root 0644).
CA_BUNDLE = "/etc/spark/router/fronts-ca.pem"
# The router's keys (the fleet key, each lane's), root 0600: systemd reads an EnvironmentFile as
# root before it starts the service as another user (systemd.exec: EnvironmentFile=).
ENVIRONMENT = f"{SECRETS_DIR}/_router.env"
UNIT = "spark-router.service"
# Its CacheDirectory=spark-router, the only place it writes (templates/spark-router.service.j2).
CACHE_DIRS = ("/var/cache/spark-router", "/var/cache/private/spark-router")
FLEET_KEY_VARIABLE = "SPARK_FLEET_KEY"
# LiteLLM fetches its model cost map from GitHub at start unless told to read its own copy
# (LiteLLM's docs: proxy/configs, "Use local model cost map"); a box may reach no internet.
OFFLINE = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
# A failed request goes to another lane of its group; a lane failing once is left out for a while
# (LiteLLM's docs: routing, "Retries" and "Cooldowns": router_settings).
ROUTER_SETTINGS = {"num_retries": 2, "allowed_fails": 1, "cooldown_time": 30}
# The longest LiteLLM sleeps before a retry: a lane's Retry-After of up to 60 s is obeyed, else
# an exponential backoff capped at MAX_RETRY_DELAY (8 s), plus up to JITTER (0.75 s)
# (litellm/utils.py calculate_retry_after; litellm/constants.py; LiteLLM 1.106.12), rounded up.
RETRY_SLEEP_MAX_S = 61
# LiteLLM's own work around the attempts (choosing a lane, its callbacks), and nginx's reads.
FRONT_MARGIN_S = 60


def front_timeout_s(route_timeout_s: int) -> int:
    """How long the router's front waits for the router between two reads, so that it never
    cuts a request LiteLLM still works on: nothing comes back before LiteLLM has an answer, and
    LiteLLM may try a request 1 + num_retries times (litellm/router.py
    async_function_with_retries; no retry inside an attempt: the router sets max_retries 0 in
    default_litellm_params), each attempt waiting up to ``route_timeout_s`` (its deployment's
    timeout), with a sleep of up to RETRY_SLEEP_MAX_S before each retry."""
    retries = ROUTER_SETTINGS["num_retries"]
    return (1 + retries) * route_timeout_s + retries * RETRY_SLEEP_MAX_S + FRONT_MARGIN_S


def requirements(path: Path = REQUIREMENTS_FILE) -> tuple[str, ...]:
    """The pinned set's lines, comments and blank lines left out."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def pip_command(index: str | None) -> tuple[str, ...]:
    """The virtualenv's pip installing the pinned set: wheels only (nothing is built on the box),
    from ``index`` (a PEP 503 simple index) or pip's own default where None. pip ignores an
    index over plain HTTP unless its host is trusted (pip's docs: --trusted-host)."""
    command = [f"{VENV}/bin/pip", "install", "--disable-pip-version-check", "--no-input"]
    command += ["--only-binary=:all:"]
    if index is not None:
        command += ["--index-url", index]
        if urlsplit(index).scheme == "http":
            command += ["--trusted-host", urlsplit(index).netloc]
    return (*command, "-r", REQUIREMENTS)


def server_command(loopback_port: int) -> tuple[str, ...]:
    """LiteLLM's proxy on 127.0.0.1 only (the front owns the router's port), one worker (one
    worker measured 357-362 MiB: README)."""
    return (
        f"{VENV}/bin/litellm", "--config", CONFIG, "--host", "127.0.0.1",
        "--port", str(loopback_port), "--num_workers", "1",
    )  # fmt: skip


def key_variable(index: int) -> str:
    """The environment variable holding the key of the route table's ``index``-th lane (from 1)."""
    return f"SPARK_LANE_KEY_{index}"


class Deployment(NamedTuple):
    """One lane as LiteLLM's model_list takes it."""

    served_name: str
    api_base: str  # the lane's OpenAI base URL, through its box's front
    key_variable: str | None  # None: the lane asks no key
    on_demand: bool
    timeout_s: int  # the wait for the lane between two reads of an answer


def litellm_config(
    deployments: Iterable[Deployment], health_interval_s: int, ca_bundle: str | None = None
) -> dict:
    """LiteLLM's proxy configuration (its YAML, here as the JSON subset of it).

    Each lane is a deployment of its served name (hosted_vllm/: LiteLLM's vLLM provider, an
    OpenAI-compatible api_base; llama-server answers the same API); the lanes of one name are
    one model group, load-balanced (simple-shuffle, the default). Keys are read from the
    environment by name (os.environ/NAME: litellm/proxy/proxy_server.py get_secret). Background
    health checks every ``health_interval_s`` take a failing lane out of its group
    (enable_health_check_routing; LiteLLM's docs: proxy/health). A lane on demand is left out of
    them, or a check would start it: `model_info.disable_background_health_check`, skipped by the
    background loop (litellm/proxy/proxy_server.py, _run_background_health_check: "filter out
    models that have disabled background health checks") and, with
    health_check_skip_disabled_background_models, by GET /health too (litellm/proxy/_types.py).

    Each deployment's `timeout` is the plan's wait for its lane: a request's, streamed or not
    (litellm/router.py _get_timeout: a stream without stream_timeout takes the deployment's
    timeout), given to httpx as a float, which makes it the wait for each read, not for the
    whole answer (litellm/llms/custom_httpx/http_handler.py AsyncHTTPHandler.post; httpx's
    Timeout). Without it LiteLLM waits 6000 s (litellm/constants.py).

    ``ca_bundle`` (where a lane's front speaks HTTPS): the authorities LiteLLM verifies the
    fronts with, in place of certifi's. litellm_settings.ssl_verify sets litellm.ssl_verify
    (litellm/proxy/proxy_server.py: each litellm_settings key is set on litellm); the
    hosted_vllm provider's requests go through BaseLLMHTTPHandler (litellm/main.py
    _complete_hosted_vllm), whose httpx client (get_async_httpx_client) takes
    get_ssl_configuration: with no ssl_verify of the deployment's, litellm.ssl_verify, and a
    path that exists is the cafile of ssl.create_default_context
    (litellm/llms/custom_httpx/http_handler.py get_ssl_verify, _create_ssl_context).
    """
    model_list = []
    for deployment in deployments:
        params = {
            "model": f"hosted_vllm/{deployment.served_name}",
            "api_base": deployment.api_base,
            "timeout": deployment.timeout_s,
        }
        if deployment.key_variable:
            params["api_key"] = f"os.environ/{deployment.key_variable}"
        entry: dict = {"model_name": deployment.served_name, "litellm_params": params}
        if deployment.on_demand:
            entry["model_info"] = {"disable_background_health_check": True}
        model_list.append(entry)
    return {
        "model_list": model_list,
        "general_settings": {
            "master_key": f"os.environ/{FLEET_KEY_VARIABLE}",
            "background_health_checks": True,
            "health_check_interval": health_interval_s,
            "enable_health_check_routing": True,
            "health_check_skip_disabled_background_models": True,
        },
        "router_settings": ROUTER_SETTINGS,
        # Prometheus' metrics at /metrics/ (LiteLLM's docs: proxy/prometheus); no usage report.
        "litellm_settings": {"callbacks": ["prometheus"], "telemetry": False}
        | ({"ssl_verify": ca_bundle} if ca_bundle else {}),
    }
