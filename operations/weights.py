"""A model's weights on a box: fetched in the background by a unit the deploy starts and does not
wait for (``fetched``), from the hub or from another box of the fleet that serves its cache over
the fabric (``blobs_served``), each file checked against the hub's hash; room checked first
(``room_for``).

A cluster lane loads its share of the weights on every box from that box's disk (issue 14): its
model comes the same way, the head fetching it from the hub and the workers copying it from the
head. A model of hundreds of GB fetched from the internet by every box costs hours each; over
the fabric it is a copy (issue 13: 175 Gb/s and more between two Sparks).
"""

from __future__ import annotations

import fnmatch
import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import util
from operations.asked import Question, answer, question
from operations.preflight import ModelWeights
from spark.box_paths import fetch_unit, hf_cache_dir

FETCH_SOURCE = Path(__file__).parents[1] / "files" / "spark_fetch.py"
FETCH_SCRIPT = "/usr/local/lib/spark/spark_fetch.py"
SERVE_SOURCE = Path(__file__).parents[1] / "files" / "spark_serve.py"
SERVE_SCRIPT = "/usr/local/lib/spark/spark_serve.py"
FETCH_STATUS_DIR = "/var/lib/spark/fetch"  # each fetch's status file (spark_fetch.py --status)
UNIT_DIR = "/etc/systemd/system"

# --- a model fetched in the background -----------------------------------------------------------


def status_path(model: str) -> str:
    """Where the fetcher keeps its status (spark_fetch.py --status), which the deploy reads."""
    return f"{FETCH_STATUS_DIR}/{model.replace('/', '--')}.json"


def fetch_arguments(
    model: str,
    files: tuple[str, ...],
    models_dir: str,
    endpoint: str,
    token_path: str | None,
    source: str | None = None,
) -> str:
    """spark_fetch.py's command line for the unit (the token's path, never the token)."""
    words = [model, *files, "--cache", models_dir, "--endpoint", endpoint]
    words += ["--status", status_path(model)]
    if token_path:
        words += ["--token-file", token_path]
    if source:
        words += ["--source", source]
    return " ".join(shlex.quote(word) for word in words)


class FetchState(FactBase):
    """A model's fetch on this box: its unit's state, the hub's total (the fetcher's status
    file) and the bytes in the cache's blobs now, whole or begun (their sizes, read here).

    .. code:: python

        {"active": "activating", "total": 42949672960, "done": 10737418240, "rate": 52000000,
         "state": "fetching"}
    """

    def command(self, model: str, models_dir: str) -> str:
        blobs = shlex.quote(f"{hf_cache_dir(models_dir, model)}/blobs")
        return (
            f"systemctl show -p ActiveState --value {shlex.quote(fetch_unit(model))}"
            " 2>/dev/null || echo inactive;"
            f" cat {shlex.quote(status_path(model))} 2>/dev/null; echo;"
            f" find {blobs} -maxdepth 1 -type f -printf '%s\\n' 2>/dev/null"
            " | awk '{s += $1} END {print \"bytes\", s + 0}'"
        )

    def process(self, output: list[str]) -> dict[str, object]:
        found: dict[str, object] = {"active": output[0].strip() if output else "inactive"}
        for line in output[1:]:
            if line.startswith("{"):
                status = json.loads(line)
                found |= {key: status.get(key) for key in ("total", "rate", "state")}
            elif line.startswith("bytes "):
                found["done"] = int(line.split()[1])
        return found


def progress(model: str, fetch: dict[str, object]) -> str:
    """``model``: bytes done of the hub's total and the rate, as a deploy reports them."""
    done, rate = int(str(fetch.get("done") or 0)), int(str(fetch.get("rate") or 0))
    total = int(str(fetch.get("total") or 0))
    if not total:
        return f"{model}: {done / 1e9:.1f} GB so far (the hub's total not read yet)"
    return (
        f"{model}: {done / 1e9:.1f} of {total / 1e9:.1f} GB ({100 * done / total:.0f}%),"
        f" {rate / 1e6:.0f} MB/s"
    )


@operation()
def fetched(
    model: str,
    files: tuple[str, ...],
    models_dir: str,
    endpoint: str,
    token_path: str | None,
    source: str | None = None,
):
    """
    Fetch ``model`` into this box's cache in the background: the unit spark-fetch-<org>--<name>
    (files/spark_fetch.py: resumable, every file checked against the hub's hash, progress in
    its journal), started without waiting; a lane ordered after it starts once it lands. While
    it runs, a deploy reports its progress and changes nothing about it.

    + model: a Hugging Face id (``org/name``)
    + files: only these files of it (a llama.cpp lane's GGUF parts); (): every file
    + models_dir: the Hugging Face cache on the box the lanes mount
    + endpoint: the hub (huggingface_hub's HF_ENDPOINT; https://huggingface.co)
    + token_path: the box's token file (root 0600), read by the fetcher; None: none
    + source: another box's blobs of it over the fabric (``blobs_served``), the files copied from
      there as it gets them, checked against the hub's hashes; None: from the hub
    """
    unit = fetch_unit(model)
    found = util.on_box(FETCH_SCRIPT, f"{UNIT_DIR}/{unit}")
    fetch = answer(FetchState, model=model, models_dir=models_dir)
    if answer(ModelWeights, model=model, models_dir=models_dir, files=files):
        host.noop(f"{model} is on this box")
        return
    if fetch["active"] in ("activating", "deactivating"):
        # Shown without -v (a noop's words are not): the deploy's report of the fetch.
        host.log(f"{progress(model, fetch)}: fetching ({unit}; journalctl -u {unit})")
        return
    yield from util.put(str(FETCH_SOURCE), FETCH_SCRIPT, "755", found)
    arguments = fetch_arguments(model, files, models_dir, endpoint, token_path, source)
    unit_changes = util.template(
        "spark-fetch.service.j2",
        f"{UNIT_DIR}/{unit}",
        found=found,
        model=model,
        models_dir=models_dir,
        source=source,
        unit=unit,
        script=FETCH_SCRIPT,
        arguments=arguments,
    )
    yield from unit_changes
    yield f"install -d -m 755 {FETCH_STATUS_DIR}"
    if unit_changes:
        yield "systemctl daemon-reload"
    # Enabled: a box rebooted half way goes on fetching at boot. restart: a oneshot that landed
    # before stays active (RemainAfterExit) and a start would not run it again. --no-block: the
    # deploy goes on; the unit's journal and the next deploy show its progress.
    yield (
        f"systemctl enable {unit} && systemctl reset-failed {unit} 2>/dev/null;"
        f" systemctl restart --no-block {unit}"
    )
    host.log(f"{progress(model, fetch)}: fetch started ({unit}; journalctl -u {unit})")


def fetch_questions(model: str, models_dir: str, files: tuple[str, ...]) -> list[Question]:
    """What ``fetched`` reads (operations/asked.py)."""
    return [
        question(util.RootFiles, paths=(FETCH_SCRIPT, f"{UNIT_DIR}/{fetch_unit(model)}")),
        question(ModelWeights, model=model, models_dir=models_dir, files=files),
        question(FetchState, model=model, models_dir=models_dir),
    ]


# --- room for a model, checked before it is fetched ----------------------------------------------


class CacheRoom(FactBase):
    """The bytes free where the cache is (``df``, of the cache or the directory that will hold
    it), and the bytes each model in it takes (``du``, its repository's blobs).

    .. code:: python

        {"free": 107374182400, "models": {"org/name": 42949672960}}
    """

    def command(self, models_dir: str) -> str:
        hub = shlex.quote(f"{models_dir}/hub")
        return (
            f'd={hub}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done;'
            ' echo "free $(df -B1 --output=avail "$d" | tail -n 1)";'
            f' for r in {hub}/models--*; do [ -d "$r" ] &&'
            ' echo "model ${r##*/models--} $(du -sb "$r" | cut -f1)"; done; true'
        )

    def process(self, output: list[str]) -> dict[str, object]:
        free, models = 0, {}
        for line in output:
            words = line.split()
            if words[:1] == ["free"] and len(words) == 2:
                free = int(words[1])
            elif words[:1] == ["model"] and len(words) == 3:
                models[words[1].replace("--", "/", 1)] = int(words[2])
        return {"free": free, "models": models}


def gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB"


class HubListing(FactBase):
    """Each file's size in the hub's listing of ``model`` at ``main``, read on the box (the hub
    it fetches from), the token from its root-only file on curl's stdin, never in argv; {} when
    the hub does not answer. The listing: huggingface_hub hf_api.py ``model_info`` (GET
    {endpoint}/api/models/{repo_id}/revision/{revision}; ``files_metadata`` asks ``blobs=true``,
    giving each sibling its ``size``), as files/spark_fetch.py reads it.

    .. code:: python

        {"config.json": 1234, "model-00001-of-00002.safetensors": 4994967296}
    """

    def command(self, model: str, endpoint: str, token_path: str | None) -> str:
        url = shlex.quote(f"{endpoint.rstrip('/')}/api/models/{model}/revision/main?blobs=true")
        # curl reads `-H @-`'s headers from stdin (curl's manual, -H); printf is the shell's own.
        token = shlex.quote(token_path or "")
        header = f"[ -r {token} ] && printf 'Authorization: Bearer %s\\n' \"$(cat {token})\";"
        return f"{{ {header} true; }} | curl -sSf --max-time 20 -H @- {url} 2>/dev/null; echo"

    def process(self, output: list[str]) -> dict[str, int]:
        try:
            info = json.loads("".join(output))
        except ValueError:
            return {}
        siblings = info.get("siblings", []) if isinstance(info, dict) else []
        return {s["rfilename"]: s["size"] for s in siblings if s.get("size") is not None}


def listed_bytes(listing: dict[str, int], files: tuple[str, ...]) -> int:
    """The bytes of the files fetched (``files``' patterns, as spark_fetch.py picks them; ():
    every file) in the hub's listing."""
    return sum(
        size
        for name, size in listing.items()
        if not files or any(fnmatch.fnmatchcase(name, pattern) for pattern in files)
    )


@operation()
def room_for(
    model: str,
    files: tuple[str, ...],
    endpoint: str,
    token_path: str | None,
    catalog_bytes: int,
    models_dir: str,
    in_use: list[str],
):
    """
    Stop this box before ``model`` is fetched where its disk lacks the room: what the model
    still needs (its size less what of it is already in the cache) against the bytes free,
    naming both and the biggest models in the cache no lane of the box uses, which it could
    remove. This changes nothing.

    + model: a Hugging Face id
    + files: only these files of it (a llama.cpp lane's GGUF parts); (): every file
    + endpoint: the hub, whose listing gives the model's size (read on the box)
    + token_path: the box's token file (root 0600); None: none
    + catalog_bytes: the catalog's size of its weights, where the hub does not answer
    + models_dir: the Hugging Face cache on the box the lanes mount
    + in_use: the models the box's lanes serve (never offered for removal)
    """
    if answer(ModelWeights, model=model, models_dir=models_dir, files=files):
        host.noop(f"{model} is on this box")
        return
    listing = answer(HubListing, model=model, endpoint=endpoint, token_path=token_path)
    needs = listed_bytes(listing, files) if listing else catalog_bytes
    told = "the hub's listing" if listing else "the catalog's size, the hub not answering"
    room = answer(CacheRoom, models_dir=models_dir)
    cached: dict[str, int] = room["models"]
    still = max(needs - cached.get(model, 0), 0)
    free: int = room["free"]
    if still <= free:
        host.noop(f"{model}: {gb(still)} still to fetch ({told}), {gb(free)} free")
        return
    unused = sorted(
        ((size, name) for name, size in cached.items() if name not in in_use), reverse=True
    )
    removable = ", ".join(
        f"{name} ({gb(size)}: {hf_cache_dir(models_dir, name)})" for size, name in unused[:3]
    )
    yield from util.refused(
        f"{host.name}: no room for {model}: it needs {gb(still)} more ({told}), {models_dir}"
        f" has {gb(free)} free; "
        + (
            f"models no lane of this box uses, biggest first: {removable}"
            if removable
            else "no model in the cache is unused: free space elsewhere on that disk"
        )
    )


@operation()
def models_pruned(models_dir: str, in_use: list[str]):
    """
    Remove the models in the cache no lane of the box uses any more (prune_unused), saying each
    with its size; a fetch of one still running is stopped and disabled first (enabled, it
    would start again at boot).

    + models_dir: the Hugging Face cache on the box the lanes mount
    + in_use: the models the box's lanes serve (kept)
    """
    cached: dict[str, int] = answer(CacheRoom, models_dir=models_dir)["models"]
    unused = {name: size for name, size in sorted(cached.items()) if name not in in_use}
    if not unused:
        host.noop("no cached model is unused")
        return
    for name, size in unused.items():
        host.log(f"{name}: removed ({gb(size)}, no lane of this box uses it)")
        yield (
            f"systemctl disable --now {shlex.quote(fetch_unit(name))} 2>/dev/null;"
            f" rm -rf {shlex.quote(hf_cache_dir(models_dir, name))}"
        )


def room_questions(models_dir: str) -> list[Question]:
    """What ``room_for`` reads ahead (operations/asked.py): the hub is asked later, only for a
    model not on the box."""
    return [question(CacheRoom, models_dir=models_dir)]


SERVE_UNIT = "spark-weights-serve.service"


@operation()
def blobs_served(address: str, port: int, models_dir: str):
    """
    Serve this box's Hugging Face cache read-only on its fabric ``address``, to the boxes that
    copy a model from it (fleet_copy_weights): the unit spark-weights-serve, python3's
    http.server with sendfile and ranges (files/spark_serve.py) as an unprivileged dynamic
    user, restarted always, enabled; restarted when the server or its unit changes.

    + address: this box's first fabric address (the others reach it there alone)
    + port: WEIGHTS_PORT
    + models_dir: the Hugging Face cache the lanes mount (its hub/ directory is served)
    """
    path = f"{UNIT_DIR}/{SERVE_UNIT}"
    found = util.on_box(SERVE_SCRIPT, path)
    server = util.put(str(SERVE_SOURCE), SERVE_SCRIPT, "644", found)  # run by python3
    yield from server
    changes = util.template(
        "spark-weights-serve.service.j2",
        path,
        found=found,
        script=SERVE_SCRIPT,
        address=address,
        port=port,
        directory=f"{models_dir}/hub",
    )
    yield from changes
    state = answer(ServeState)
    yield from util.unit_started(
        SERVE_UNIT,
        unit_changed=bool(changes),
        enabled=state.get("UnitFileState"),
        running=state.get("ActiveState") == "active",
        changed=bool(changes or server),
    )


class ServeState(FactBase):
    """spark-weights-serve's ActiveState and UnitFileState (`systemctl show`).

    .. code:: python

        {"ActiveState": "active", "UnitFileState": "enabled"}
    """

    default = dict

    def command(self) -> str:
        return f"systemctl show -p ActiveState,UnitFileState {SERVE_UNIT} 2>/dev/null; true"

    def process(self, output: list[str]) -> dict[str, str]:
        return dict(line.split("=", 1) for line in output if "=" in line)


def serve_questions() -> list[Question]:
    """What ``blobs_served`` reads (operations/asked.py)."""
    return [
        question(util.RootFiles, paths=(SERVE_SCRIPT, f"{UNIT_DIR}/{SERVE_UNIT}")),
        question(ServeState),
    ]
