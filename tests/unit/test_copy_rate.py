"""bench/copy_rate.py, the fleet copy's bench: the model it serves is listed as the hub lists a
repository (each LFS file's SHA-256, any other file's Git blob id, worked out here with hashlib
and git itself), and a small run on loopback copies it whole and reports both sides. Nothing here
is timed: the rates are whatever the machine gives."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from bench import copy_rate


def test_the_model_is_listed_as_the_hub_lists_a_repository(tmp_path: Path) -> None:
    listing, total = copy_rate.make_model(tmp_path, 2, 2**20 + 7)
    api = tmp_path / "api/models" / copy_rate.MODEL / "revision/main"
    assert json.loads(api.read_text()) == listing
    siblings = {s["rfilename"]: s for s in listing["siblings"]}
    weights = [s for s in siblings.values() if "lfs" in s]
    assert len(weights) == 2 and {s["size"] for s in weights} == {2**20 + 7}
    for sibling in weights:
        data = (tmp_path / "blobs" / sibling["lfs"]["sha256"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sibling["lfs"]["sha256"]
        assert len(data) == sibling["lfs"]["size"] == sibling["size"]
    assert weights[0]["lfs"]["sha256"] != weights[1]["lfs"]["sha256"]  # each a blob of its own
    config = tmp_path / "blobs" / siblings["config.json"]["blobId"]
    hashed = subprocess.run(["git", "hash-object", str(config)], capture_output=True, text=True)
    assert hashed.stdout.strip() == siblings["config.json"]["blobId"]
    on_disk = [p.stat().st_size for p in (tmp_path / "blobs").iterdir()]
    assert total == sum(on_disk) == sum(s["size"] for s in siblings.values())


def test_a_run_copies_the_model_and_reports_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    argv = ["--files", "2", "--file-mib", "1", "--rounds", "1", "--loopback",
            "--dir", str(tmp_path), "--json", str(out)]  # fmt: skip
    assert copy_rate.main(argv) == 0
    results = json.loads(out.read_text())
    assert results["link"] == "loopback (asked)"
    # files/spark_fetch.py: half the cores this process may use, at least four
    assert results["files_at_once"] == max(4, len(os.sched_getaffinity(0)) // 2)
    small = sum(len(data) for data in copy_rate.SMALL.values())
    assert results["bytes"] == 2 * 2**20 + small
    assert len(results["raw"]) == len(results["copy"]) == len(results["sha256sum"]) == 1
    for run in (*results["raw"], *results["copy"]):
        assert run["rate"] == results["bytes"] / run["seconds"]
    ratio = results["copy_median_mb_s"] / results["raw_median_mb_s"]
    assert results["ratio"] == round(ratio, 3)
    per_gb = {
        name: results[key][0]["cpu"] / (results["bytes"] / 1e9)
        for name, key in (("copy", "copy"), ("curl", "raw"), ("sha256sum", "sha256sum"))
    }
    assert results["cpu_ratio"] == round(per_gb["copy"] / (per_gb["sha256sum"] + per_gb["curl"]), 3)
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # the model and cache gone


def test_the_cpu_ratio_is_the_copys_seconds_per_gb_against_sha256sums_plus_curls() -> None:
    # 2 GB; medians: curl 2.0 s (1.0 s/GB), the copy 6.0 s (3.0), sha256sum 2.0 s (1.0)
    raws = [{"cpu": 1.0}, {"cpu": 3.0}, {"cpu": 2.0}]
    copies = [{"cpu": 6.0}, {"cpu": 5.0}, {"cpu": 9.0}]
    sums = [{"cpu": 2.0}, {"cpu": 2.0}, {"cpu": 4.0}]
    assert copy_rate.cpu_per_gb(raws, copies, sums, 2 * 10**9) == {
        "cpu_s_per_gb": {"copy": 3.0, "curl": 1.0, "sha256sum": 1.0},
        "cpu_ratio": 1.5,
    }
