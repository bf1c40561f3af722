"""make status (stages/status.py): the table from the boxes' metrics endpoints, red where a box
does not answer, a lane is down or failed its canary, memory is below the floor, anything
drifted or the NCCL test failed or is a week old; exit 1 then.

The endpoint's text is the collector's own (files/spark_metrics.py, as the lab's spark-1 served it
after a deploy: tests/unit/captured/lab-metrics-scrape.txt, its spark_ lines), served here by a
loopback HTTP server that asks the key as nginx does (401 without it).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from spark.inventory import load_from_dicts
from spark.plan import plan
from stages import status
from tests.unit.harness import captured
from tests.unit.test_config import TWO_SPARKS, merged

SCRAPE = captured("lab-metrics-scrape.txt")
KEY = "k3y-_AZ"


def test_the_labs_deployed_box_reads_green() -> None:
    """The lab's twins read a Spark's 200000 Mb/s (its rate stand-in, tests/simlab/lab.py
    SPARK_LINK_SPEED): nothing drifted, green (captured/lab-metrics-scrape-200g.txt)."""
    row = status.row("spark-1", status.samples_of(captured("lab-metrics-scrape-200g.txt")))
    assert row.cells[0] == "coder up, fast up"
    assert row.cells[2] == "enP2p1s0f1np1 200G/9000/gid 3, enp1s0f1np1 200G/9000/gid 3"
    assert row.cells[5] == "-"
    assert (row.problems, row.warnings) == ([], [])
    assert status.report([row], colour=False)[1] == 0


def test_the_labs_deployed_box_reads_as_its_lanes_memory_twins_and_drift() -> None:
    """Before the lab's rate stand-in its twins read the veths' 10000 Mb/s against the plan's
    200000: drift, so red (a collector of then: drift without a severity is red)."""
    row = status.row("spark-1", status.samples_of(SCRAPE))
    assert row.cells[0] == "coder up, fast up"
    assert row.cells[1] == "21.4/1 GiB"  # MemAvailable 22989479936 B; the lab's floor 1 GiB
    assert row.cells[2] == ("enP2p1s0f1np1 10G/9000/gid 3, enp1s0f1np1 10G/9000/gid 3")
    assert row.cells[3] == "no verdict"
    assert row.cells[4] == "-"  # no pull running
    assert row.problems == [
        "drift: driver branch none (plan 580)",
        "drift: rate enP2p1s0f1np1 10000 (plan >= 200000)",
        "drift: rate enp1s0f1np1 10000 (plan >= 200000)",
    ]


def test_drift_the_plan_accepts_is_a_warning_and_exits_0() -> None:
    """The collector's severity label (files/spark_metrics.py Drift): a twin at 100G on a box
    whose inventory says fabric_link_speed_low = "warn", and a RoCE v2 entry NCCL finds at 4."""
    text = "".join(
        f'spark_drift{{expected="{expected}",found="{found}",kind="{kind}",severity="warning",'
        f'subject="enP2p1s0f1np1"}} 1\n'
        for kind, expected, found in (("rate", ">= 200000", "100000"), ("gid", "3", "4"))
    )
    row = status.row("spark-2", status.samples_of('spark_lane_up{lane="fast"} 1\n' + text))
    assert row.problems == []
    assert row.warnings == [
        "drift: rate enP2p1s0f1np1 100000 (plan >= 200000)",
        "drift: gid enP2p1s0f1np1 4 (plan 3)",
    ]
    assert row.cells[5] == (
        "rate enP2p1s0f1np1 100000 (plan >= 200000) warning; gid enP2p1s0f1np1 4 (plan 3) warning"
    )
    shown, code = status.report([row], colour=True)
    assert code == 0
    assert shown.splitlines()[1].startswith(status.YELLOW + "spark-2 ")
    assert shown.splitlines()[2] == (
        "spark-2: warning: drift: rate enP2p1s0f1np1 100000 (plan >= 200000);"
        " drift: gid enP2p1s0f1np1 4 (plan 3)"
    )
    red = status.row("spark-1", status.samples_of('spark_lane_up{lane="coder"} 0\n'))
    shown, code = status.report([row, red], colour=False)
    assert code == 1
    assert shown.splitlines()[-1] == "spark-1: lane coder DOWN"


def test_a_lane_down_a_failed_canary_low_memory_and_a_failing_nccl_are_red() -> None:
    text = "\n".join(
        [
            'spark_lane_up{lane="coder"} 0',
            'spark_lane_up{lane="fast"} 1',
            'spark_lane_canary_passed{lane="fast"} 0',
            "spark_memory_available_bytes 4294967296",
            "spark_memory_guard_floor_bytes 8589934592",
            "spark_nccl_verdict_present 1",
            "spark_nccl_passed 0",
            "spark_nccl_busbw_gbs 2.7",
            "spark_nccl_age_seconds 7200",
        ]
    )
    row = status.row("spark-2", status.samples_of(text + "\n"))
    assert row.cells[:2] == ["coder DOWN, fast up,canary FAILED", "4.0/8 GiB"]
    assert row.cells[3] == "FAIL 2.70 GB/s 2h ago"
    assert row.problems == [
        "lane coder DOWN",
        "lane fast up,canary FAILED",
        "memory below the floor",
        "NCCL FAIL 2.70 GB/s 2h ago",
    ]


def test_on_demand_lanes_idle_or_running_are_green_and_one_without_its_socket_red() -> None:
    """The collector's series for lanes on demand (files/spark_metrics.py on_demand_lane):
    idle by design is no problem; up is its socket listening."""
    text = "\n".join(
        [
            'spark_lane_up{lane="coder"} 1',
            'spark_lane_up{lane="fast"} 1',
            'spark_lane_on_demand{lane="fast"} 1',
            'spark_lane_running{lane="fast"} 0',
            'spark_lane_up{lane="spare"} 1',
            'spark_lane_on_demand{lane="spare"} 1',
            'spark_lane_running{lane="spare"} 1',
            'spark_lane_up{lane="third"} 0',
            'spark_lane_on_demand{lane="third"} 1',
            'spark_lane_running{lane="third"} 0',
        ]
    )
    row = status.row("spark-1", status.samples_of(text + "\n"))
    assert row.cells[0] == ("coder up, fast idle on demand, spare up on demand, third DOWN")
    assert row.problems == ["lane third DOWN"]


def test_a_twin_set_down_is_red_and_shown_down() -> None:
    """The collector's lines for spark-2 with enp1s0f1np1 set down (ip link set down), as
    files/spark_metrics.py writes them (tests/unit/test_metrics_collector.py)."""
    text = "\n".join(
        [
            'spark_twin_up{hca="rocep1s0f1",twin="enp1s0f1np1"} 0',
            'spark_twin_rate_mbps{hca="rocep1s0f1",twin="enp1s0f1np1"} -1',
            'spark_twin_mtu_bytes{hca="rocep1s0f1",twin="enp1s0f1np1"} 9000',
            'spark_twin_up{hca="roceP2p1s0f1",twin="enP2p1s0f1np1"} 1',
            'spark_twin_rate_mbps{hca="roceP2p1s0f1",twin="enP2p1s0f1np1"} 200000',
            'spark_twin_mtu_bytes{hca="roceP2p1s0f1",twin="enP2p1s0f1np1"} 9000',
            'spark_twin_roce_v2_gid_index{hca="roceP2p1s0f1",twin="enP2p1s0f1np1"} 3',
            'spark_drift{expected="up",found="down",kind="link",severity="critical",'
            'subject="enp1s0f1np1"} 1',
        ]
    )
    row = status.row("spark-2", status.samples_of(text + "\n"))
    assert row.cells[2] == "enp1s0f1np1 DOWN, enP2p1s0f1np1 200G/9000/gid 3"
    assert row.cells[5] == "link enp1s0f1np1 down (plan up)"
    assert row.problems == ["drift: link enp1s0f1np1 down (plan up)"]
    shown, code = status.report([row], colour=False)
    assert code == 1
    assert shown.splitlines()[-1] == "spark-2: drift: link enp1s0f1np1 down (plan up)"


def test_a_verdict_older_than_a_week_is_red() -> None:
    text = "spark_nccl_verdict_present 1\nspark_nccl_passed 1\nspark_nccl_age_seconds 605000\n"
    assert status.row("b", status.samples_of(text)).problems == ["NCCL pass 0.00 GB/s 7d ago"]


def test_a_pull_running_shows_its_progress_and_a_finished_one_does_not() -> None:
    # The collector's series (its pulls(), files/spark_metrics.py) for two images: 26.05 half
    # way at 52 MB/s, 26.04 pulled before.
    text = "".join(
        f'{name}{{image="nvcr.io/nvidia/vllm:{tag}"}} {value}\n'
        for tag, values in (
            ("26.05-py3", (8_000_000_000, 16_000_000_000, 52_000_000, 1)),
            ("26.04-py3", (163146892, 163146892, 13_000_000, 0)),
        )
        for name, value in zip(
            ("spark_image_pull_bytes", "spark_image_pull_total_bytes",
             "spark_image_pull_rate_bytes_per_second", "spark_image_pulling"), values, strict=True
        )
    )  # fmt: skip
    row = status.row("spark-1", status.samples_of(text))
    assert row.cells[4] == "nvcr.io/nvidia/vllm:26.05-py3: 8.0 of 16.0 GB (50%), 52 MB/s: pulling"
    assert row.problems == []  # a pull is no problem


def test_colour_only_where_asked() -> None:
    rows = [status.Row("a", ["-"] * 7), status.Row("b", ["-"] * 7, ["x"])]
    plain = status.table(rows, colour=False)
    assert "\033" not in plain and plain.splitlines()[1].startswith("a  ")
    coloured = status.table(rows, colour=True).splitlines()
    assert coloured[1].startswith(status.GREEN) and coloured[2].startswith(status.RED)


@pytest.mark.parametrize(
    ("series", "cell", "problems"),
    [
        # The collector's lines (files/spark_metrics.py gpu_clock): the unit's journal said
        # gpuClkMax 2200 this boot; said nothing (a drift beside it); no series: no lock planned.
        ("spark_gpu_clock_locked_mhz 2200\n", "max 2200 MHz", []),
        (
            "spark_gpu_clock_locked_mhz 0\n"
            'spark_drift{kind="gpu_clock",subject="spark-gpu-clock-lock.service",'
            'expected="300,2200",found="none"} 1\n',
            "NOT LOCKED",
            ["drift: gpu_clock spark-gpu-clock-lock.service none (plan 300,2200)"],
        ),
        ("", "off", []),
    ],
    ids=["locked", "not-locked", "off"],
)
def test_the_gpu_clock_column(series: str, cell: str, problems: list[str]) -> None:
    row = status.row("spark-1", status.samples_of(series))
    assert row.cells[6] == cell
    assert row.problems == problems


class Endpoint(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {KEY}"
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(SCRAPE.encode() if ok else b"needs the metrics key\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> int:
    server = HTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def box_at(port: int):
    box = plan(load_from_dicts(merged(TWO_SPARKS))).box("spark-1")
    assert box.metrics is not None
    return box.model_copy(
        update={"address": "127.0.0.1", "metrics": box.metrics.model_copy(update={"port": port})}
    )


def test_scrape_sends_the_key_and_says_why_not(endpoint: int, tmp_path: Path) -> None:
    box = box_at(endpoint)
    samples, error = status.scrape(box, tmp_path)
    assert samples is None and error.startswith("no key (No such file or directory")
    (tmp_path / "spark-1.key").write_text("wrong\n")
    assert status.scrape(box, tmp_path) == (None, "Unauthorized")
    (tmp_path / "spark-1.key").write_text(KEY + "\n")
    samples, error = status.scrape(box, tmp_path)
    assert error == "" and samples is not None
    assert samples["spark_drifts"] == [({}, 3.0)]


# The router's /v1/models as LiteLLM 1.106.12 answers it (bench/router.py's configuration, on
# loopback, lanes `alpha` and a replica pair `beta` of the lab's vLLM stand-in): with the fleet
# key, and with another key (no database: 400).
MODELS = captured("real-litellm-1.106.12-v1-models.json")
REFUSED = captured("real-litellm-1.106.12-v1-models-wrong-key.json")
FLEET_KEY = "fk-_9"


class Router(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {FLEET_KEY}"
        found = self.path == "/v1/models"
        self.send_response(200 if ok and found else 400 if found else 404)
        self.end_headers()
        self.wfile.write((MODELS if ok else REFUSED).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def router() -> str:
    server = HTTPServer(("127.0.0.1", 0), Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_the_routers_served_names_read_with_the_fleet_key(router: str, tmp_path: Path) -> None:
    key = tmp_path / "spark-1.key"
    assert status.served_names(router, key) == (
        None,
        f"no key (No such file or directory: {key})",
    )
    key.write_text("not-the-fleet-key\n")
    assert status.served_names(router, key) == (
        None,
        f"the fleet key refused (400 Bad Request: {key})",
    )
    key.write_text(FLEET_KEY + "\n")
    assert status.served_names(router, key) == (["alpha", "beta"], "")


def test_the_routers_row_counts_its_names_against_the_plans() -> None:
    up = status.router_row("spark-1", False, ["alpha", "beta"], ["alpha", "beta"])
    assert (up.box, up.cells[0], up.problems, up.warnings) == (
        "spark-1 (router)",
        "router up: 2 of 2 served names",
        [],
        [],
    )
    short = status.router_row("spark-2", True, ["alpha", "beta", "gamma"], ["beta", "old"])
    assert (short.box, short.cells[0]) == (
        "spark-2 (router, failover)",
        "router up: 1 of 3 served names, missing alpha, gamma, not planned old",
    )
    assert short.problems == ["router: does not list alpha, gamma; deploy again"]
    assert short.warnings == ["router: lists old, which no lane serves"]
    down = status.router_row("spark-1", False, ["alpha"], None, "Connection refused")
    assert (down.cells[0], down.problems) == (
        "router DOWN: Connection refused",
        ["router: Connection refused"],
    )
    shown, code = status.report([up, down], colour=False)
    assert code == 1
    assert shown.splitlines()[-1] == "spark-1 (router): router: Connection refused"
