"""A cluster lane's weights copied from the head over the fabric: the operations, the manifest the
head writes and the copy script run for real against a repository served on loopback.

The repositories here are written by hand in huggingface_hub's cache layout (blobs named by their
hash, snapshot files linking to them, refs/main naming the revision), as its file_download
leaves them.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyinfra.context import ctx_state

from operations import preflight, weights
from tests.unit.harness import FakeHost, file_facts, process, refusal, run_of, run_op

MODEL = "org/name"
REPO = "/var/lib/spark/models/hub/models--org--name"
REVISION = "0123456789abcdef0123456789abcdef01234567"
CONFIG = b'{"architectures": ["Qwen3ForCausalLM"]}\n'
WEIGHTS = b"\x00\x01" * 300_000
# Their names, as huggingface_hub names them: the Git blob id of a plain file, the SHA-256 of an
# LFS one (computed here with hashlib, not with the code under test).
CONFIG_ID = hashlib.sha1(b"blob %d\0" % len(CONFIG) + CONFIG).hexdigest()
WEIGHTS_ID = hashlib.sha256(WEIGHTS).hexdigest()


def make_repo(root: Path) -> Path:
    repo = root / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / CONFIG_ID).write_bytes(CONFIG)
    (repo / "blobs" / WEIGHTS_ID).write_bytes(WEIGHTS)
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(f"../../blobs/{CONFIG_ID}")
    (snapshot / "model.safetensors").symlink_to(f"../../blobs/{WEIGHTS_ID}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return repo


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The head's side, as ``shared`` sets it up: a directory with the manifest and `repo` (a
    link to the model's repository), served by Python's http.server on loopback."""
    repo = make_repo(tmp_path / "head")
    share = tmp_path / "share"
    share.mkdir()
    (share / "repo").symlink_to(repo)
    command = weights.manifest_command(str(repo), str(share / "manifest"))
    subprocess.run(["sh", "-c", command], check=True)
    handler = functools.partial(
        type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": print}),
        directory=str(share),
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", repo
    finally:
        server.shutdown()


def copy(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    script = tmp_path / "spark-weights-copy"
    script.write_text(
        (Path(weights.__file__).parents[1] / "templates/spark-weights-copy.j2").read_text()
    )
    dest = tmp_path / "worker" / "models--org--name"
    return subprocess.run(
        [sys.executable, str(script), source, str(dest)], capture_output=True, text=True
    )


def test_the_manifest_names_each_blob_link_and_ref(served: tuple[str, Path]) -> None:
    _, repo = served
    manifest = (repo.parents[1] / "share" / "manifest").read_text().splitlines()
    assert sorted(manifest) == sorted(
        [
            f"blob {CONFIG_ID} {len(CONFIG)}",
            f"blob {WEIGHTS_ID} {len(WEIGHTS)}",
            f"link snapshots/{REVISION}/config.json ../../blobs/{CONFIG_ID}",
            f"link snapshots/{REVISION}/model.safetensors ../../blobs/{WEIGHTS_ID}",
            f"ref main {REVISION}",
        ]
    )


def test_the_copy_rebuilds_the_repository_and_checks_every_blob(
    tmp_path: Path, served: tuple[str, Path]
) -> None:
    source, _ = served
    result = copy(tmp_path, source)
    assert result.returncode == 0, result.stderr
    dest = tmp_path / "worker" / "models--org--name"
    snapshot = dest / "snapshots" / REVISION
    assert (snapshot / "config.json").read_bytes() == CONFIG
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert (snapshot / "model.safetensors").readlink() == Path(f"../../blobs/{WEIGHTS_ID}")
    assert (dest / "refs" / "main").read_text() == REVISION
    assert result.stdout.startswith(
        f"copied {len(CONFIG) + len(WEIGHTS)} bytes of 2 blobs from {source} in "
    )
    # Run again (a deploy cut off after the copy): the blobs there are not copied again.
    again = copy(tmp_path, source)
    assert again.returncode == 0 and again.stdout.startswith("copied 0 bytes of 2 blobs")


def test_a_corrupt_blob_is_caught_by_its_hash_and_not_kept(
    tmp_path: Path, served: tuple[str, Path]
) -> None:
    source, repo = served
    corrupt = bytearray(WEIGHTS)
    corrupt[1000] ^= 0xFF  # one bit-flipped byte on the head's disk
    (repo / "blobs" / WEIGHTS_ID).write_bytes(bytes(corrupt))
    result = copy(tmp_path, source)
    assert result.returncode == 1
    assert f"blobs/{WEIGHTS_ID}: {len(WEIGHTS)} bytes, SHA-256 " in result.stderr
    assert "not the file its name says" in result.stderr
    blobs = tmp_path / "worker" / "models--org--name" / "blobs"
    kept = [path.name for path in blobs.iterdir()]
    assert not [name for name in kept if name.startswith(WEIGHTS_ID)], kept  # nothing of it
    assert not (tmp_path / "worker" / "models--org--name" / "snapshots").exists()


def run_cluster(
    present: dict[str, bool],
    fetch: bool,
    stopped: dict[str, tuple[str, str] | None] | None = None,
    left_out: tuple[str, ...] = (),
    served: bool | None = None,
) -> dict[str, list[str]]:
    """shared on the head (spark-1), copied on every box of the run, unshared on the head, as
    pyinfra runs them op by op: the commands of each box. ``present``: which boxes hold the
    model; ``stopped``: boxes failed before, as harness.run_state takes them; ``left_out``: boxes
    the run leaves out (--limit), which answer nothing; ``served``: whether the head serves when
    unshared runs (None: as shared left it)."""
    copy_script = file_facts({weights.COPY_COMMAND: None})
    hosts = {
        name: FakeHost({preflight.ModelWeights: "present" if has else ""} | copy_script, name=name)
        for name, has in present.items()
    }
    for name in left_out:
        hosts[name].outputs = {}  # asked anything, it fails the test
    in_run = [host for name, host in hosts.items() if name not in (*(stopped or {}), *left_out)]
    found: dict[str, list[str]] = {}

    def on(name: str, op, *args) -> list[str]:
        return run_op(op, *args, host=hosts[name])

    with ctx_state.use(run_of(*in_run, stopped=stopped)):
        if "spark-1" in [host.name for host in in_run]:
            found["shared"] = on("spark-1", weights.shared, MODEL, "/var/lib/spark/models",
                                 "192.168.100.10", fetch, list(present))  # fmt: skip
        for host in in_run:
            found[host.name] = on(host.name, weights.copied, MODEL, "/var/lib/spark/models",
                                  "img:1", None, "spark-1", "192.168.100.10", fetch)  # fmt: skip
        if "spark-1" in [host.name for host in in_run]:
            shared = found["shared"] != [] if served is None else served
            hosts["spark-1"].outputs[weights.Shared] = "serving" if shared else ""
            found["unshared"] = on("spark-1", weights.unshared)
    return found


def test_the_shared_fact_reads_the_share_left_in_run() -> None:
    assert process(weights.Shared, "serving\n") is True
    assert process(weights.Shared, "") is False


def test_every_box_holding_the_model_needs_nothing() -> None:
    found = run_cluster({"spark-1": True, "spark-2": True}, fetch=True)
    assert found == {"shared": [], "spark-1": [], "spark-2": [], "unshared": []}


def test_a_box_lacking_it_copies_it_from_the_head_while_the_head_serves() -> None:
    found = run_cluster({"spark-1": True, "spark-2": False}, fetch=True)
    shared = found["shared"]
    assert (
        shared[0]
        == "systemctl stop spark-weights-share 2>/dev/null; rm -rf /run/spark/weights-share"
    )
    assert shared[1] == (
        f"install -d -m 700 /run/spark/weights-share && ln -s {REPO} /run/spark/weights-share/repo"
    )
    assert shared[3] == (
        "systemd-run --unit=spark-weights-share --collect -p RuntimeMaxSec=21600"
        " python3 -m http.server 60990 --bind 192.168.100.10 --directory /run/spark/weights-share"
    )
    assert found["spark-1"] == []
    worker = found["spark-2"]
    assert worker[-1] == f"/usr/local/sbin/spark-weights-copy 192.168.100.10:60990 {REPO}"
    assert found["unshared"] == [
        "systemctl stop spark-weights-share 2>/dev/null; rm -rf /run/spark/weights-share; true"
    ]


def test_without_fetch_weights_the_box_stops_with_the_command_and_nothing_is_served() -> None:
    found = run_cluster({"spark-1": True, "spark-2": False}, fetch=False)
    assert found["shared"] == [] and found["unshared"] == []
    message = refusal(found["spark-2"])
    assert message.startswith(f"spark-2: {MODEL} is not on this box ({REPO});")
    assert "hf download org/name" in message


def test_a_head_that_stopped_leaves_nothing_to_copy_from() -> None:
    # The head stopped at its firewall (firewall.cluster_ports_fabric_only's refusal).
    stopped = {
        "spark-1": (
            "Cluster | Firewall: Ray's and the distributed back-end's ports from the fabric only",
            "spark-1: port(s) 6379 must stay open (SSH, a lane's API) but fall among the"
            " cluster's ports (6379-6385)",
        )
    }
    found = run_cluster({"spark-1": True, "spark-2": False}, fetch=True, stopped=stopped)
    assert refusal(found["spark-2"]) == (
        "spark-2: org/name is copied from the head: the copy waits for spark-1, stopped at"
        " Cluster | Firewall: Ray's and the distributed back-end's ports from the fabric only:"
        " port(s) 6379 must stay open (SSH, a lane's API) but fall among the cluster's ports"
        " (6379-6385)"
    )


def test_a_head_left_out_of_the_run_is_named_and_not_copied_from() -> None:
    # A failed command naming the way out (a raise would stop every box in the plan).
    found = run_cluster({"spark-1": True, "spark-2": False}, fetch=True, left_out=("spark-1",))
    assert refusal(found["spark-2"]) == (
        "spark-2: org/name is copied from spark-1, which this run leaves out (--limit): run"
        " the deploy with spark-1 too"
    )


def test_a_box_left_out_is_not_asked_and_not_served() -> None:
    found = run_cluster({"spark-1": True, "spark-2": False}, fetch=True, left_out=("spark-2",))
    assert found == {"shared": [], "spark-1": [], "unshared": []}


def test_a_share_left_by_a_run_cut_off_is_stopped() -> None:
    found = run_cluster({"spark-1": True, "spark-2": True}, fetch=True, served=True)
    assert found["shared"] == [] and found["spark-2"] == []
    assert found["unshared"] == [
        "systemctl stop spark-weights-share 2>/dev/null; rm -rf /run/spark/weights-share; true"
    ]
