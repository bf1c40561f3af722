"""One table for the whole inventory, read from the boxes' metrics endpoints (no SSH).

    .venv/bin/python -m stages.status [--inventory inventories/lab.py] [--keys-dir DIR]

`make status` runs it. Per box: the lanes (up, canary), MemAvailable against the memory guard's
floor, each twin (rate, MTU, RoCE v2 GID index; DOWN where it is set down), the NCCL test's verdict
and its age, the image pulls running, every drift from the plan, and the GPU clock's lock. A box is
red when its endpoint does not answer, a lane is down or failed its canary, memory is below the
floor, anything drifted that the plan refuses (a twin set down among them), or the NCCL test failed
or is older than a week; the command then exits 1. Drift the plan accepts (the collector's severity
"warning": a slower twin under fabric_link_speed_low = "warn", a RoCE v2 entry NCCL finds away from
its usual index) is shown as a warning: yellow, exit 0. Each box's metrics key is read from
KEYS_DIR/<box>.key, where `make clients` copies its /etc/spark/secrets/_metrics.key
(docs/reference.md: Watching the fleet).
Then a row per box of the fleet's router (spark/fleet.py): its /v1/models read over HTTP through
its box's front with the fleet key (KEYS_DIR/fleet/<box>.key), red when it does not answer or
lists fewer served names than the plan has.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from endpoints import routers_of
from spark.plan import BoxPlan
from spark.prometheus import KEYS_DIR, NCCL_MAX_AGE_S, fleet_key_file
from stages.settings import plan_or_say_why

TIMEOUT_S = 1.5  # every box at once: the table in under 2 s (issue 28)
GIB = 1024**3
RED, YELLOW, GREEN, RESET = "\033[31m", "\033[33m", "\033[32m", "\033[0m"

Samples = dict[str, list[tuple[dict[str, str], float]]]


@dataclass
class Row:
    box: str
    cells: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # shown; the box is not red for them


def samples_of(text: str) -> Samples:
    """The exposition text as {metric name: [(labels, value)]} (Prometheus' text format)."""
    found: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name].append((sample.labels, sample.value))
    return found


def one(samples: Samples, name: str) -> float | None:
    values = samples.get(name, [])
    return values[0][1] if values else None


def by(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {labels.get(label, ""): value for labels, value in samples.get(name, [])}


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def row(box: str, samples: Samples | None, error: str = "") -> Row:
    """A box's cells and what makes it red, from its endpoint's samples (None: no answer)."""
    result = Row(box)
    if samples is None:
        result.cells = [f"no answer: {error}", "", "", "", "", "", ""]
        result.problems.append(f"endpoint: {error}")
        return result
    up, canary = (
        by(samples, "spark_lane_up", "lane"),
        by(samples, "spark_lane_canary_passed", "lane"),
    )
    on_demand, running = (
        by(samples, "spark_lane_on_demand", "lane"),
        by(samples, "spark_lane_running", "lane"),
    )
    lanes = []
    for lane, value in up.items():
        state = "up" if value == 1 else "DOWN"
        if on_demand.get(lane) == 1 and value == 1:  # idle by design (docs/on-demand.md)
            state = "up on demand" if running.get(lane) == 1 else "idle on demand"
        if canary.get(lane) == 0:
            state += ",canary FAILED"
        lanes.append(f"{lane} {state}")
        if value != 1 or canary.get(lane) == 0:
            result.problems.append(f"lane {lane} {state}")
    available = one(samples, "spark_memory_available_bytes")
    floor = one(samples, "spark_memory_guard_floor_bytes")
    memory = "?"
    if available is not None and floor is not None:
        memory = f"{available / GIB:.1f}/{floor / GIB:g} GiB"
        if available < floor:
            result.problems.append("memory below the floor")
    clock = clock_cell(one(samples, "spark_gpu_clock_locked_mhz"))
    rates = by(samples, "spark_twin_rate_mbps", "twin")
    mtus = by(samples, "spark_twin_mtu_bytes", "twin")
    gids = by(samples, "spark_twin_roce_v2_gid_index", "twin")
    ups = by(samples, "spark_twin_up", "twin")  # none from a collector before it: up
    twins = [
        f"{twin} DOWN"
        if ups.get(twin) == 0
        else f"{twin} {rates[twin] / 1000:g}G/{mtus.get(twin, 0):.0f}/gid {gids.get(twin, -1):.0f}"
        for twin in rates
    ]
    nccl = "-"
    if one(samples, "spark_nccl_verdict_present") == 0:
        nccl = "no verdict"
    elif (passed := one(samples, "spark_nccl_passed")) is not None:
        seconds = one(samples, "spark_nccl_age_seconds") or 0
        busbw = one(samples, "spark_nccl_busbw_gbs")
        nccl = f"{'pass' if passed == 1 else 'FAIL'} {busbw or 0:.2f} GB/s {age(seconds)} ago"
        if passed != 1 or seconds > NCCL_MAX_AGE_S:
            result.problems.append(f"NCCL {nccl}")
    drift = []
    for labels, value in samples.get("spark_drift", []):
        if value != 1:
            continue
        text = f"{labels['kind']} {labels['subject']} {labels['found']} (plan {labels['expected']})"
        if labels.get("severity") == "warning":
            result.warnings.append(f"drift: {text}")
            text += " warning"
        else:
            result.problems.append(f"drift: {text}")
        drift.append(text)
    result.cells = [", ".join(lanes) or "-", memory, ", ".join(twins) or "-", nccl]
    result.cells.append(", ".join(pulling(samples)) or "-")
    result.cells.append("; ".join(drift) or "-")
    result.cells.append(clock)
    return result


def clock_cell(locked_mhz: float | None) -> str:
    """The GPU clock's lock as the collector read it from its unit's journal (no series: the
    plan locks none; 0: not locked this boot, which is also a drift)."""
    if locked_mhz is None:
        return "off"
    return f"max {locked_mhz:.0f} MHz" if locked_mhz else "NOT LOCKED"


def pulling(samples: Samples) -> list[str]:
    """Each image pull running on the box (the collector's spark_image_pull_* series), as
    "<image>: X of Y GB (P%), R MB/s: pulling"."""
    done = by(samples, "spark_image_pull_bytes", "image")
    total = by(samples, "spark_image_pull_total_bytes", "image")
    rate = by(samples, "spark_image_pull_rate_bytes_per_second", "image")
    return [
        f"{image}: {done.get(image, 0) / 1e9:.1f} of {total.get(image, 0) / 1e9:.1f} GB"
        f" ({100 * done.get(image, 0) / max(total.get(image, 0), 1):.0f}%),"
        f" {rate.get(image, 0) / 1e6:.0f} MB/s: pulling"
        for image, running in by(samples, "spark_image_pulling", "image").items()
        if running == 1
    ]


def scrape(box: BoxPlan, keys_dir: Path) -> tuple[Samples | None, str]:
    assert box.metrics is not None
    scheme = "https" if box.metrics.tls else "http"
    try:
        key = (keys_dir / f"{box.name}.key").read_text().strip()
    except OSError as error:
        return None, f"no key ({error.strerror}: {keys_dir}/{box.name}.key)"
    request = urllib.request.Request(f"{scheme}://{box.address}:{box.metrics.port}/metrics")
    request.add_header("Authorization", f"Bearer {key}")
    try:
        context = ssl.create_default_context() if scheme == "https" else None
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as response:
            return samples_of(response.read().decode()), ""
    except Exception as error:  # any failure to read is a box not answering
        return None, str(getattr(error, "reason", error))


def router_row(box: str, failover: bool, planned: list[str], listed: list[str] | None,
               error: str = "") -> Row:  # fmt: skip
    """The router's row: up when its /v1/models answers, the served names it lists against the
    plan's (one missing: red; one the plan has not: a warning, the router's configuration is
    older than the inventory)."""
    result = Row(f"{box} (router{', failover' if failover else ''})")
    if listed is None:
        result.cells = [f"router DOWN: {error}", "", "", "", "", "", ""]
        result.problems.append(f"router: {error}")
        return result
    missing = [name for name in planned if name not in listed]
    extra = [name for name in listed if name not in planned]
    cell = f"router up: {len(planned) - len(missing)} of {len(planned)} served names"
    if missing:
        cell += f", missing {', '.join(missing)}"
        result.problems.append(f"router: does not list {', '.join(missing)}; deploy again")
    if extra:
        cell += f", not planned {', '.join(extra)}"
        result.warnings.append(f"router: lists {', '.join(extra)}, which no lane serves")
    result.cells = [cell, "", "", "", "", "", ""]
    return result


def served_names(url: str, key_file: Path) -> tuple[list[str] | None, str]:
    """The names the router's /v1/models lists (OpenAI's shape: data[].id), asked with the
    fleet key; None and why when it does not answer so."""
    try:
        key = key_file.read_text().strip()
    except OSError as error:
        return None, f"no key ({error.strerror}: {key_file})"
    request = urllib.request.Request(f"{url}/models")
    request.add_header("Authorization", f"Bearer {key}")
    try:
        context = ssl.create_default_context() if url.startswith("https:") else None
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as response:
            return [card["id"] for card in json.loads(response.read())["data"]], ""
    except urllib.error.HTTPError as error:
        # LiteLLM without a database answers a key it does not know 400 (bench/router.py).
        if error.code in (400, 401, 403):
            return None, f"the fleet key refused ({error.code} {error.reason}: {key_file})"
        return None, f"{error.code} {error.reason}"
    except Exception as error:  # any other failure to read is a router not answering
        return None, str(getattr(error, "reason", error))


def table(rows: list[Row], colour: bool) -> str:
    header = ["box", "lanes (canary)", "memory avail/floor", "twins rate/MTU/GID", "NCCL"]
    header += ["pulls", "drift", "GPU clock"]
    lines = [header] + [[r.box, *r.cells] for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for index, line in enumerate(lines):
        text = "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        if index and colour:
            shown = rows[index - 1]
            text = (RED if shown.problems else YELLOW if shown.warnings else GREEN) + text + RESET
        out.append(text.rstrip())
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default="inventories/lab.py")
    parser.add_argument("--keys-dir", default=KEYS_DIR)
    args = parser.parse_args(argv)
    if (plan := plan_or_say_why(args.inventory)) is None:
        return 2
    boxes = [box for box in plan.boxes if box.metrics is not None]
    keys_dir = Path(args.keys_dir).expanduser()
    routers = routers_of(plan)
    with ThreadPoolExecutor(max_workers=len(boxes) + len(routers)) as pool:
        answers = pool.map(lambda box: scrape(box, keys_dir), boxes)
        listed = pool.map(
            lambda router: served_names(
                router.url, Path(fleet_key_file(str(keys_dir), router.box))
            ),
            routers,
        )
        rows = [
            row(box.name, samples, error)
            for box, (samples, error) in zip(boxes, answers, strict=True)
        ]
        planned = [route.served_name for route in plan.fleet.routes]
        rows += [
            router_row(router.box, index > 0, planned, names, error)
            for index, (router, (names, error)) in enumerate(zip(routers, listed, strict=True))
        ]
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ  # no-color.org
    text, code = report(rows, colour)
    print(text, end="")
    return code


def report(rows: list[Row], colour: bool) -> tuple[str, int]:
    """The table, then a line per box with warnings and one per red box; exit 1 where a box is
    red (warnings alone: 0)."""
    lines = [f"{r.box}: warning: {'; '.join(r.warnings)}\n" for r in rows if r.warnings]
    red = [r for r in rows if r.problems]
    lines += [f"{r.box}: {'; '.join(r.problems)}\n" for r in red]
    return table(rows, colour) + "".join(lines), 1 if red else 0


if __name__ == "__main__":
    sys.exit(main())
