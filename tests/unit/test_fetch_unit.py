"""operations/weights.py's background fetch: the unit it writes and starts without waiting, and
what a deploy says while it runs. FetchState's command runs here in a real shell against a
cache in a temporary folder; its status line is files/spark_fetch.py's own format."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from operations import lanes, preflight, weights
from tests.unit.harness import FakeHost, file_facts, process, refusal, run_op

MODEL = "org/name"
UNIT = "spark-fetch-org--name.service"
MODELS = "/var/lib/spark/models"
HUB = "https://huggingface.co"
# A status line as spark_fetch.py writes it (Progress.add): 10 GB of 40, 52 MB/s.
STATUS = json.dumps({"model": MODEL, "total": 40 * 10**9, "done": 10 * 10**9, "rate": 52 * 10**6,
                     "state": "fetching", "time": 1795000000})  # fmt: skip


def box(present: bool, active: str, files: dict[str, str | None] | None = None) -> FakeHost:
    return FakeHost(
        {
            preflight.ModelWeights: "present" if present else "",
            weights.FetchState: f"{active}\n{STATUS}\nbytes {10 * 10**9}",
            **file_facts(files or {}),
        }
    )


def fetched(host: FakeHost, token: str | None = None) -> list[str]:
    return run_op(weights.fetched, MODEL, (), MODELS, HUB, token, host=host)


def test_the_fact_reads_the_unit_the_status_and_the_blobs(tmp_path: Path) -> None:
    blobs = tmp_path / "hub/models--org--name/blobs"
    blobs.mkdir(parents=True)
    (blobs / ("a" * 64)).write_bytes(b"x" * 1000)
    (blobs / ("b" * 64 + ".incomplete")).write_bytes(b"y" * 234)
    command = weights.FetchState().command(model=MODEL, models_dir=str(tmp_path))
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = process(weights.FetchState, output.stdout)
    # No such unit here, no status file: inactive, the bytes summed from the blobs' sizes.
    assert found == {"active": "inactive", "done": 1234}
    assert process(weights.FetchState, f"activating\n{STATUS}\nbytes 7") == {
        "active": "activating", "total": 40 * 10**9, "rate": 52 * 10**6, "state": "fetching",
        "done": 7,
    }  # fmt: skip


def test_a_model_on_the_box_is_left_alone() -> None:
    host = box(present=True, active="inactive", files={f"/etc/systemd/system/{UNIT}": None})
    assert fetched(host) == []
    assert host.noops == [f"{MODEL} is on this box"]


def test_a_landed_fetch_leaves_its_unit_as_it_is() -> None:
    """Its unit disabled itself once landed (ExecStartPost): nothing to do, nothing changed."""
    host = box(present=True, active="active", files={f"/etc/systemd/system/{UNIT}": "[Unit]"})
    assert fetched(host) == []
    assert host.noops == [f"{MODEL} is on this box"]


def test_a_running_fetch_is_reported_and_nothing_changed() -> None:
    host = box(present=False, active="activating", files={f"/etc/systemd/system/{UNIT}": "x"})
    assert fetched(host) == []
    assert host.logs == [
        f"{MODEL}: 10.0 of 40.0 GB (25%), 52 MB/s: fetching ({UNIT}; journalctl -u {UNIT})"
    ]


def test_a_missing_model_gets_its_unit_started_without_waiting() -> None:
    host = box(
        present=False,
        active="inactive",
        files={weights.FETCH_SCRIPT: None, f"/etc/systemd/system/{UNIT}": None},
    )
    commands = fetched(host, token="/etc/spark/secrets/hf-token")
    assert commands[-2:] == [
        "systemctl daemon-reload",
        f"systemctl enable {UNIT} && systemctl reset-failed {UNIT} 2>/dev/null;"
        f" systemctl restart --no-block {UNIT}",
    ]
    assert host.uploads[weights.FETCH_SCRIPT] == weights.FETCH_SOURCE.read_text()
    assert host.logs == [
        f"{MODEL}: 10.0 of 40.0 GB (25%), 52 MB/s: fetch started ({UNIT}; journalctl -u {UNIT})"
    ]
    unit = host.uploads[f"/etc/systemd/system/{UNIT}"]
    assert (
        "ExecStart=/usr/bin/python3 /usr/local/lib/spark/spark_fetch.py org/name --cache"
        f" {MODELS} --endpoint {HUB} --status /var/lib/spark/fetch/org--name.json"
        " --token-file /etc/spark/secrets/hf-token\n"
    ) in unit
    # oneshot: active once landed, for the lanes ordered after it; no 90 s start timeout.
    for line in ("Type=oneshot", "RemainAfterExit=yes", "TimeoutStartSec=infinity",
                 "Restart=on-failure", f"ExecStartPost=/bin/systemctl disable {UNIT}"):  # fmt: skip
        assert f"\n{line}\n" in unit
    assert "hf_" not in unit.replace("hf-token", "")  # the token's path only


def test_the_unit_name_and_arguments_quote_what_they_carry() -> None:
    assert weights.fetch_unit("Qwen/Qwen3.6-35B") == "spark-fetch-Qwen--Qwen3.6-35B.service"
    assert weights.fetch_arguments(MODEL, ("a b.gguf",), MODELS, HUB, None, "http://x:1") == (
        f"org/name 'a b.gguf' --cache {MODELS} --endpoint {HUB}"
        " --status /var/lib/spark/fetch/org--name.json --source http://x:1"
    )


def test_room_reads_the_free_bytes_and_each_models_size(tmp_path: Path) -> None:
    repo = tmp_path / "hub/models--org--big/blobs"
    repo.mkdir(parents=True)
    (repo / "blob").write_bytes(b"z" * 5000)
    command = weights.CacheRoom().command(models_dir=str(tmp_path))
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = process(weights.CacheRoom, output.stdout)
    assert found["free"] > 0
    assert 5000 <= found["models"]["org/big"] < 5000 + 3 * 4096  # the file and directories
    # A cache not made yet: the free bytes of the directory that will hold it.
    command = weights.CacheRoom().command(models_dir=str(tmp_path / "not/yet"))
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert process(weights.CacheRoom, output.stdout)["models"] == {}


ROOM = "free 50000000000\nmodel org--old 80000000000\nmodel org--used 30000000000\n" \
    "model org--name 20000000000\nmodel other--small 1000000000"  # fmt: skip
# The hub's answer to /api/models/org/name/revision/main?blobs=true, in huggingface_hub's shape
# (hf_api.py ModelInfo: `sha`, `siblings` each with `rfilename`, `size`, `blobId`, and `lfs`
# {sha256, size, pointerSize} for an LFS file); 70 GB in all, 60 GB of it in the GGUF part.
LISTING = json.dumps({"id": MODEL, "sha": "c" * 40, "siblings": [
    {"rfilename": "config.json", "size": 10 * 10**9, "blobId": "d" * 40},
    {"rfilename": "w-00001-of-00001.gguf", "size": 60 * 10**9, "blobId": "e" * 40,
     "lfs": {"sha256": "f" * 64, "size": 60 * 10**9, "pointerSize": 135}},
]})  # fmt: skip


def room_for(
    listing: str, catalog: int, files: tuple[str, ...] = (), present: bool = False
) -> tuple[list[str], FakeHost]:
    host = FakeHost(
        {
            preflight.ModelWeights: "present" if present else "",
            weights.HubListing: listing,
            weights.CacheRoom: ROOM,
        },
        name="spark-2",
    )
    in_use = ["org/used", MODEL]
    commands = run_op(
        weights.room_for, MODEL, files, HUB, "/root/.hf_token", catalog, MODELS, in_use, host=host
    )
    return commands, host


def test_the_hub_listing_gives_each_files_size() -> None:
    assert process(weights.HubListing, LISTING) == {
        "config.json": 10 * 10**9, "w-00001-of-00001.gguf": 60 * 10**9
    }  # fmt: skip
    # curl failed (its `|| echo`-less output is the lone newline): no listing.
    assert process(weights.HubListing, "\n") == {}
    assert process(weights.HubListing, "<html>502</html>") == {}


def test_the_hub_listing_sends_the_token_on_stdin_never_in_argv(tmp_path: Path) -> None:
    """The command against a stand-in curl printing its argv and stdin."""
    token = tmp_path / "token"
    token.write_text("hf_secret\n")
    (tmp_path / "curl").write_text('#!/bin/sh\necho "argv $*"; cat\n')
    (tmp_path / "curl").chmod(0o755)
    command = weights.HubListing().command(model=MODEL, endpoint=HUB + "/", token_path=str(token))
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    url = f"{HUB}/api/models/{MODEL}/revision/main?blobs=true"
    assert done.stdout.splitlines() == [
        f"argv -sSf --max-time 20 -H @- {url}",
        "Authorization: Bearer hf_secret",
        "",
    ]
    assert "hf_secret" not in command
    command = weights.HubListing().command(model=MODEL, endpoint=HUB, token_path=None)
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    assert done.stdout.splitlines() == [f"argv -sSf --max-time 20 -H @- {url}", ""]


def test_room_enough_counting_what_is_already_fetched() -> None:
    # The hub's 70 GB, of which 20 GB are in the cache already: 50 GB still, 50 GB free.
    commands, host = room_for(LISTING, catalog=1)
    assert commands == []
    assert host.noops == [f"{MODEL}: 50.0 GB still to fetch (the hub's listing), 50.0 GB free"]


def test_a_model_on_the_box_needs_no_room_and_the_hub_is_not_asked() -> None:
    commands, host = room_for("unasked", catalog=1, present=True)
    assert commands == []
    assert host.noops == [f"{MODEL} is on this box"]


def test_the_files_fetched_alone_count() -> None:
    # The GGUF part alone: 60 GB, 20 GB in the cache: 40 GB still.
    commands, host = room_for(LISTING, catalog=1, files=("*.gguf",))
    assert commands == []
    assert host.noops == [f"{MODEL}: 40.0 GB still to fetch (the hub's listing), 50.0 GB free"]


def test_prune_removes_the_models_no_lane_uses_saying_each_with_its_size() -> None:
    # ROOM's cache: org/old (80 GB) and other/small (1 GB) are no lane's; org/used, org/name are.
    host = FakeHost({weights.CacheRoom: ROOM}, name="spark-2")
    commands = run_op(weights.models_pruned, MODELS, ["org/used", MODEL], host=host)
    assert commands == [
        "systemctl disable --now spark-fetch-org--old.service 2>/dev/null;"
        f" rm -rf {MODELS}/hub/models--org--old",
        "systemctl disable --now spark-fetch-other--small.service 2>/dev/null;"
        f" rm -rf {MODELS}/hub/models--other--small",
    ]
    assert host.logs == [
        "org/old: removed (80.0 GB, no lane of this box uses it)",
        "other/small: removed (1.0 GB, no lane of this box uses it)",
    ]
    kept = run_op(
        weights.models_pruned, MODELS, ["org/old", "org/used", MODEL, "other/small"], host=host
    )
    assert kept == [] and host.noops == ["no cached model is unused"]


def test_too_little_room_names_both_numbers_and_the_unused_models() -> None:
    # The hub silent: the catalog's 90 GB, 20 GB in the cache: 70 GB still, 50 GB free.
    commands, _ = room_for("\n", catalog=90 * 10**9)
    assert refusal(commands) == (
        f"spark-2: no room for {MODEL}: it needs 70.0 GB more (the catalog's size, the hub not"
        f" answering), {MODELS} has 50.0 GB free; models no lane of this box uses, biggest first:"
        f" org/old (80.0 GB: {MODELS}/hub/models--org--old), other/small (1.0 GB:"
        f" {MODELS}/hub/models--other--small)"
    )


def run_wait(tmp_path: Path, states: list[str]) -> tuple[int, str, list[str]]:
    """lanes.fetch_wait in sh, against stand-ins for systemctl (the fetch's ActiveState read
    from `states`, one per `show`, the last repeated; `start` logged) and sleep."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "states").write_text("\n".join(states) + "\n")
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = show ]; then s=$(head -n 1 {tmp_path}/states); echo "$s";'
        f" [ $(wc -l < {tmp_path}/states) -gt 1 ] && sed -i 1d {tmp_path}/states; exit 0; fi\n"
        f'echo "$*" >> {tmp_path}/log\n'
    )
    (bin_dir / "sleep").write_text("#!/bin/sh\n")
    for stand_in in ("systemctl", "sleep"):
        (bin_dir / stand_in).chmod(0o755)
    command = lanes.fetch_wait("spark-lane-coder.service", UNIT) + "; echo started"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    log = tmp_path / "log"
    return done.returncode, done.stdout, log.read_text().splitlines() if log.exists() else []


def test_a_lane_waits_a_while_for_its_fetch_then_the_deploy_goes_on(tmp_path: Path) -> None:
    code, out, log = run_wait(tmp_path, ["activating"])
    assert (code, out) == (0, f"spark-lane-coder.service: starts once {UNIT} lands\n")
    assert log == ["start --no-block spark-lane-coder.service"]


def test_a_fetch_landing_in_time_lets_the_lane_start_within_the_deploy(tmp_path: Path) -> None:
    code, out, log = run_wait(tmp_path, ["activating", "activating", "active"])
    assert (code, out, log) == (0, "started\n", ["start --no-block spark-lane-coder.service"])
    (tmp_path / "none").mkdir()  # no fetch running: nothing queued, the start follows
    assert run_wait(tmp_path / "none", ["inactive"]) == (0, "started\n", [])


SERVE = "/etc/systemd/system/spark-weights-serve.service"
SERVER = "/usr/local/lib/spark/spark_serve.py"  # where the unit runs the server from
SERVER_SOURCE = (Path(__file__).parents[2] / "files/spark_serve.py").read_text()  # put as it is
# The unit as a deploy leaves it for 192.168.100.10:60991 (templates/spark-weights-serve.service
# .j2), written out here.
SERVE_UNIT = """\
# Weights served to the fleet: written by the spark deploy (operations/weights.py); edits are overwritten.
[Unit]
Description=Spark weights: this box's Hugging Face cache served read-only on its fabric address 192.168.100.10:60991
After=network-online.target
Wants=network-online.target

[Service]
# The blobs only, each named by its hash, sent by sendfile, a cut copy resumed by a Range
# (files/spark_serve.py); the boxes that copy them check each against the hub's.
# Bound to the fabric address: reached over the fabric alone (the cluster firewall admits this
# port, in the ephemeral range, from the fabric only).
# "+": as root, before any model is fetched here.
ExecStartPre=+/usr/bin/install -d -m 755 /var/lib/spark/models/hub
ExecStart=/usr/bin/python3 /usr/local/lib/spark/spark_serve.py 60991 --bind 192.168.100.10 --directory /var/lib/spark/models/hub
DynamicUser=yes
Restart=always
RestartSec=5s

[Install]
WantedBy=multi-user.target
"""  # noqa: E501 - the unit's own lines


def test_the_blobs_are_served_on_the_fabric_address_read_only() -> None:
    host = FakeHost({weights.ServeState: None, **file_facts({SERVE: None, SERVER: None})})
    commands = run_op(weights.blobs_served, "192.168.100.10", 60991, MODELS, host=host)
    assert commands[-3:] == [
        "systemctl daemon-reload",
        "systemctl enable spark-weights-serve.service",
        "systemctl restart spark-weights-serve.service",
    ]
    assert host.uploads == {SERVER: SERVER_SOURCE, SERVE: SERVE_UNIT}
    assert (
        f"\nExecStart=/usr/bin/python3 {SERVER} 60991 --bind 192.168.100.10"
        f" --directory {MODELS}/hub\n"
    ) in SERVE_UNIT
    assert "\nDynamicUser=yes\n" in SERVE_UNIT  # no root, nothing writable
    # As written and running: nothing (systemctl show's lines, as the lab's lanes show them).
    running = FakeHost(
        {
            weights.ServeState: "ActiveState=active\nUnitFileState=enabled",
            **file_facts({SERVE: SERVE_UNIT, SERVER: SERVER_SOURCE}),
        }
    )
    assert run_op(weights.blobs_served, "192.168.100.10", 60991, MODELS, host=running) == []
    # A new server alone: uploaded, and the running one restarted to serve with it.
    older = FakeHost(
        {
            weights.ServeState: "ActiveState=active\nUnitFileState=enabled",
            **file_facts({SERVE: SERVE_UNIT, SERVER: "an older server"}),
        }
    )
    commands = run_op(weights.blobs_served, "192.168.100.10", 60991, MODELS, host=older)
    assert SERVER in older.uploads and SERVE not in older.uploads
    assert commands[-1] == "systemctl restart spark-weights-serve.service"
