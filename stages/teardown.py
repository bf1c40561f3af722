"""Everything the deploy put on a box taken off it (teardown.py): its lanes and their units,
the front's and the metrics' sites, the firewall's table, the cluster's pieces (Ray, the NCCL
test, the weights' share), the memory guard, the environment files, the secrets. Left unless
asked: the driver and the container toolkit (their holds, pins and repository; the packages
stay installed), the fabric's NetworkManager profiles and the kernel's boot option, the models.
Left always: the packages the deploy installed (nginx, the node exporter, the toolkit),
/etc/default/prometheus-node-exporter (the package's own file, which the deploy rewrote), the
serving images, and the default nginx site the deploy removed."""

from __future__ import annotations

from typing import Any, NamedTuple

from pyinfra.api import deploy
from pyinfra.operations import files, server

from operations import (
    driver,
    environment,
    front,
    hygiene,
    kernel,
    lanes,
    metrics,
    nccl,
    ray,
    teardown,
    toolkit,
)
from spark import router
from spark.box_paths import MODELS_DIR
from spark.inventory import TEARDOWN_KEYS
from spark.plan import BoxPlan
from stages.fabric import profile_name

ETC = "/etc/spark"  # the secrets, lanes, TLS files, memguard, metrics, firewall and cluster.env
LIB = "/usr/local/lib/spark"  # the memory guard, the NCCL check, the metrics collector
# The copy script deploys wrote before a cluster lane's model came through its fetch unit (issue
# 29): still on the boxes they deployed.
OLD_COPY_COMMAND = "/usr/local/sbin/spark-weights-copy"
VAR = "/var/lib/spark"  # the models, the NCCL test's verdict, Ray's session and image check


class Options(NamedTuple):
    """What `--data` asks of the teardown (each false unless given)."""

    confirm: bool = False  # run with -y: the owner says yes beforehand
    driver: bool = False
    fabric: bool = False
    weights: bool = False


def options(data: dict[str, Any]) -> Options | str:
    """The teardown's options from a box's data; a message when one is not true or false."""
    given = {key: data[key] for key in TEARDOWN_KEYS if key in data}
    wrong = sorted(key for key, value in given.items() if not isinstance(value, bool))
    if wrong:
        return f"{', '.join(wrong)}: true or false (--data {wrong[0]}=true)"
    return Options(**{key.removeprefix("teardown_"): value for key, value in given.items()})


def paths(box: BoxPlan, chosen: Options) -> list[str]:
    """The files and directories teardown removes from ``box`` where they exist."""
    found = [
        box.environment.path,
        ETC,
        LIB,
        lanes.TURN_COMMAND,
        lanes.CANARY_COMMAND,
        lanes.BENCH_COMMAND,
        lanes.RANKS_COMMAND,
        nccl.COMMAND,
        ray.NODES_COMMAND,
        OLD_COPY_COMMAND,
        "/run/spark",  # the lanes' loading marks, an older deploy's weights share
        front.SITE,
        front.KEYS_DIR,
        metrics.SITE,
        metrics.KEY_MAP_DIR,
        metrics.OUT,
        environment.PROFILE_PATH,
        hygiene.LOGIND_DROPIN,
        # The router's cache: systemd keeps a DynamicUser's CacheDirectory under private/ with a
        # link to it (systemd.exec: DynamicUser=), and removes neither when the unit goes.
        *router.CACHE_DIRS,
    ]
    if chosen.weights:
        found.append(VAR)
    else:
        found += [nccl.RESULT_DIR, ray.SESSION_DIR, ray.RAY_CHECKED, router.ROUTER_DIR]
    if chosen.driver:
        found += [driver.PIN_PATH, kernel.HOLD_PIN, toolkit.LIST_PATH, toolkit.KEYRING]
    return found


def problem(box: str, chosen: Options | str, asked: bool) -> str:
    """Why the teardown of ``box`` may not go on ("" when it may): an option's wrong value, or
    a run that did not ask the owner (with -y) and was not confirmed."""
    if isinstance(chosen, str):
        return f"{box}: {chosen}"
    if not (asked or chosen.confirm):
        return (
            f"{box}: a teardown with -y needs --data teardown_confirm=true (or leave -y out:"
            " pyinfra then shows what would change on each box and asks)"
        )
    return ""


@deploy("Teardown")
def teardown_box(box: BoxPlan, chosen: Options | str, asked: bool) -> None:
    """Take off ``box`` what the deploy put there; ``asked``: pyinfra asked the owner (a run
    without -y), else only `--data teardown_confirm=true` lets it act."""
    teardown.allowed(name="Teardown asked for", problem=problem(box.name, chosen, asked))
    if isinstance(chosen, str):
        return
    teardown.removed(
        name=f"Lanes, units, containers, front, firewall, cluster, metrics, files ({MODELS_DIR}"
        f" {'removed' if chosen.weights else 'kept'})",
        paths=paths(box, chosen),
    )
    if chosen.driver:
        teardown.released(
            name="Driver and container toolkit holds released (the packages stay)",
            patterns=[*driver.DRIVER_FAMILY, *toolkit.PACKAGES],
        )
    if chosen.fabric:
        if box.fabric is not None:
            teardown.profiles_removed(
                name="Fabric profiles removed",
                names=[profile_name(link.ifname) for link in box.fabric.links],
            )
        dropin = files.file(
            name="Kernel boot option file removed", path=box.kernel.grub_dropin, present=False
        )
        server.shell(name="update-grub", commands=["update-grub"], _if=dropin.did_change)
