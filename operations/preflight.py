"""Check, before the cluster relies on it, that the fabric joins the boxes."""

from __future__ import annotations

import shlex
from collections import defaultdict

from pyinfra import host, logger, state
from pyinfra.api import FactBase, operation
from pyinfra.api.host import Host

from operations import util
from operations.asked import Question, answer, question
from spark import twin
from spark.box_paths import HF_CACHE_IN_CONTAINER, hf_cache_dir

IP_ICMP_HEADERS = 28  # a ping's payload is the MTU less the IPv4 (20) and ICMP (8) headers
WAIT_SECONDS = 10  # a profile brought up moments before may still be resolving its peer

Peer = tuple[str, str, str]  # (twin, the other box's name, its address on that twin)


def _ping(ifname: str, address: str, size: int) -> str:
    # -M do: never fragment, so a hop with a smaller MTU drops the frame instead of hiding.
    return (
        f"ping -q -n -c 1 -W 1 -M do -s {size} -I {shlex.quote(ifname)} {shlex.quote(address)}"
        " >/dev/null 2>&1"
    )


class FabricPeers(FactBase):
    """For each (twin, address): whether one unfragmented ping of ``size`` bytes answered.

    A twin without an IPv4 address of its own (a box before its fabric profiles are up) is
    answered "no" without a ping: ping would send from another interface's address (iputils
    warns "source address might be selected on device other than"), the answer would not come
    back on the twin, and ping waits out its -W second. The pings run side by side, so a run
    of silent peers waits about one second, not one each.

    .. code:: python

        {("enp1s0f1np1", "192.168.100.11"): True, ("enP2p1s0f1np1", "192.168.101.11"): False}
    """

    default = dict

    def command(self, pairs: tuple[tuple[str, str], ...], size: int) -> str:
        checks = [
            f'{{ if [ -n "$(ip -4 -o address show dev {shlex.quote(ifname)} 2>/dev/null)" ]'
            f" && {_ping(ifname, address, size)}; then a=yes; else a=no; fi;"
            f" printf '%s %s %s\\n' \"$a\" {shlex.quote(ifname)} {shlex.quote(address)}; }} &"
            for ifname, address in pairs
        ]
        return f"{{ {' '.join(checks)} wait; }} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[tuple[str, str], bool]:
        answers = {}
        for line in output:
            answered, ifname, address = line.split()
            answers[(ifname, address)] = answered == "yes"
        return answers


class LinkSpeeds(FactBase):
    """Each interface's link rate in Mb/s as the kernel reports it (spark/twin.py: rate_file,
    read as compliance and the collector read it): -1 where it reports none (no carrier: the
    file fails or reads -1); an interface that does not exist is left out (a QSFP port with no
    cable shows none: dgx-spark-playbooks connect-three-sparks, ibdev2netdev).

    .. code:: python

        {"enp1s0f1np1": 200000, "enP2p1s0f1np1": 100000, "enp1s0f0np0": -1}
    """

    default = dict

    def command(self, ifnames: tuple[str, ...]) -> str:
        reads = " ".join(
            f"if [ -e {shlex.quote(f'{twin.SYS}/{twin.NET}/{ifname}')} ]; then"
            f' printf "%s %s\\n" {shlex.quote(ifname)}'
            f' "$(cat {shlex.quote(twin.rate_file(ifname))} 2>/dev/null)"; fi;'
            for ifname in ifnames
        )
        return f"{{ {reads} }} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, int]:
        speeds = {}
        for line in output:
            ifname, _, speed = line.partition(" ")
            speeds[ifname] = twin.rate(speed)
        return speeds


class Ipv4Addresses(FactBase):
    """The IPv4 addresses of an interface, without their prefixes (none: no such interface).

    .. code:: python

        ["10.0.0.21"]
    """

    default = list

    def command(self, ifname: str) -> str:
        return f"ip -4 -o address show dev {shlex.quote(ifname)} 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        # "2: enP7s7    inet 10.0.0.21/24 brd 10.0.0.255 scope global enP7s7 ..." (iproute2)
        return [line.split()[3].split("/")[0] for line in output if len(line.split()) > 3]


@operation()
def management_address(ifname: str, address: str):
    """
    Check that the box has the inventory's management address on its management interface, where
    a ring's rendezvous (MASTER_ADDR, the head's) and sockets reach it.

    + ifname: the management interface (management_ifname)
    + address: the IPv4 address the inventory gives for it (management_address)

    This changes nothing; it fails the box naming what the interface has.

    **Example:**

    .. code:: python

        preflight.management_address(
            name="Management address", ifname="enP7s7", address="10.0.0.21"
        )
    """
    found = answer(Ipv4Addresses, ifname=ifname)
    if address not in found:
        yield from util.refused(
            f"{host.name}: management_address: {address} is not on {ifname}, which has"
            f" {', '.join(found) or 'no IPv4 address'}; give the box's address there (a ring's"
            " rendezvous and sockets use it)"
        )
        return
    host.noop(f"{address} is on {ifname}")
    yield from ()  # a check: it changes nothing, but pyinfra runs operations as generators


# Why a twin links below its rate, as the field saw it (the inventory's fabric_link_speed_mbps
# says more in group_data/all.py).
SLOW_CAUSES = (
    "a switch port with auto-negotiation on (force the port to 200G), a degraded ConnectX start"
    " (dgx-spark-playbooks PR#108: reboot the box), or the cable (reseat or replace it)"
)


@operation()
def fabric_ports_cabled(twins: list[tuple[str, int | None]]):
    """
    Check that every twin the topology uses exists: a port whose twins do not has no cable (its
    ConnectX functions appear only once one is plugged in) or no ConnectX.

    + twins: (interface, its QSFP port) for each twin the box uses

    This changes nothing; it fails the box naming the port, before its profiles are made.

    **Example:**

    .. code:: python

        preflight.fabric_ports_cabled(
            name="Fabric ports cabled", twins=[("enp1s0f1np1", 1), ("enP2p1s0f1np1", 1)]
        )
    """
    speeds = answer(LinkSpeeds, ifnames=tuple(ifname for ifname, _ in twins))
    missing = defaultdict(list)
    for ifname, port in twins:
        if ifname not in speeds:
            missing[port].append(ifname)
    if missing:
        yield from util.refused(
            "; ".join(
                f"{host.name}: no cable on port {port} (or its ConnectX missing):"
                f" {' and '.join(ifnames)} do not exist; a port shows its interfaces only once"
                " a cable is plugged in (`ip -br link`, `ls /sys/class/infiniband`)"
                for port, ifnames in missing.items()
            )
        )
        return
    host.noop(f"every twin is there ({', '.join(ifname for ifname, _ in twins)})")
    yield from ()  # a check: it changes nothing, but pyinfra runs operations as generators


def _slow(ifname: str, speed: int | str, expected_mbps: int) -> str:
    return (
        f"{host.name}: fabric twin {ifname} links at {speed} Mb/s, below the {expected_mbps}"
        " expected"
    )


def _rate_command(ifnames: list[str], expected_mbps: int, low: str) -> str:
    """Wait up to WAIT_SECONDS for each twin to report a rate (a link NetworkManager brought up
    moments before may not have one yet), then say which is below ``expected_mbps`` or has
    none; exit 1 then, unless ``low`` is "warn"."""
    parts = ["failed=0"]
    for ifname in ifnames:
        speed = shlex.quote(twin.rate_file(ifname))
        causes = f"; usual causes: {SLOW_CAUSES}"
        slow = shlex.quote(_slow(ifname, "%s", expected_mbps) + causes + "\\n")
        none = shlex.quote(
            f"{host.name}: fabric twin {ifname} reports no link rate after {WAIT_SECONDS} s"
            " (no link: check the cable at both ends and the other box)\\n"
        )
        parts.append(
            f'n=0; until s="$(cat {speed} 2>/dev/null)" && [ "${{s:--1}}" -ge 0 ] 2>/dev/null;'
            f" do n=$((n + 1)); if [ $n -ge {WAIT_SECONDS} ]; then s=none; break; fi; sleep 1;"
            f' done; if [ "$s" = none ]; then printf {none} >&2; failed=1;'
            f' elif [ "$s" -lt {expected_mbps} ]; then printf {slow} "$s" >&2; failed=1; fi'
        )
    parts.append('[ "$failed" = 0 ]' if twin.rate_severity(low) == "critical" else "true")
    return "; ".join(parts)


@operation()
def link_speeds(ifnames: list[str], expected_mbps: int, low: str = "refuse"):
    """
    Check that every twin links at its expected rate (/sys/class/net/IF/speed).

    + ifnames: the twins the box uses, each present (``fabric_ports_cabled``)
    + expected_mbps: the rate each must report (200000)
    + low: "refuse" fails the box on a slower or linkless twin, "warn" logs it and goes on

    This changes nothing. A twin reporting a rate below ``expected_mbps`` is named at once
    with the field's usual causes; one reporting none yet (no link before its profile is up)
    gets a command that waits up to WAIT_SECONDS (10) for one, then checks it (in "warn" mode
    its message goes to the command's stderr and the box goes on).

    **Example:**

    .. code:: python

        preflight.link_speeds(
            name="Fabric twins link at 200 Gb/s",
            ifnames=["enp1s0f1np1", "enP2p1s0f1np1"],
            expected_mbps=200000,
        )
    """
    speeds = answer(LinkSpeeds, ifnames=tuple(ifnames))
    slow = [
        _slow(ifname, speeds[ifname], expected_mbps)
        for ifname in ifnames
        if twin.rate_below(speeds.get(ifname, twin.NO_RATE), expected_mbps)
    ]
    if slow:
        message = "; ".join(slow) + f"; usual causes: {SLOW_CAUSES}"
        if twin.rate_severity(low) == "critical":
            yield from util.refused(f"{message} (fabric_link_speed_low = 'warn' lets it go on)")
            return
        logger.warning(message)
    unknown = [ifname for ifname in ifnames if speeds.get(ifname, -1) < 0]
    if unknown:
        yield _rate_command(unknown, expected_mbps, low)
    elif slow:
        host.noop("a twin links below its rate (fabric_link_speed_low = 'warn'): going on")
    else:
        host.noop(f"every twin links at {expected_mbps} Mb/s or more")


def _check_command(silent: list[Peer], mtu: int) -> str:
    """Ping each silent peer for up to WAIT_SECONDS; for any still silent, say which box, twin
    and peer, what the link looks like, and what to check, this box's own twin first (its live
    MTU below ``mtu`` is its own fault, not the peer's); exit 1 then."""
    size = mtu - IP_ICMP_HEADERS
    parts = ["failed=0"]
    for ifname, name, address in silent:
        quoted = shlex.quote(ifname)
        lead = f"{host.name}: fabric twin {ifname} gets no answer from {name} ({address} on its"
        lead += f" {ifname}) to {mtu}-byte unfragmented pings"
        no_link = (
            f"; {ifname} has no link: check the QSFP-DD cable at both ends (the same port on"
            f" both boxes) and that {name} is powered on"
        )
        small_only = (
            f"; smaller pings do get through: a hop below MTU {mtu}; check"
            f" `cat /sys/class/net/{ifname}/mtu` on {name} (and on any switch between)"
        )
        own_mtu = (
            f"; this box's own {ifname} is at MTU %s, not {mtu} (set by hand? the deploy"
            f" re-applies its profile: run it again, or `nmcli connection up fabric-{ifname}`)"
        )
        silent_link = (
            f"; {ifname} has link but nothing answers: check on {name} that {ifname} is up"
            f" with {address} (`ip -br address show {ifname}`), and the cable's port"
        )
        parts.append(
            f"n=0; until {_ping(ifname, address, size)}; do n=$((n + 1));"
            f" if [ $n -ge {WAIT_SECONDS} ]; then"
            f' if [ "$(cat /sys/class/net/{quoted}/carrier 2>/dev/null)" != 1 ];'
            f" then hint={shlex.quote(no_link)};"
            f' elif own="$(cat {shlex.quote(twin.mtu_file(ifname))} 2>/dev/null)";'
            f' [ "$own" != {mtu} ]; then hint="$(printf {shlex.quote(own_mtu)} "$own")";'
            f" elif {_ping(ifname, address, 56)}; then hint={shlex.quote(small_only)};"
            f" else hint={shlex.quote(silent_link)}; fi;"
            f" printf '%s%s\\n' {shlex.quote(lead)} \"$hint\" >&2; failed=1; break; fi;"
            " sleep 1; done"
        )
    parts.append('[ "$failed" = 0 ]')
    return "; ".join(parts)


@operation()
def fabric_peers(peers: list[Peer], mtu: int):
    """
    Check that each twin reaches the same twin of every other box with full-size frames.

    + peers: (twin, other box, its address on that twin), as the plan lists them
      (spark/plan.py peers)
    + mtu: the fabric MTU; each ping carries ``mtu`` - 28 bytes, unfragmented, so a link or
      hop with a smaller MTU fails here instead of stalling NCCL later

    This changes nothing. A cut or miswired twin does not stop the boxes from configuring it
    (NetworkManager brings a static profile up without a peer; the GID entries follow the
    address): this is where it shows. A peer that answers is done; one that does not gets a
    command that pings it for up to WAIT_SECONDS (10) and then fails the box, naming it, the
    twin, the peer, and what to check (no link: the cable; small pings only: an MTU on the way;
    link but silence: the peer's address). Boxes pyinfra has failed in this run (it could not
    reach them, or they stopped on an error) are left out: pyinfra names them itself, and the
    other boxes go on with what does not need them.

    **Example:**

    .. code:: python

        preflight.fabric_peers(
            name="Fabric twins reach the other boxes",
            peers=[("enp1s0f1np1", "spark-2", "192.168.100.11")],
            mtu=9000,
        )
    """
    if not peers:
        host.noop("no other box in the inventory: no fabric peer to reach")
        return
    failed = {failed_host.name for failed_host in state.failed_hosts}
    left_out = sorted({name for _ifname, name, _address in peers if name in failed})
    checked = [peer for peer in peers if peer[1] not in failed]
    pairs = peer_pairs(checked)
    answers = answer(FabricPeers, pairs=pairs, size=mtu - IP_ICMP_HEADERS) if pairs else {}
    silent = [peer for peer in checked if not answers.get((peer[0], peer[2]))]
    if silent:
        yield _check_command(silent, mtu)
        return
    skipped = f" ({', '.join(left_out)} failed in this run: not checked)" if left_out else ""
    host.noop(f"every twin reaches its peers with {mtu}-byte frames{skipped}")


@operation()
def cluster_whole(members: list[str]):
    """
    Say, before the cluster stage, which boxes of the cluster stopped in this run and where.

    + members: every box of the cluster, as the inventory names them

    pyinfra leaves out a box it could not reach, or that stopped on a problem of its own, and
    goes on with the others. This box goes on too, with what does not need the missing boxes
    (its firewall, a Ray head, a worker whose head is here); each cluster operation that needs
    one stops this box there, saying which box it waits for (``util.missing``). Once they are
    back, the next run finishes the stage. This changes nothing.

    **Example:**

    .. code:: python

        preflight.cluster_whole(name="Every box of the cluster", members=["spark-1", "spark-2"])
    """
    stopped = util.missing(members)
    if not stopped:
        host.noop(f"every box of the cluster is in this run ({', '.join(members)})")
    else:
        host.noop(f"the cluster goes on without {', '.join(stopped)}: {util.waits_for(stopped)}")
    yield from ()  # a check: it changes nothing, but pyinfra runs operations as generators


# --- a cluster lane: the same image and the model's weights on every box ----------------------


class ModelWeights(FactBase):
    """Whether the box holds a model: a Hugging Face id as a snapshot with its config.json in
    the cache the lanes mount (a llama.cpp lane's: every part of its GGUF file in the snapshot
    refs/main names, the one the lane loads), an absolute path as a directory with its
    config.json.

    .. code:: python

        True
    """

    def command(self, model: str, models_dir: str, files: tuple[str, ...] = ()) -> str:
        if files:
            repo = shlex.quote(hf_cache_dir(models_dir, model))
            tests = " && ".join(f'[ -s "$d"/{shlex.quote(name)} ]' for name in files)
            snapshot = f'd={repo}/snapshots/"$(cat {repo}/refs/main 2>/dev/null)"'
            return f"{snapshot}; {tests} && echo present; true"
        if model.startswith("/"):
            pattern = f"{shlex.quote(model)}/config.json"
        else:
            pattern = f"{shlex.quote(hf_cache_dir(models_dir, model))}/snapshots/*/config.json"
        return f'for f in {pattern}; do [ -s "$f" ] && echo present && break; done; true'

    def process(self, output: list[str]) -> bool:
        return "present" in output


def fetch_command(
    model: str, image: str, models_dir: str, token_path: str | None, files: tuple[str, ...] = ()
) -> str:
    """The command that fetches a model (only ``files`` of it, if given: a GGUF's parts) into a
    box's cache inside a vLLM serving image (huggingface_hub's `hf`), its token (if any) mounted
    as a file and named by HF_TOKEN_PATH (never in an argv or an environment value)."""
    token = "/run/secrets/hf-token"
    # Without a token file nothing is mounted: docker would make a directory of a missing path.
    mount = (
        f" -v {shlex.quote(token_path)}:{token}:ro -e HF_TOKEN_PATH={token}" if token_path else ""
    )
    return (
        f"sudo docker run --rm -v {shlex.quote(models_dir)}:{HF_CACHE_IN_CONTAINER}{mount}"
        f" {shlex.quote(image)} hf download {shlex.quote(model)}"
        + "".join(f" {shlex.quote(name)}" for name in files)
    )


@operation()
def model_present(
    model: str,
    image: str,
    models_dir: str,
    token_path: str | None,
    files: tuple[str, ...] = (),
):
    """
    Check that this box holds a lane's model before the lane starts (without fetch_weights: with
    it, a unit fetches a missing one in the background, ``weights.fetched``): a download inside
    the lane's start window would be cut by its start timeout and start over (a ~120 GB model
    takes hours). A cluster lane's model is checked on every box before any starts it: every
    rank loads its share of the weights from its own box.

    + model: a Hugging Face id or an absolute path
    + image: a vLLM serving image (it has huggingface_hub's `hf` client), for the command shown
    + models_dir: the Hugging Face cache on the box the lanes mount
    + token_path: the box's Hugging Face token file (root 0600), for gated models; None: none
    + files: only these files of the repository (a llama.cpp lane's GGUF, every part of it)

    A missing one stops the box with the command that fetches it; an absolute path is never
    fetched: without its config.json the box stops, to copy it there.
    """
    if answer(ModelWeights, model=model, models_dir=models_dir, files=files):
        host.noop(f"{model} is on this box")
        return
    if model.startswith("/"):
        yield from util.refused(f"{host.name}: {model} has no config.json; copy the model there")
        return
    command = fetch_command(model, image, models_dir, token_path, files)
    yield from util.refused(
        f"{host.name}: {model} is not on this box ({hf_cache_dir(models_dir, model)}); a lane"
        f" loads it from the box's disk and downloads nothing: fetch it first on {host.name}"
        f" (or set fetch_weights = True): {command}"
    )


class ImageLayers(FactBase):
    """The SHA-256 of an image's layer list (its content, as docker hashes each layer): equal
    on two boxes when they hold the same image, whatever its local id (which differs between a
    pull and an import). None when the box lacks the image.

    .. code:: python

        "0b3c9f..."
    """

    def command(self, image: str) -> str:
        return (
            f"docker image inspect --format '{{{{json .RootFS.Layers}}}}' {shlex.quote(image)}"
            # docker 20.10 prints an empty line for an image it lacks (the lab's docker).
            " 2>/dev/null | grep . | sha256sum | cut -d' ' -f1; true"
        )

    def process(self, output: list[str]) -> str | None:
        digest = output[0].strip() if output else ""
        # sha256sum of nothing: docker inspect found no image.
        empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        return None if digest in ("", empty) else digest


def boxes_in_run(boxes: list[str]) -> dict[str, Host]:
    """The hosts of ``boxes`` this run has (connected, not failed), by name, this one's
    included: an operation on one box reads another's facts through its host, which runs the
    fact's command there when asked (pyinfra 3.10 api/facts.py, whatever the run mode). A box
    left out (``--limit``) is never connected, and pyinfra would connect to it to read it: it
    is left out here, never contacted."""
    return {box.name: box for box in state.inventory.get_active_hosts() if box.name in boxes}


@operation()
def image_agrees(image: str, boxes: list[str]):
    """
    Refuse this box when its ``image`` differs from another box's: the ranks of a cluster lane
    must run one vLLM, one NCCL, one Ray. Refuse it too when another box of the cluster has
    failed in this run (a missing model, say): the cluster lane, which starts next on the head,
    needs every box. Each box reads the others' images itself (changes nothing); a box left
    out of the run (``--limit``) is not compared.

    + image: the serving image of the cluster lane
    + boxes: every box of the cluster
    """
    if stopped := util.missing(boxes):
        yield from util.refused(
            f"{host.name}: the cluster lane needs every box: it {util.waits_for(stopped)};"
            " nothing of the cluster lane starts until it passes"
        )
        return
    mine = answer(ImageLayers, image=image)
    if mine is None:
        yield from util.refused(f"{host.name}: {image} is not on this box; pull it first")
        return
    in_run = boxes_in_run(boxes)
    # A box of the run without the image stops at its own check (above, there).
    seen = {
        box: answer(ImageLayers, of=other, image=image)
        for box, other in in_run.items()
        if box != host.name
    }
    others = [box for box in boxes if seen.get(box) not in (None, mine)]
    if others:
        yield from util.refused(
            f"{host.name}: {image} differs from {', '.join(others)}'s (other layers): the same"
            f" tag was pulled at different times; pull {image} again on every box (or pin it"
            " by digest, tag@sha256:...)"
        )
        return
    left_out = [box for box in boxes if box not in in_run]
    host.noop(
        f"{image} is the same as on the other boxes"
        + (f" in this run ({', '.join(left_out)} left out)" if left_out else "")
    )
    return
    yield  # an operation is a generator


def peer_pairs(peers: list[Peer]) -> tuple[tuple[str, str], ...]:
    """Each (twin, peer address) ``fabric_peers`` pings, once."""
    return tuple(dict.fromkeys((ifname, address) for ifname, _name, address in peers))


def fabric_questions(
    twins: list[str], ifnames: list[str], peers: list[Peer], mtu: int, management: str | None
) -> list[Question]:
    """What ``fabric_ports_cabled`` (its twins), ``link_speeds`` (its interfaces),
    ``fabric_peers`` (no box of the run failed) and ``management_address`` (its interface)
    read (operations/asked.py)."""
    pairs = peer_pairs(peers)
    return [
        question(LinkSpeeds, ifnames=tuple(twins)),
        question(LinkSpeeds, ifnames=tuple(ifnames)),
        *([question(FabricPeers, pairs=pairs, size=mtu - IP_ICMP_HEADERS)] if pairs else []),
        *([question(Ipv4Addresses, ifname=management)] if management else []),
    ]


def model_questions(model: str, models_dir: str, files: tuple[str, ...] | None) -> list[Question]:
    """What ``model_present`` reads (operations/asked.py)."""
    return [question(ModelWeights, model=model, models_dir=models_dir, files=files)]


def image_questions(image: str) -> list[Question]:
    """What ``image_agrees`` reads of this box (operations/asked.py)."""
    return [question(ImageLayers, image=image)]
