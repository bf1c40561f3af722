"""teardown.py: what it takes off a box (operations/teardown.py), which options it reads and when
it may act (stages/teardown.py).

lab-teardown-pieces-deployed.txt is the Pieces command's output on spark-1 of the simulated lab
deployed with the default inventory (a pair: Ray, the firewall, two lanes, the metrics
endpoint); lab-teardown-pieces-torn-down.txt the same after teardown.py ran there.
"""

from __future__ import annotations

import pytest

from operations import teardown
from spark.inventory import load_from_dicts
from spark.plan import plan
from stages import teardown as stage
from tests.unit.harness import FakeHost, captured, process, run_op
from tests.unit.test_config import TWO_SPARKS, merged

PATHS = ("/etc/spark", "/usr/local/lib/spark", "/etc/nginx/conf.d/spark-lanes.conf")


def pieces(name: str) -> dict[str, list[str]]:
    return process(teardown.Pieces, captured(name))


def test_pieces_of_a_deployed_box() -> None:
    found = pieces("lab-teardown-pieces-deployed.txt")
    assert "spark-lane-coder.service" in found["units"]
    assert "spark-metrics.timer" in found["units"]
    assert "spark-ray.service" in found["unit files"]
    assert "spark-lane-coder" in found["containers"]
    assert found["table"] == ["inet spark"]
    assert "/etc/spark" in found["paths"]


def test_pieces_of_a_box_torn_down() -> None:
    assert pieces("lab-teardown-pieces-torn-down.txt") == {
        "units": [],
        "unit files": [],
        "containers": [],
        "paths": [],
        "table": [],
    }


def test_the_pieces_command_asks_each_path_quoted() -> None:
    command = teardown.Pieces().command(("/etc/spark", "/x y"))
    assert "for p in /etc/spark '/x y'; do" in command
    assert "nft list table inet spark" in command


def test_everything_found_is_stopped_and_removed_nginx_reloaded() -> None:
    # In the fact's format (written by hand): a transient unit with no file, a drop-in directory.
    found = (
        "units\nspark-lane-coder.service\nspark-weights-share.service\n"
        "unit files\nspark-lane-coder.service\nspark-ray.service.d\n"
        "containers\nspark-lane-coder\n"
        "paths\n/etc/spark\n/etc/nginx/conf.d/spark-lanes.conf\n"
        "table\ninet spark\n"
    )
    host = FakeHost({teardown.Pieces: found})
    assert run_op(teardown.removed, host=host, paths=list(PATHS)) == [
        "systemctl disable spark-lane-coder.service",
        "systemctl stop spark-lane-coder.service spark-weights-share.service || true",
        "docker ps -aq --filter name='^spark-' | xargs -r docker rm -f",
        "if nft list table inet spark >/dev/null 2>&1; then nft delete table inet spark; fi",
        "rm -rf -- /etc/systemd/system/spark-lane-coder.service"
        " /etc/systemd/system/spark-ray.service.d /etc/spark /etc/nginx/conf.d/spark-lanes.conf",
        "systemctl daemon-reload",
        "systemctl reset-failed spark-lane-coder.service spark-weights-share.service || true",
        "if systemctl is-active -q nginx; then systemctl reload nginx; fi",
    ]


def test_an_on_demand_lanes_socket_is_disabled_too() -> None:
    # In the fact's format (written by hand): lane fast on demand, its socket listening.
    found = (
        "units\nspark-lane-fast.service\nspark-ondemand-fast.service\nspark-ondemand-fast.socket\n"
        "unit files\nspark-lane-fast.service\nspark-ondemand-fast.service\n"
        "spark-ondemand-fast.socket\ncontainers\npaths\ntable\n"
    )
    commands = run_op(teardown.removed, host=FakeHost({teardown.Pieces: found}), paths=list(PATHS))
    assert commands[:2] == [
        "systemctl disable spark-lane-fast.service spark-ondemand-fast.service"
        " spark-ondemand-fast.socket",
        "systemctl stop spark-lane-fast.service spark-ondemand-fast.service"
        " spark-ondemand-fast.socket || true",
    ]


def test_the_gpu_clock_lock_is_reset_with_its_unit() -> None:
    # The lab's capture with the clock's unit file added by hand (the deploy writes it there).
    found = captured("lab-teardown-pieces-deployed.txt").replace(
        "unit files\n", "unit files\nspark-gpu-clock-lock.service\n"
    )
    commands = run_op(teardown.removed, host=FakeHost({teardown.Pieces: found}), paths=list(PATHS))
    reset = commands.index("/usr/bin/nvidia-smi -rgc")
    assert "spark-gpu-clock-lock.service" in commands[reset + 1]  # then its file removed


def test_a_box_torn_down_is_left_alone() -> None:
    host = FakeHost({teardown.Pieces: captured("lab-teardown-pieces-torn-down.txt")})
    assert run_op(teardown.removed, host=host, paths=list(PATHS)) == []
    assert host.noops == ["nothing of the deploy's is on the box"]


def test_holds_released_only_on_the_deploys_packages() -> None:
    # apt-mark showhold's output: one held package a line (written by hand).
    held = "nvidia-driver-580-open\nlibnvidia-container1\nlinux-image-nvidia\ntmux\n"
    host = FakeHost({teardown.HeldPackages: held})
    patterns = ["nvidia-driver-[0-9]*", "libnvidia-container1"]
    assert run_op(teardown.released, host=host, patterns=patterns) == [
        "apt-mark unhold nvidia-driver-580-open libnvidia-container1"
    ]
    none = FakeHost({teardown.HeldPackages: "tmux\n"})
    assert run_op(teardown.released, host=none, patterns=patterns) == []
    assert none.noops == ["none of them held"]
    assert process(teardown.HeldPackages, "nvidia-driver-580-open\n\ntmux\n") == [
        "nvidia-driver-580-open",
        "tmux",
    ]


def test_fabric_profiles_deleted_where_they_exist() -> None:
    # nmcli -g NAME connection show: one name a line (written by hand).
    host = FakeHost({teardown.ProfileNames: "fabric-enp1s0f1np1\nWired connection 1\n"})
    names = ["fabric-enp1s0f1np1", "fabric-enP2p1s0f1np1"]
    assert run_op(teardown.profiles_removed, host=host, names=names) == [
        "nmcli connection delete id fabric-enp1s0f1np1"
    ]
    gone = FakeHost({teardown.ProfileNames: "Wired connection 1\n"})
    assert run_op(teardown.profiles_removed, host=gone, names=names) == []
    assert gone.noops == ["no such profile"]


def test_allowed_stops_the_box_with_its_reason() -> None:
    host = FakeHost({})
    assert run_op(teardown.allowed, host=host, problem="") == []
    assert host.noops == ["the teardown goes on"]
    [command] = run_op(teardown.allowed, host=FakeHost({}), problem="spark-1: no")
    assert command == "printf '%s\\n' 'spark-1: no' >&2; exit 1"


def test_options_from_the_data_given_with_data() -> None:
    assert stage.options({"ssh_user": "x"}) == stage.Options(False, False, False, False)
    assert stage.options({"teardown_driver": True, "teardown_confirm": True}) == stage.Options(
        confirm=True, driver=True
    )
    assert stage.options({"teardown_fabric": "yes"}) == (
        "teardown_fabric: true or false (--data teardown_fabric=true)"
    )


@pytest.mark.parametrize(
    ("chosen", "asked", "why"),
    [
        (stage.Options(), True, ""),
        (stage.Options(confirm=True), False, ""),
        (
            stage.Options(),
            False,
            "spark-1: a teardown with -y needs --data teardown_confirm=true (or leave -y out:"
            " pyinfra then shows what would change on each box and asks)",
        ),
        ("teardown_fabric: true or false", True, "spark-1: teardown_fabric: true or false"),
    ],
)
def test_when_the_teardown_may_act(chosen: stage.Options | str, asked: bool, why: str) -> None:
    assert stage.problem("spark-1", chosen, asked) == why


def test_the_paths_by_option() -> None:
    box = plan(load_from_dicts(merged(TWO_SPARKS))).box("spark-1")
    default = stage.paths(box, stage.Options())
    assert {"/etc/spark", "/usr/local/lib/spark", "/run/spark", "/var/lib/spark/ray"} <= set(
        default
    )
    assert "/etc/nginx/conf.d/spark-lanes.conf" in default
    assert "/etc/profile.d/spark-cluster-env.sh" in default
    # The router's virtualenv, and its cache (a DynamicUser's: under private/, linked).
    assert {"/var/lib/spark/router", "/var/cache/spark-router",
            "/var/cache/private/spark-router"} <= set(default)  # fmt: skip
    # The models stay, unless asked: then /var/lib/spark goes whole.
    assert "/var/lib/spark" not in default
    assert "/var/lib/spark" in stage.paths(box, stage.Options(weights=True))
    assert "/etc/apt/preferences.d/nvidia-driver-branch.pref" not in default
    driver = stage.paths(box, stage.Options(driver=True))
    assert "/etc/apt/preferences.d/nvidia-driver-branch.pref" in driver
    assert "/etc/apt/sources.list.d/nvidia-container-toolkit.list" in driver


def test_the_teardown_keys_pass_the_boxes_checks() -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-1"] |= {"teardown_driver": True, "teardown_confirm": True}
    assert [box.name for box in load_from_dicts(hosts).hosts] == ["spark-1", "spark-2"]
