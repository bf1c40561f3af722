"""spark/inventory/: validated host data, the cluster environment, the pre-connect check."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from pyinfra.api import Inventory

from spark import inventory as config
from spark import vllm_release
from spark.inventory import ConfigError, load_from_dicts
from spark.topology import SHAPES
from stages import settings
from stages.settings import InventoryRefused, load, pyinfra_keys

REPO = Path(__file__).parents[2]
BAD_INPUTS = Path(__file__).parent / "bad_inputs"
# "<host>[, <host>...]: <key>: <what is wrong>; <what to do>" (a value may itself hold "; ")
PROBLEM_LINE = re.compile(r"[\w.-]+(, [\w.-]+)*: \w+: .+; .+")


def group_defaults() -> dict[str, Any]:
    """group_data/all.py as pyinfra reads it (module-level names, no dunders, no imported
    modules: pyinfra_cli/inventory.py `_get_group_data`)."""
    names = runpy.run_path(str(REPO / "group_data" / "all.py"))
    return {
        key: value
        for key, value in names.items()
        if not key.startswith("__") and not isinstance(value, ModuleType)
    }


def merged(hosts: dict[str, dict[str, Any]], drop: tuple[str, ...] = ()) -> dict[str, dict]:
    """Host data over the group defaults, top-level keys only, as pyinfra merges them."""
    defaults = {k: v for k, v in group_defaults().items() if k not in drop}
    return {name: defaults | data for name, data in hosts.items()}


TWO_SPARKS = {
    "spark-1": {
        "spark_role": "head",
        "fabric_addresses": {
            "enp1s0f1np1": "192.168.100.10/24",
            "enP2p1s0f1np1": "192.168.101.10/24",
        },
    },
    "spark-2": {
        "spark_role": "worker",
        "fabric_addresses": {
            "enp1s0f1np1": "192.168.100.11/24",
            "enP2p1s0f1np1": "192.168.101.11/24",
        },
    },
}


def test_node_ranks_put_the_head_first_whatever_the_inventorys_order() -> None:
    worker_first = {"spark-2": TWO_SPARKS["spark-2"], "spark-1": TWO_SPARKS["spark-1"]}
    spark = load_from_dicts(merged(worker_first))
    assert [host.name for host in spark.ranks] == ["spark-1", "spark-2"]
    assert (spark.node_rank("spark-1"), spark.node_rank("spark-2")) == (0, 1)


def test_two_sparks_are_accepted_and_grouped_by_concern() -> None:
    spark = load_from_dicts(merged(TWO_SPARKS))

    assert [host.name for host in spark.hosts] == ["spark-1", "spark-2"]
    assert spark.head.name == "spark-1"
    worker = spark.host("spark-2")
    assert worker.role == "worker"
    assert [(link.ifname, link.hca, str(link.address)) for link in worker.fabric] == [
        ("enp1s0f1np1", "rocep1s0f1", "192.168.100.11/24"),
        ("enP2p1s0f1np1", "roceP2p1s0f1", "192.168.101.11/24"),
    ]
    assert (worker.mtu, worker.gid_index, worker.env_file) == (9000, 3, "/etc/spark/cluster.env")
    assert (worker.driver.branch, worker.driver.package) == (580, "nvidia-driver-580-open")
    assert worker.toolkit.version == "1.19.0-1"
    assert worker.toolkit.key_url == "https://nvidia.github.io/libnvidia-container/gpgkey"


def test_cluster_environment_of_head_and_worker() -> None:
    spark = load_from_dicts(merged(TWO_SPARKS))
    common = {
        "RAY_memory_monitor_refresh_ms": "0",
        "NCCL_IB_ADDR_FAMILY": "AF_INET",
        "NCCL_IB_ROCE_VERSION_NUM": "2",
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "OMPI_MCA_btl_tcp_if_include": "enp1s0f1np1",
        "UCX_NET_DEVICES": "rocep1s0f1:1,roceP2p1s0f1:1,enp1s0f1np1",
        "MASTER_ADDR": "192.168.100.10",
        "NCCL_IB_MERGE_NICS": "1",  # a pair: both twins merged (tonyd2wild PR#35)
    }

    assert spark.host("spark-1").cluster_environment(spark.head) == common | {
        "VLLM_HOST_IP": "192.168.100.10"
    }
    assert spark.host("spark-2").cluster_environment(spark.head) == common | {
        "VLLM_HOST_IP": "192.168.100.11"
    }


def test_nccl_debug_adds_nccl_debug_info() -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-2"]["nccl_debug"] = True
    spark = load_from_dicts(hosts)

    assert spark.host("spark-2").cluster_environment(spark.head)["NCCL_DEBUG"] == "INFO"
    assert "NCCL_DEBUG" not in spark.host("spark-1").cluster_environment(spark.head)


def test_the_nccl_test_passes_at_nvidias_mark_for_the_topology_unless_told() -> None:
    spark = load_from_dicts(merged(TWO_SPARKS))
    assert spark.head.nccl_test == config.NcclTest(min_busbw_gbs=21.875, max_bytes=1 << 30)
    hosts = merged(TWO_SPARKS)
    for data in hosts.values():
        data |= {"nccl_test_min_busbw_gbs": 0.5, "nccl_test_max_bytes": 1 << 22}
    spark = load_from_dicts(hosts)
    assert spark.host("spark-2").nccl_test == config.NcclTest(min_busbw_gbs=0.5, max_bytes=1 << 22)
    hosts = merged(TWO_SPARKS)
    for data in hosts.values():
        data["nccl_test"] = False
    assert load_from_dicts(hosts).head.nccl_test is None
    assert SHAPES["ring3"].nccl_pass_mark_gbs == 10.0  # MIN_NCCL_TEST_BW_RING


def test_nccl_test_settings_that_differ_between_boxes_are_refused_naming_the_box() -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-2"]["nccl_test_max_bytes"] = 1 << 24
    with pytest.raises(ConfigError) as refused:
        load_from_dicts(hosts)
    assert refused.value.problems == [
        "spark-2: nccl_test: 21.875 GB/s up to 16777216 bytes differs from spark-1's 21.875 GB/s"
        " up to 1073741824 bytes; set nccl_test, nccl_test_min_busbw_gbs and nccl_test_max_bytes"
        " in group_data for every host"
    ]


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("nccl_test_max_bytes", 4096, "greater than or equal to 1048576"),
        ("nccl_test_min_busbw_gbs", 200.0, "less than or equal to 50"),
        ("nccl_test", "yes", "True or False"),
    ],
)
def test_bad_nccl_test_values_are_named(key: str, value: object, says: str) -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-1"][key] = value
    with pytest.raises(ConfigError) as refused:
        load_from_dicts(hosts)
    (problem,) = refused.value.problems
    assert problem.startswith(f"spark-1: {key}: ") and says in problem, problem


def test_a_lone_box_without_fabric_is_the_head_and_gets_only_ray_settings() -> None:
    spark = load_from_dicts(merged({"spark-1": {}}))

    assert spark.head.name == "spark-1"
    assert spark.head.fabric == ()
    assert spark.head.cluster_environment(spark.head) == {"RAY_memory_monitor_refresh_ms": "0"}


def test_a_lone_box_with_fabric_is_its_own_master() -> None:
    spark = load_from_dicts(
        merged({"spark-1": {"fabric_addresses": {"enp1s0f1np1": "10.0.0.1/24"}}})
    )

    environment = spark.head.cluster_environment(spark.head)
    assert environment["MASTER_ADDR"] == environment["VLLM_HOST_IP"] == "10.0.0.1"
    assert environment["NCCL_IB_HCA"] == "rocep1s0f1"


def test_pyinfra_keys_pass_untouched() -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-1"] |= {
        "ssh_port": "not validated here",
        "_sudo": True,
        "_sudo_password": "hunter2",
        "docker_identifier": 1,
        "local_x": 1,
        "winrm_port": 1,
        "chroot_directory": "/",
    }

    assert load_from_dicts(hosts).head.name == "spark-1"


def test_every_problem_of_every_host_is_listed_one_per_line() -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-1"] |= {"fabric_mtu": "9000", "roce_gid_index": 300}
    hosts["spark-2"] |= {"driver_branch": 590, "fabric_adresses": {}}

    with pytest.raises(ConfigError) as caught:
        load_from_dicts(hosts)

    problems = caught.value.problems
    assert len(problems) == 4
    assert str(caught.value).splitlines()[1:] == problems
    assert [line.split(": ")[:2] for line in problems] == [
        ["spark-1", "fabric_mtu"],
        ["spark-1", "roce_gid_index"],
        ["spark-2", "driver_branch"],
        ["spark-2", "fabric_adresses"],
    ]
    assert all(PROBLEM_LINE.fullmatch(line) for line in problems), problems
    assert "CUDA-graph deadlock" in problems[2]
    assert "did you mean fabric_addresses?" in problems[3]


def test_a_misspelt_secret_is_refused_without_showing_it() -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-1"]["sudo_password"] = "hunter2"

    with pytest.raises(ConfigError) as caught:
        load_from_dicts(hosts)

    assert "spark-1: sudo_password: unknown key" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_long_values_are_cut_in_messages() -> None:
    hosts = merged({"spark-1": {"env_file": 7 * ["/etc/spark/cluster.env"]}})

    with pytest.raises(ConfigError) as caught:
        load_from_dicts(hosts)

    (problem,) = caught.value.problems
    assert problem.startswith("spark-1: env_file: Input should be a valid string (got [")
    assert "...)" in problem
    assert len(problem) < 200


def corpus() -> list[Path]:
    return sorted(path for path in BAD_INPUTS.iterdir() if path.suffix in (".json", ".py"))


def read_case(path: Path) -> dict[str, Any]:
    """A case is {"why", "hosts", "expect", optional "absent", optional "drop"}."""
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return runpy.run_path(str(path))["CASE"]


def test_the_corpus_is_big_enough() -> None:
    assert len(corpus()) >= 30


@pytest.mark.parametrize("path", corpus(), ids=lambda path: path.stem)
def test_bad_input_is_refused_naming_host_and_key(path: Path) -> None:
    case = read_case(path)

    with pytest.raises(ConfigError) as caught:
        load_from_dicts(
            merged(case["hosts"], tuple(case.get("drop", ()))), pyinfra_keys(), group_defaults()
        )

    message = str(caught.value)
    for expected in case["expect"]:
        assert expected in message, f"{case['why']}: {expected!r} not in:\n{message}"
    for unexpected in case.get("absent", ()):
        assert unexpected not in message
    assert all(PROBLEM_LINE.fullmatch(line) for line in caught.value.problems), message


def inventory(hosts: dict[str, dict[str, Any]]) -> Inventory:
    return Inventory((list(hosts.items()), {}))


def test_load_reads_host_data_from_a_pyinfra_inventory_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    done = SimpleNamespace(warnings=())
    monkeypatch.setattr(
        settings, "load_from_dicts", lambda hosts, *given: calls.append(hosts) or done
    )
    hosts = merged(TWO_SPARKS)
    hosts["spark-2"]["ssh_port"] = 2222
    loaded = inventory(hosts)

    assert load(loaded) is load(loaded) is done
    assert calls == [hosts]


def test_load_caches_the_error_too(monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-2"]["fabric_mtu"] = 100000
    loaded = inventory(hosts)
    calls = []
    real = config.load_from_dicts
    monkeypatch.setattr(
        settings, "load_from_dicts", lambda h, *given: calls.append(h) or real(h, *given)
    )

    errors = []
    for _ in range(2):
        with pytest.raises(InventoryRefused) as caught:
            load(loaded)
        errors.append(caught.value)

    assert len(calls) == 1
    assert errors[0] is not errors[1]
    assert str(errors[0]) == str(errors[1])
    assert str(errors[0]).splitlines()[1].startswith("spark-2: fabric_mtu: ")


def run_pyinfra(
    tmp_path: Path, hosts: dict[str, dict[str, Any]], cwd: Path = REPO, *deploy: str
) -> subprocess.CompletedProcess:
    """The pyinfra CLI deploying deploy.py (from the repository root: its
    group_data/) to a throwaway inventory of pyinfra's fake connector: "@fake/<name>" hosts
    that connect, answer every command with nothing and touch no machine."""
    inventory_file = tmp_path / "inventory.py"
    inventory_file.write_text(f"spark = {[(f'@fake/{n}', d) for n, d in hosts.items()]!r}\n")
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(inventory_file), *(deploy or ["deploy.py"])],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"PYINFRA_FAKE_DELAY": "0", "PYINFRA_FAKE_DELAY_JITTER": "0"},
    )


def test_cli_refuses_bad_data_before_any_operation(tmp_path: Path) -> None:
    bad = {name: dict(data) for name, data in TWO_SPARKS.items()}
    bad["spark-2"]["fabric_adresses"] = bad["spark-2"].pop("fabric_addresses")
    bad["spark-1"]["_sudo_password"] = "hunter2"

    run = run_pyinfra(tmp_path, bad)
    output = run.stdout + run.stderr

    assert run.returncode != 0
    assert "spark-2: fabric_adresses: unknown key; did you mean fabric_addresses?" in output
    assert "Starting operation" not in output  # no box was asked or told anything
    assert "Traceback" not in output
    assert "hunter2" not in output


def test_cli_with_good_data_goes_on_to_the_operations(tmp_path: Path) -> None:
    """The counterpart of the test above: valid data reaches the first operation."""
    run = run_pyinfra(tmp_path, TWO_SPARKS)
    output = run.stdout + run.stderr

    assert "problem(s)" not in output
    assert "--> Starting operation: Host layer | dpkg: nothing left half installed" in output


def test_started_elsewhere_the_deploy_refuses_to_run_unchecked(tmp_path: Path) -> None:
    """From another directory pyinfra finds no group_data/: refused, with the
    way out named; with --chdir the deploy runs as from the repository root."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = run_pyinfra(tmp_path, TWO_SPARKS, elsewhere, str(REPO / "deploy.py"))
    output = run.stdout + run.stderr
    assert run.returncode != 0
    here = REPO.resolve()
    assert f"start pyinfra in {here} (cd there, or add --chdir {here})" in output
    assert "Starting operation" not in output

    run = run_pyinfra(tmp_path, TWO_SPARKS, elsewhere, "--chdir", str(REPO), "deploy.py")
    assert "--> Starting operation: Host layer | dpkg: nothing left half installed" in (
        run.stdout + run.stderr
    )
    assert "problem(s)" not in output


# --- the cluster lane --------------------------------------------------------------------------

BIG = {
    "name": "big",
    "image": "nvcr.io/nvidia/vllm:26.04-py3",
    "model": "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
    "served_name": "big",
    "port": 10103,
    "memory_fraction": 0.8,
    "max_model_len": 40960,
    "kv_cache_dtype": "fp8",
    "tensor_parallel_size": 2,
}


def cluster_problems(head: list, worker: list, hosts: dict | None = None) -> list[str]:
    hosts = hosts or TWO_SPARKS
    data = {
        name: dict(host) | {"lanes": head if host.get("spark_role") != "worker" else worker}
        for name, host in hosts.items()
    }
    try:
        load_from_dicts(merged(data))
    except ConfigError as error:
        return error.problems
    return []


def test_a_cluster_lane_on_the_head_at_the_clusters_size_is_accepted() -> None:
    assert cluster_problems([BIG], []) == []


def test_a_cluster_lane_is_refused_on_a_worker_a_lone_box_or_at_another_size() -> None:
    assert cluster_problems([], [BIG]) == [
        "spark-2: lanes: big: tensor_parallel_size: 2 makes a cluster lane, which is served from"
        " the head; move the lane to the head's lanes (spark-1's), or make this box the head"
    ]
    lone = {"spark-1": {"spark_role": "head"}}
    assert cluster_problems([BIG], [], lone)[0].startswith(
        "spark-1: lanes: big: tensor_parallel_size: 2 makes a cluster lane, but the inventory"
        " has one box"
    )
    assert cluster_problems([BIG | {"tensor_parallel_size": 4}], []) == [
        "spark-1: lanes: big: tensor_parallel_size: 4, but the cluster has 2 boxes (spark-1,"
        " spark-2); set 2: one rank on each box (each box has one GPU)"
    ]


def test_a_cluster_lane_in_another_image_than_rays_is_refused() -> None:
    # An image the table does not know runs a cluster lane on executor mp unless told ray.
    mirror = {"image": "registry.local:5000/nvidia/vllm:26.04-py3", "vllm_version": "0.19.0"}
    assert cluster_problems([BIG | mirror], []) == []
    (problem,) = cluster_problems([BIG | mirror | {"executor": "ray"}], [])
    assert problem.startswith(
        "spark-1: lanes: big: image: registry.local:5000/nvidia/vllm:26.04-py3, but"
    )


def test_a_workers_lanes_and_the_cluster_lanes_share_must_fit_the_worker() -> None:
    fast = {
        "name": "fast",
        "image": "nvcr.io/nvidia/vllm:26.04-py3",
        "model": "Qwen/Qwen3-0.6B",
        "served_name": "fast",
        "port": 10102,
        "memory_fraction": 0.2,
        "max_model_len": 8192,
    }
    assert cluster_problems([BIG], [fast]) == [
        "spark-2: lanes: the memory fractions add up to 1 (fast 0.2, the cluster lane big 0.8),"
        " above 0.9: the cluster lane takes its memory_fraction of every box; lower them to a"
        " total of 0.87 or less, or remove lanes",
        # 121.69 x (1 - 0.2 - 0.8) = 0 GiB left: the default floor of 8.5 stops the rank too
        "spark-2: memory_guard_min_available_gib: 8.5 GiB is not below the 0.0 GiB the lanes"
        " leave free (of 121.69 GiB: fast 0.2, the cluster lane big 0.8); the guard would stop"
        " a lane whenever all are loaded (the cluster lane's rank counted: on executor mp the"
        " guard stops it, and the cluster lane with it); lower the lanes' memory_fraction, or"
        " the floor (not below 8.5: there the guard stops a lane only after the driver fails)",
    ]
    assert cluster_problems([BIG], [fast | {"memory_fraction": 0.07}]) == []


def test_a_box_may_expect_its_gid_entry_elsewhere_and_nccl_is_not_pinned() -> None:
    # NCCL finds each box's own entry (roce.py): a box's roce_gid_index is its own business.
    hosts = {**TWO_SPARKS, "spark-2": TWO_SPARKS["spark-2"] | {"roce_gid_index": 4}}
    assert cluster_problems([], [], hosts) == []
    spark = load_from_dicts(merged(hosts))
    assert spark.host("spark-2").gid_index == 4
    assert not any("GID_INDEX" in name for name in spark.head.cluster_environment(spark.head))


def test_fetch_weights_is_off_by_default_and_set_per_box() -> None:
    hosts = merged(TWO_SPARKS)
    hosts["spark-2"]["fetch_weights"] = True
    spark = load_from_dicts(hosts)

    assert (spark.head.fetch_weights, spark.host("spark-2").fetch_weights) == (False, True)


def refusals(**data: Any) -> list[str]:
    try:
        load_from_dicts(merged({"spark-1": dict(TWO_SPARKS["spark-1"], **data)}))
    except ConfigError as error:
        return error.problems
    return []


def test_a_fabric_below_9000_needs_a_reason_in_one_line():
    assert refusals(fabric_mtu=1500) == [
        "spark-1: fabric_mtu: 1500 is below 9000: NCCL measured 18.9-21 GB/s at 1500 against"
        " 23.74 GB/s at 9000 (dgx-spark-playbooks#25); set 9000 (seed 001), or keep it and say"
        " why in fabric_mtu_below_9000_because"
    ]
    assert refusals(fabric_mtu=1500, fabric_mtu_below_9000_because="switch without jumbo") == []
    assert refusals(fabric_mtu=1500, fabric_mtu_below_9000_because="a\nb") == [
        "spark-1: fabric_mtu: fabric_mtu_below_9000_because: a line break or NUL; write one line"
    ]


def test_a_token_pasted_as_the_token_file_is_never_shown():
    (refusal,) = refusals(hf_token_file="hf_SENTINELTOKEN0123456789")
    assert refusal.startswith("spark-1: hf_token_file: the value is no file on this machine")
    assert "SENTINEL" not in refusal


def test_memory_settings_are_bounded_by_the_box():
    (unified,) = refusals(unified_memory_gib=4096)
    assert unified.startswith("spark-1: unified_memory_gib: Input should be less than or equal")
    assert "128" in unified
    (floor,) = refusals(memory_guard_min_available_gib=200)
    assert floor.startswith("spark-1: memory_guard_min_available_gib: Input should be less")


def test_ray_image_latest_is_refused_like_a_lanes():
    assert refusals(ray_image="nvcr.io/nvidia/vllm:latest") == [
        "spark-1: ray_image: 'nvcr.io/nvidia/vllm:latest' moves with every release; pin a tag,"
        " e.g. nvcr.io/nvidia/vllm:26.04-py3"
    ]


def with_lanes(head: list, worker: list) -> dict[str, dict]:
    return merged(
        {
            name: dict(host) | {"lanes": head if host["spark_role"] == "head" else worker}
            for name, host in TWO_SPARKS.items()
        }
    )


def test_an_image_known_to_carry_nccl_before_2_29_3_is_warned_of_for_a_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No image of the table has a known NCCL (spark/vllm_release.py): none is warned of.
    nccl_said = [w for w in load_from_dicts(with_lanes([BIG], [])).warnings if "NCCL" in w]
    assert nccl_said == []
    # The default image as if a release note said it carried NCCL 2.28.9 (torch 2.11's).
    known = vllm_release.Image("0.19.0", True, "seed 004", "2.28.9", "a release note")
    monkeypatch.setitem(vllm_release.IMAGES, "nvcr.io/nvidia/vllm:26.04-py3", known)
    why = (
        "nvcr.io/nvidia/vllm:26.04-py3 carries NCCL 2.28.9 (a release note): NCCL before 2.29.3"
        " deadlocks silently on aarch64: a weak compare-exchange in its proxy-op pool leaks"
        " slots until a rank spins forever, no error, no timeout (NVIDIA/nccl#2353,"
        " marin-community/marin#7344; fixed in NCCL 2.29.3); the NCCL test fails it on a Spark:"
        " choose an image with NCCL 2.29.3 or later"
    )
    warnings = load_from_dicts(with_lanes([BIG], [])).warnings
    assert [w for w in warnings if "NCCL" in w] == [f"spark-1: lanes: big: {why}"]
    # No cluster lane: the NCCL test runs in Ray's image on every box.
    warnings = load_from_dicts(with_lanes([], [])).warnings
    assert [w for w in warnings if "NCCL" in w] == [
        f"spark-1: ray_image: {why}",
        f"spark-2: ray_image: {why}",
    ]
    # An NCCL with the fix: nothing to say.
    fixed = vllm_release.Image("0.19.0", True, "seed 004", "2.29.3", "a release note")
    monkeypatch.setitem(vllm_release.IMAGES, "nvcr.io/nvidia/vllm:26.04-py3", fixed)
    assert [w for w in load_from_dicts(with_lanes([BIG], [])).warnings if "NCCL" in w] == []


# gpu_clock_lock_mhz: (min, max) MHz for `nvidia-smi -lgc min,max`; a GB10 reports 3003 MHz as its
# highest graphics clock (clocks.max.gr, driver 580.178.04, public GB10 write-ups).
LOCK_RANGE = (
    "is not a range (min, max) with 0 <= min <= max <= 3003 MHz (a GB10's highest graphics"
    " clock); e.g. (300, 2200), or None for no lock"
)


@pytest.mark.parametrize("value", [(300, 2200), (300, 2400), [300, 2100], (0, 3003), None, False])
def test_a_gpu_clock_lock_within_a_gb10s_range_or_none_passes(value: object) -> None:
    assert refusals(gpu_clock_lock_mhz=value) == []


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ((2200, 300), f"(2200, 300) {LOCK_RANGE}"),
        ((300, 3100), f"(300, 3100) {LOCK_RANGE}"),
        ((-1, 2200), f"(-1, 2200) {LOCK_RANGE}"),
        (2200, "2200 is not a pair (min, max) of MHz; e.g. (300, 2200) to cap the clock there,"
               " or None for no lock"),
        (True, "True is not a pair (min, max) of MHz; e.g. (300, 2200) to cap the clock there,"
               " or None for no lock"),
        ((300, 2200, 2400), "(300, 2200, 2400) is not a pair (min, max) of MHz; e.g. (300, 2200)"
                            " to cap the clock there, or None for no lock"),
    ],
)  # fmt: skip
def test_a_gpu_clock_lock_out_of_range_is_refused_naming_box_and_key(
    value: object, problem: str
) -> None:
    assert refusals(gpu_clock_lock_mhz=value) == [f"spark-1: gpu_clock_lock_mhz: {problem}"]


@pytest.mark.parametrize("value", [(300.0, 2200), ("300", 2200), (True, 2200)])
def test_a_gpu_clock_lock_of_other_than_integers_is_refused(value: object) -> None:
    (problem,) = refusals(gpu_clock_lock_mhz=value)
    assert problem.startswith("spark-1: gpu_clock_lock_mhz: 0: Input should be a valid integer")
