"""bench/router.py's pure figures and LiteLLM configuration, worked out by hand; nothing here
is timed and no router is started."""

from __future__ import annotations

from bench import router


def test_ratio_is_the_router_over_the_lane_to_three_places() -> None:
    assert router.ratio(4.5, 1.5) == 3.0
    assert router.ratio(2.0, 3.0) == 0.667  # 0.6666... rounded


def test_failover_counts_the_failures_and_the_time_to_the_last() -> None:
    killed_at = 10.0
    events = [(9.9, True), (10.1, False), (10.2, True), (10.6, False), (10.7, True), (10.8, True)]
    assert router.failover(events, killed_at) == {
        "requests": 6,
        "failed": 2,
        "seconds_to_last_failure": 0.6,  # 10.6 - 10.0
        "answered_after": True,
    }


def test_failover_without_a_failure_is_zero_seconds() -> None:
    events = [(9.0, True), (11.0, True), (12.0, True)]
    assert router.failover(events, 10.0) == {
        "requests": 3,
        "failed": 0,
        "seconds_to_last_failure": 0.0,
        "answered_after": True,
    }


def test_failover_failing_to_the_end_is_not_answered_after() -> None:
    events = [(10.5, True), (11.0, False)]
    assert router.failover(events, 10.0)["answered_after"] is False


def test_the_table_prints_the_medians_and_ratios_of_a_run() -> None:
    results = {
        "ttft_ms": {"router": 12.34, "direct": 1.5, "ratio": 8.227},
        "rps_at_16": {"router": 40.04, "direct": 400.0, "ratio": 0.1},
        "router_cpu_ms_per_request": 35.55,
        "rss_mib": {"idle": 357.6, "peak": 361.2},
        "start_seconds": 44.46,
        "failover": {"requests": 77, "failed": 1, "seconds_to_last_failure": 0.4},
    }
    assert router.table(results) == [
        ("time to first token, ms (median)", "12.3", "1.5", "8.23"),
        ("requests/s at 16 concurrent (median)", "40.0", "400.0", "0.10"),
        ("router CPU per request, ms (median)", "35.5", "", ""),
        ("router RSS, MiB: idle / peak under load", "358 / 361", "", ""),
        ("router start to /v1/models, s", "44.5", "", ""),
        ("a replica killed: failed requests, s to the last", "1 of 77, 0.4", "", ""),
    ]


def test_litellm_holds_each_lane_key_by_name_and_the_fleet_key_from_the_environment() -> None:
    lanes = [router.Lane("alpha", "127.0.0.2", "ka"), router.Lane("beta", "127.0.0.3", "kb")]
    config, env = router.litellm_config(lanes)
    # The keys themselves go to the environment only; the configuration names them
    # (os.environ/NAME, LiteLLM's get_secret).
    assert env == {"SPARK_LANE_KEY_0": "ka", "SPARK_LANE_KEY_1": "kb"}
    assert "ka" not in str(config) and "kb" not in str(config)
    assert config["model_list"] == [
        {
            "model_name": "alpha",
            "litellm_params": {
                "model": "hosted_vllm/alpha",
                "api_base": "http://127.0.0.2:38000/v1",
                "api_key": "os.environ/SPARK_LANE_KEY_0",
            },
        },
        {
            "model_name": "beta",
            "litellm_params": {
                "model": "hosted_vllm/beta",
                "api_base": "http://127.0.0.3:38000/v1",
                "api_key": "os.environ/SPARK_LANE_KEY_1",
            },
        },
    ]
    assert config["general_settings"] == {
        "master_key": "os.environ/SPARK_FLEET_KEY",
        "background_health_checks": True,
        "health_check_interval": 5,
        "enable_health_check_routing": True,
    }
