"""A cluster lane's weights fetched once: the head serves its copy of the model over the fabric
while the boxes that lack it copy it, each file checked against its hash.

A cluster lane loads its share of the weights on every box from that box's disk (issue 14). A
model of hundreds of GB fetched from the internet by every box costs hours each; over the fabric
it is a copy (issue 13: 175 Gb/s and more between two Sparks).
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations import util
from operations.asked import Question, answer, question
from operations.preflight import ModelWeights, boxes_in_run, fetch_command, hf_cache_dir

SHARE_UNIT = "spark-weights-share"
SHARE_DIR = "/run/spark/weights-share"  # the manifest, and `repo`: a link to the model's cache
COPY_COMMAND = "/usr/local/sbin/spark-weights-copy"
# In the kernel's ephemeral range, which the cluster's firewall admits from the fabric only
# (firewall.py); bound to the head's fabric address, so reached over the fabric alone.
SHARE_PORT = 60990
# How long the head serves at most: a copy of ~120 GB takes minutes over the fabric.
SHARE_SECONDS = 6 * 3600


def manifest_command(repo: str, path: str) -> str:
    """Shell writing the repository's manifest: each blob with its size, each snapshot file
    with the blob it links to, each ref with its revision."""
    return (
        f"cd {shlex.quote(repo)} && {{"
        ' for b in blobs/*; do [ -f "$b" ] && echo "blob ${b#blobs/} $(stat -c %s "$b")"; done;'
        " find snapshots -type l -printf 'link %p %l\\n';"
        ' for r in refs/*; do [ -f "$r" ] && echo "ref ${r#refs/} $(cat "$r")"; done;'
        f" }} > {path}"
    )


class Shared(FactBase):
    """Whether this box serves a model to the others (``shared`` left its directory in /run).

    .. code:: python

        True
    """

    def command(self) -> str:
        return f"[ -d {SHARE_DIR} ] && echo serving; true"

    def process(self, output: list[str]) -> bool:
        return "serving" in output


@operation()
def shared(model: str, models_dir: str, address: str, fetch: bool, boxes: list[str]):
    """
    Serve the head's copy of ``model`` on its fabric ``address`` while a box of the run lacks
    it (read on each box from here); nothing when none does, or without ``fetch`` (those boxes
    stop with the command that fetches it).

    + model: the cluster lane's Hugging Face id, on this box by now (``preflight.model_present``)
    + models_dir: the Hugging Face cache on the box the lanes mount
    + address: this box's first fabric address (the others copy from it)
    + fetch: fetch_weights: copy to the boxes that lack the model
    + boxes: every box of the cluster (those left out of the run are not asked)
    """
    lacking = [
        box
        for box, other in boxes_in_run(boxes).items()
        if box != host.name
        and not answer(ModelWeights, of=other, model=model, models_dir=models_dir)
    ]
    if not fetch or not lacking:
        host.noop(f"{model}: nothing to copy to another box")
        return
    repo = hf_cache_dir(models_dir, model)
    serve = (
        f"systemd-run --unit={SHARE_UNIT} --collect -p RuntimeMaxSec={SHARE_SECONDS}"
        f" python3 -m http.server {SHARE_PORT} --bind {address} --directory {SHARE_DIR}"
    )
    yield f"systemctl stop {SHARE_UNIT} 2>/dev/null; rm -rf {SHARE_DIR}"
    yield f"install -d -m 700 {SHARE_DIR} && ln -s {shlex.quote(repo)} {SHARE_DIR}/repo"
    yield manifest_command(repo, f"{SHARE_DIR}/manifest")
    yield serve
    # Listening within 30 s, or its journal says why not (the port taken, say).
    yield (
        f"for i in $(seq 150); do ss -ltnH 'sport = :{SHARE_PORT}' | grep -q . && exit 0;"
        f" sleep 0.2; done; journalctl -u {SHARE_UNIT} -n 20 --no-pager >&2; exit 1"
    )


@operation()
def copied(
    model: str,
    models_dir: str,
    image: str,
    token_path: str | None,
    head: str,
    address: str,
    fetch: bool,
):
    """
    Copy ``model`` from the head (served on its fabric ``address`` by ``shared``) where this box
    lacks it, every blob checked against its hash; without ``fetch`` stop instead, with the
    command that fetches it.

    + model: the cluster lane's Hugging Face id
    + models_dir: the Hugging Face cache on the box the lanes mount
    + image: the serving image (its `hf` client, for the command shown without ``fetch``)
    + token_path: the box's Hugging Face token file, for that command; None: none
    + head: the head's name (the box copied from)
    + address: the head's first fabric address
    + fetch: copy a missing model here (False: stop the box with the command)
    """
    if host.name == head or answer(ModelWeights, model=model, models_dir=models_dir):
        host.noop(f"{model} is on this box")
        return
    if not fetch:
        command = fetch_command(model, image, models_dir, token_path)
        yield from util.refused(
            f"{host.name}: {model} is not on this box ({hf_cache_dir(models_dir, model)}); a lane"
            " loads it from the box's disk and downloads nothing: copy it there, fetch it"
            f" (or set fetch_weights = True, which copies it from the head): {command}"
        )
        return
    if stopped := util.missing([head]):
        yield from util.refused(
            f"{host.name}: {model} is copied from the head: the copy {util.waits_for(stopped)}"
        )
        return
    if head not in boxes_in_run([head]):
        yield from util.refused(
            f"{host.name}: {model} is copied from {head}, which this run leaves out (--limit):"
            f" run the deploy with {head} too"
        )
        return
    yield from util.template("spark-weights-copy.j2", COPY_COMMAND, "755")
    repo = shlex.quote(hf_cache_dir(models_dir, model))
    yield f"{COPY_COMMAND} {address}:{SHARE_PORT} {repo}"


@operation()
def unshared():
    """
    Stop serving the model over the fabric where ``shared`` left it served (in this run, or in
    one cut off before this step).
    """
    if not answer(Shared):
        host.noop("nothing was served")
        return
    yield f"systemctl stop {SHARE_UNIT} 2>/dev/null; rm -rf {SHARE_DIR}; true"


def questions(model: str, models_dir: str, serves: bool) -> list[Question]:
    """What ``copied`` and, on the box that ``serves`` the model, ``shared`` read of this box
    (operations/asked.py)."""
    return [
        question(ModelWeights, model=model, models_dir=models_dir),
        *([question(Shared)] if serves else []),
    ]
