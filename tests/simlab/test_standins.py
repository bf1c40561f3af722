"""The stand-in NVIDIA repositories and programs, checked on this machine (no lab needed).

apt runs with a private configuration (its own sources, keyrings, state, cache and dpkg status)
so that this machine's apt sources, keys, lists, caches and dpkg state are neither used nor changed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.simlab import standins
from tests.simlab.paths import REPO
from tests.simlab.standins import build_repositories

DGX_DIR = standins.DGX
TOOLKIT_DIR = standins.TOOLKIT
# The real tool's table is 91 columns wide (seen in NVIDIA/k8s-device-plugin#1482 for a GB10).
TABLE_WIDTH = 91


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("repos")
    build_repositories(dest)
    return dest


def run(*cmd: str | Path, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


def extract(repos: Path, repo: str, package: str, version: str, into: Path) -> Path:
    """Unpack one built .deb (as dpkg would install it) and return its root."""
    root = into / f"{package}_{version}"
    deb = repos / repo / f"{package}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root


def control_stanza(repos: Path, repo: str, package: str, version: str) -> str:
    deb = repos / repo / f"{package}_{version}_all.deb"
    return run("dpkg-deb", "-f", deb, check=True).stdout


# --- the repositories -----------------------------------------------------------------------------


def packages_index(repo_dir: Path) -> set[tuple[str, str]]:
    stanzas = (repo_dir / "Packages").read_text().strip().split("\n\n")
    return {
        (re.search(r"^Package: (.+)$", s, re.M)[1], re.search(r"^Version: (.+)$", s, re.M)[1])
        for s in stanzas
    }


def test_dgx_repository_has_both_branches_and_the_metapackage(repos: Path) -> None:
    index = packages_index(repos / DGX_DIR)
    assert {entry for entry in index if entry[0] not in standins.DISTRIBUTION_PACKAGES} == {
        ("libnvidia-compute-580", "580.142-0ubuntu1"),
        ("libnvidia-compute-590", "590.48-0ubuntu1"),
        ("nvidia-driver-580-open", "580.142-0ubuntu1"),
        ("nvidia-driver-590-open", "590.48-0ubuntu1"),
        ("nvidia-driver-open", "590.48-0ubuntu1"),
    }
    # The distribution's own packages the deploy installs (nftables for the firewall).
    assert {name for name, _version in index} >= set(standins.DISTRIBUTION_PACKAGES)


def test_updates_repository_has_the_newer_580_build_only_signed_as_the_archive(
    repos: Path,
) -> None:
    newer = "580.159.03-0ubuntu1"  # after the archive's 580.142-0ubuntu1, same branch
    assert packages_index(repos / standins.DGX_UPDATES) == {
        ("libnvidia-compute-580", newer),
        ("nvidia-driver-580-open", newer),
    }
    keyring = repos / DGX_DIR / "archive-keyring.gpg"  # the one every lab host trusts
    assert (
        run("gpgv", "--keyring", keyring, repos / standins.DGX_UPDATES / "InRelease").returncode
        == 0
    )


def test_toolkit_repository_has_two_releases_of_each_package(repos: Path) -> None:
    names = ["nvidia-container-toolkit", "nvidia-container-toolkit-base",
             "libnvidia-container-tools", "libnvidia-container1"]  # fmt: skip
    assert packages_index(repos / TOOLKIT_DIR) == {
        (name, version) for name in names for version in ("1.19.0-1", "1.18.0-1")
    }


def test_driver_packages_exclude_each_other(repos: Path) -> None:
    control = control_stanza(repos, DGX_DIR, "nvidia-driver-580-open", "580.142-0ubuntu1")
    for relation in ("Provides", "Conflicts", "Replaces"):
        assert f"{relation}: nvidia-driver-binary\n" in control


def test_toolkit_depends_on_its_own_release_of_base_and_tools(repos: Path) -> None:
    control = control_stanza(repos, TOOLKIT_DIR, "nvidia-container-toolkit", "1.18.0-1")
    depends = re.search(r"^Depends: (.+)$", control, re.M)[1]
    assert "nvidia-container-toolkit-base (= 1.18.0-1)" in depends
    assert "libnvidia-container-tools (= 1.18.0-1)" in depends


def keyring_from_gpgkey(repos: Path, tmp_path: Path) -> Path:
    """What NVIDIA's install guide does with the gpgkey file: gpg --dearmor it."""
    keyring = tmp_path / "nvidia-container-toolkit-keyring.gpg"
    subprocess.run(
        ["gpg", "--batch", "--dearmor", "--output", str(keyring),
         str(repos / TOOLKIT_DIR / "gpgkey")],
        check=True,
    )  # fmt: skip
    return keyring


def test_signatures_verify_with_each_repositorys_own_key(repos: Path, tmp_path: Path) -> None:
    keyrings = {
        DGX_DIR: repos / DGX_DIR / "archive-keyring.gpg",
        TOOLKIT_DIR: keyring_from_gpgkey(repos, tmp_path),
    }
    assert (
        (repos / TOOLKIT_DIR / "gpgkey")
        .read_text()
        .startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    )
    for repo, keyring in keyrings.items():
        repo_dir = repos / repo
        assert run("gpgv", "--keyring", keyring, repo_dir / "InRelease").returncode == 0
        detached = run("gpgv", "--keyring", keyring, repo_dir / "Release.gpg", repo_dir / "Release")
        assert detached.returncode == 0
    # Two different throwaway keys: neither repository verifies with the other's key.
    crossed = run("gpgv", "--keyring", keyrings[DGX_DIR], repos / TOOLKIT_DIR / "InRelease")
    assert crossed.returncode != 0


def test_rebuild_keeps_keys_and_packages_byte_identical(tmp_path: Path) -> None:
    build_repositories(tmp_path)
    first = {p.name: p.read_bytes() for p in (tmp_path / DGX_DIR).iterdir()}
    first_key = (tmp_path / TOOLKIT_DIR / "gpgkey").read_text()
    build_repositories(tmp_path)
    second = {p.name: p.read_bytes() for p in (tmp_path / DGX_DIR).iterdir()}
    assert second.keys() == first.keys()
    for name in first:
        # Only the Release file (its Date) and its signatures may change.
        if name.endswith(".deb") or name.startswith("Packages") or name == "archive-keyring.gpg":
            assert second[name] == first[name], name
    assert (tmp_path / TOOLKIT_DIR / "gpgkey").read_text() == first_key


# --- apt against the repositories, with a private configuration -----------------------------------


class PrivateApt:
    """apt-get/apt-cache reading only the files under root (APT_CONFIG names its apt.conf)."""

    def __init__(self, root: Path, repos: Path, installed: list[str]) -> None:
        for sub in ("state/lists/partial", "cache/archives/partial", "parts", "prefs.d", "log"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        toolkit_keyring = keyring_from_gpgkey(repos, root)
        (root / "sources.list").write_text(
            f"deb [signed-by={repos / DGX_DIR / 'archive-keyring.gpg'}] file:{repos / DGX_DIR} /\n"
            f"deb [signed-by={toolkit_keyring}] file:{repos / TOOLKIT_DIR} /\n"
        )
        # dpkg's view of the host: only what the test says is installed.
        (root / "status").write_text("".join(stanza + "\n" for stanza in installed))
        settings = {
            "Dir::Etc::main": "/dev/null",
            "Dir::Etc::parts": root / "parts",
            "Dir::Etc::sourcelist": root / "sources.list",
            "Dir::Etc::sourceparts": "-",
            "Dir::Etc::trusted": root / "trusted.gpg",
            "Dir::Etc::trustedparts": root / "trusted.gpg.d",
            "Dir::Etc::preferences": root / "preferences",
            "Dir::Etc::preferencesparts": root / "prefs.d",
            "Dir::State": root / "state",
            "Dir::State::status": root / "status",
            "Dir::Cache": root / "cache",
            "Dir::Log": root / "log",
            "Acquire::Languages": "none",
            # The files belong to root and sit in a private temporary directory.
            "APT::Sandbox::User": "root",
            "Debug::NoLocking": "true",
        }
        self.config = root / "apt.conf"
        self.config.write_text("".join(f'{key} "{value}";\n' for key, value in settings.items()))

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "APT_CONFIG": str(self.config), "LC_ALL": "C"}
        return run(*args, env=env, stdin=subprocess.DEVNULL)


PYTHON3_INSTALLED = (
    "Package: python3\nStatus: install ok installed\nPriority: optional\n"
    "Architecture: all\nVersion: 3.11.2-1+b1\nDescription: stand-in entry for the test\n"
)


def installed(repos: Path, repo: str, package: str, version: str) -> str:
    """A dpkg status entry for one of the built packages."""
    return "Status: install ok installed\n" + control_stanza(repos, repo, package, version)


@pytest.fixture
def apt(repos: Path, tmp_path: Path) -> PrivateApt:
    apt = PrivateApt(tmp_path / "apt", repos, [PYTHON3_INSTALLED])
    update = apt("apt-get", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    assert not re.search(r"^[WE]:", update.stdout + update.stderr, re.M), update.stderr
    return apt


def installs(simulation: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert simulation.returncode == 0, simulation.stdout + simulation.stderr
    return dict(re.findall(r"^Inst (\S+) \((\S+)", simulation.stdout, re.M))


def test_metapackage_pulls_the_newest_driver_branch(apt: PrivateApt) -> None:
    assert installs(apt("apt-get", "install", "-s", "nvidia-driver-open")) == {
        "libnvidia-compute-590": "590.48-0ubuntu1",
        "nvidia-driver-590-open": "590.48-0ubuntu1",
        "nvidia-driver-open": "590.48-0ubuntu1",
    }


def test_installing_one_branch_removes_the_other(repos: Path, tmp_path: Path) -> None:
    on_580 = [
        PYTHON3_INSTALLED,
        installed(repos, DGX_DIR, "libnvidia-compute-580", "580.142-0ubuntu1"),
        installed(repos, DGX_DIR, "nvidia-driver-580-open", "580.142-0ubuntu1"),
    ]
    apt = PrivateApt(tmp_path / "apt", repos, on_580)
    assert apt("apt-get", "update").returncode == 0
    simulation = apt("apt-get", "install", "-s", "nvidia-driver-590-open")
    assert installs(simulation)["nvidia-driver-590-open"] == "590.48-0ubuntu1"
    assert re.search(r"^Remv nvidia-driver-580-open ", simulation.stdout, re.M)


def test_policy_lists_both_toolkit_releases(apt: PrivateApt) -> None:
    policy = apt("apt-cache", "policy", "nvidia-container-toolkit")
    assert policy.returncode == 0
    assert "Candidate: 1.19.0-1" in policy.stdout
    assert re.search(r"^\s+1\.19\.0-1 500$", policy.stdout, re.M)
    assert re.search(r"^\s+1\.18\.0-1 500$", policy.stdout, re.M)


def test_pinning_only_the_toolkit_does_not_downgrade_its_dependencies(apt: PrivateApt) -> None:
    # As with NVIDIA's repository: exact-version dependencies are not downgraded for you, which
    # is why NVIDIA's install guide pins all four packages to the same version.
    simulation = apt("apt-get", "install", "-s", "nvidia-container-toolkit=1.18.0-1")
    assert simulation.returncode != 0
    assert "Depends: nvidia-container-toolkit-base (= 1.18.0-1)" in simulation.stdout


def test_pinning_all_four_installs_the_older_release(apt: PrivateApt) -> None:
    names = ["nvidia-container-toolkit", "nvidia-container-toolkit-base",
             "libnvidia-container-tools", "libnvidia-container1"]  # fmt: skip
    pinned = installs(apt("apt-get", "install", "-s", *(f"{name}=1.18.0-1" for name in names)))
    assert pinned == dict.fromkeys(names, "1.18.0-1")


# --- nvidia-smi -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smi(repos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The nvidia-smi of each driver branch, by the driver version it must report."""
    into = tmp_path_factory.mktemp("drivers")
    return {
        version.split("-")[0]: extract(
            repos, DGX_DIR, f"nvidia-driver-{branch}-open", version, into
        )
        / "usr/bin/nvidia-smi"
        for branch, (version, _cuda) in standins.DRIVER_BRANCHES.items()
    }


def test_driver_postinst_records_the_module_an_upgrade_leaves_loaded(
    repos: Path, tmp_path: Path
) -> None:
    deb = repos / standins.DGX_UPDATES / "nvidia-driver-580-open_580.159.03-0ubuntu1_all.deb"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "control")], check=True)
    # The script as shipped, its record moved here (it writes /run/simlab-nvidia-module).
    record = tmp_path / "loaded"
    script = (tmp_path / "control/postinst").read_text()
    assert standins.LOADED_MODULE in script
    postinst = tmp_path / "postinst"
    postinst.write_text(script.replace(standins.LOADED_MODULE, str(record)))
    # dpkg's calls (Debian policy 6.5): a fresh install, then an upgrade from 580.142.
    assert run("sh", postinst, "configure", "").returncode == 0
    assert not record.exists()  # nothing was loaded before: the installed module is
    assert run("sh", postinst, "configure", "580.142-0ubuntu1").returncode == 0
    assert record.read_text() == "580.142\n"
    # A second move before the reboot keeps the module loaded at boot.
    assert run("sh", postinst, "configure", "580.159.03-0ubuntu1").returncode == 0
    assert record.read_text() == "580.142\n"


def test_smi_after_an_upgrade_fails_as_nvml_does_until_the_reboot(
    repos: Path, tmp_path: Path
) -> None:
    newer = extract(
        repos, standins.DGX_UPDATES, "nvidia-driver-580-open", "580.159.03-0ubuntu1", tmp_path
    )
    smi = newer / "usr/bin/nvidia-smi"
    record = tmp_path / "loaded"
    loaded = {"SIMLAB_LOADED_MODULE": str(record), "PATH": os.environ["PATH"]}
    query = ("--query-gpu=driver_version", "--format=csv,noheader")
    record.write_text("580.142\n")
    mismatch = run(smi, *query, env=loaded)
    # tinygrad/open-gpu-kernel-modules#47's two lines, the library's major.minor version.
    assert mismatch.stdout == (
        "Failed to initialize NVML: Driver/library version mismatch\n"
        "NVML library version: 580.159\n"
    )
    assert mismatch.returncode != 0
    record.unlink()  # rebooted: /run emptied, the installed module loaded
    assert run(smi, *query, env=loaded).stdout == "580.159.03\n"


@pytest.mark.parametrize("driver", ["580.142", "590.48"])
def test_smi_reports_gb10_and_its_packages_driver_version(
    smi: dict[str, Path], driver: str
) -> None:
    result = run(
        smi[driver], "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"
    )
    assert result.returncode == 0
    assert result.stdout == f"NVIDIA GB10, {driver}, 12.1\n"


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        # NVIDIA's DGX Spark known-issues page, as quoted in unslothai/unsloth#10703.
        (
            "csv",
            "index, name, memory.total [MiB], memory.free [MiB]\n0, NVIDIA GB10, [N/A], [N/A]\n",
        ),
        ("csv,nounits", "index, name, memory.total, memory.free\n0, NVIDIA GB10, [N/A], [N/A]\n"),
        ("csv,noheader,nounits", "0, NVIDIA GB10, [N/A], [N/A]\n"),
    ],
    ids=["csv", "nounits", "noheader-nounits"],
)
def test_smi_reports_memory_as_not_available(smi: dict[str, Path], fmt: str, expected: str) -> None:
    result = run(
        smi["580.142"], "--query-gpu=index,name,memory.total,memory.free", f"--format={fmt}"
    )
    assert (result.returncode, result.stdout) == (0, expected)


def test_smi_query_other_fields(smi: dict[str, Path]) -> None:
    result = run(
        smi["580.142"], "--query-gpu", "count,memory.used,uuid,pci.bus_id", "--format", "csv"
    )
    header, values = result.stdout.splitlines()
    assert header == "count, memory.used [MiB], uuid, pci.bus_id"
    count, used, uuid, bus_id = values.split(", ")
    assert (count, used, bus_id) == ("1", "[N/A]", "0000000F:01:00.0")
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid)


def test_smi_refuses_an_unknown_field_like_the_real_one(smi: dict[str, Path]) -> None:
    result = run(smi["580.142"], "--query-gpu=name,memory.bogus", "--format=csv")
    assert result.returncode == 2
    assert result.stdout == 'Field "memory.bogus" is not a valid field to query.\n\n'


def test_smi_lists_one_gpu(smi: dict[str, Path]) -> None:
    result = run(smi["590.48"], "-L")
    assert re.fullmatch(r"GPU 0: NVIDIA GB10 \(UUID: GPU-[0-9a-f-]{36}\)\n", result.stdout)


def test_smi_table_shows_driver_and_unsupported_memory(smi: dict[str, Path]) -> None:
    result = run(smi["580.142"])
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert "Driver Version: 580.142 " in lines[2] and "CUDA Version: 13.0 " in lines[2]
    gpu_row = next(i for i, line in enumerate(lines) if "NVIDIA GB10" in line)
    assert lines[gpu_row + 1].startswith("| N/A   40C    P8  ")
    assert "| Not Supported          |" in lines[gpu_row + 1]
    assert {len(line) for line in lines[1:] if line} == {TABLE_WIDTH}


def test_smi_table_is_laid_out_as_a_real_gb10s(smi: dict[str, Path]) -> None:
    # The table of a real DGX Spark on driver 580.95.05, as NVIDIA/k8s-device-plugin issue 1482
    # quotes it (tests/unit/captured/public-nvidia-smi-gb10-table.txt): every line but the
    # versions' is the stand-in's, character for character.
    real = (REPO / "tests/unit/captured/public-nvidia-smi-gb10-table.txt").read_text().splitlines()
    ours = run(smi["580.142"]).stdout.splitlines()[1 : len(real) + 1]  # after the date line
    assert [line for i, line in enumerate(ours) if i != 1] == [
        line for i, line in enumerate(real) if i != 1
    ]
    versions = r"\| NVIDIA-SMI (\S+) +Driver Version: (\S+) +CUDA Version: (\S+) +\|"
    assert re.fullmatch(versions, real[1]).groups() == ("580.95.05", "580.95.05", "13.0")
    assert re.fullmatch(versions, ours[1]).groups() == ("580.142", "580.142", "13.0")
    assert len(ours[1]) == len(real[1])


# The graphics clock's lock and reset. The lock's two lines: Red Hat's OpenShift GPUDirect guide's
# example output of `nvidia-smi -i 0 -lgc ...` ('GPU clocks set to "(gpuClkMin 1740, gpuClkMax
# 1740)" for GPU 00000000:61:00.0', "All done."), a GB10's bus id (the table above); its journal
# line on a GB10 as capetron/gb10-cluster-bench quotes it. The reset: "All done." (a public
# pod-capability check of `nvidia-smi -i 0 -rgc`, RC=0).
GB10_LOCKED = 'GPU clocks set to "(gpuClkMin 300, gpuClkMax 2200)" for GPU 0000000F:01:00.0\n'


@pytest.mark.parametrize(
    ("args", "expected", "recorded"),
    [
        (("-lgc", "300,2200"), GB10_LOCKED + "All done.\n", "300,2200\n"),
        (("--lock-gpu-clocks=300,2200",), GB10_LOCKED + "All done.\n", "300,2200\n"),
        # One value locks min and max to it (`-lgc 1000`: gpuClkMin 1000, gpuClkMax 1000 in the
        # same public check).
        (
            ("-lgc", "2100"),
            'GPU clocks set to "(gpuClkMin 2100, gpuClkMax 2100)" for GPU 0000000F:01:00.0\n'
            "All done.\n",
            "2100,2100\n",
        ),
        (("-rgc",), "All done.\n", None),
    ],
    ids=["lgc", "long-option", "one-value", "rgc"],
)  # fmt: skip
def test_smi_locks_and_resets_the_clock_as_root_in_the_real_words(
    smi: dict[str, Path],
    args: tuple[str, ...],
    expected: str,
    recorded: str | None,
    tmp_path: Path,
) -> None:
    # The lab's record of the lock (for its tests; the tool itself shows none), here in tmp_path,
    # holding an earlier lock that -rgc removes.
    record = tmp_path / "gpu-clock"
    record.write_text("300,2400\n")
    env = {"SIMLAB_GPU_CLOCK_RECORD": str(record), "PATH": os.environ["PATH"]}
    result = run(smi["580.142"], *args, env=env)
    assert (result.returncode, result.stdout) == (0, expected)
    assert (record.read_text() if record.exists() else None) == recorded


@pytest.mark.parametrize("args", [("-lgc", "300,2200"), ("-rgc",)])
def test_smi_refuses_a_user_without_the_right_as_the_real_one(
    smi: dict[str, Path], args: tuple[str, ...], tmp_path: Path
) -> None:
    # Not root: an `id` answering 1000 first on PATH. The refusal and exit 4 are a GB10's, as a
    # public write-up quotes them from an unprivileged container; the second line is driver
    # 610.88's after the same refusal (WSL), quoted in another.
    (tmp_path / "id").write_text("#!/bin/sh\necho 1000\n")
    (tmp_path / "id").chmod(0o755)
    record = tmp_path / "gpu-clock"
    user = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "SIMLAB_GPU_CLOCK_RECORD": str(record)}
    result = run(smi["580.142"], *args, env=user)
    assert not record.exists()
    assert result.returncode == 4
    assert result.stdout == (
        "The current user does not have permission to change clocks for GPU 0000000F:01:00.0.\n"
        "Terminating early due to previous errors.\n"
    )


@pytest.mark.parametrize("value", ["2200,300", "300,2x", "300,", "1,2,3"])
def test_smi_refuses_a_lock_that_is_no_range(
    smi: dict[str, Path], value: str, tmp_path: Path
) -> None:
    record = tmp_path / "gpu-clock"
    env = {"SIMLAB_GPU_CLOCK_RECORD": str(record), "PATH": os.environ["PATH"]}
    result = run(smi["580.142"], "-lgc", value, env=env)
    assert result.returncode == 2 and "GPU clocks set" not in result.stdout
    assert not record.exists()


# --- the container toolkit's programs -------------------------------------------------------------


@pytest.fixture(scope="module")
def toolkit(repos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One root with the 1.19.0-1 packages unpacked into it."""
    into = tmp_path_factory.mktemp("toolkit")
    for package in standins.toolkit_packages():
        if package.version == "1.19.0-1":
            root = extract(repos, TOOLKIT_DIR, package.name, package.version, into)
            subprocess.run(["cp", "-a", f"{root}/.", str(into / "root")], check=True)
    return into / "root/usr/bin"


def ctk(toolkit: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(toolkit / "nvidia-ctk", *args)


DAEMON_JSON = {
    "log-driver": "json-file",
    "log-opts": {"max-size": "10m"},
    "max-concurrent-downloads": 3,
    "runtimes": {"crun": {"path": "/usr/bin/crun"}},
}


def test_ctk_adds_the_runtime_and_keeps_every_other_key(toolkit: Path, tmp_path: Path) -> None:
    daemon = tmp_path / "daemon.json"
    daemon.write_text(json.dumps(DAEMON_JSON))
    result = ctk(toolkit, "runtime", "configure", "--runtime=docker", f"--config={daemon}")
    assert result.returncode == 0, result.stderr
    assert f'msg="Wrote updated config to {daemon}"' in result.stderr
    assert 'msg="It is recommended that docker daemon be restarted."' in result.stderr
    written = json.loads(daemon.read_text())
    nvidia = {"args": [], "path": "nvidia-container-runtime"}
    assert written == {**DAEMON_JSON, "runtimes": {**DAEMON_JSON["runtimes"], "nvidia": nvidia}}
    # Go's MarshalIndent: sorted keys, 4 spaces, integers stay integers, no final newline.
    assert daemon.read_text() == (
        '{\n    "log-driver": "json-file",\n    "log-opts": {\n        "max-size": "10m"\n    },\n'
        '    "max-concurrent-downloads": 3,\n    "runtimes": {\n        "crun": {\n'
        '            "path": "/usr/bin/crun"\n        },\n        "nvidia": {\n'
        '            "args": [],\n            "path": "nvidia-container-runtime"\n        }\n'
        "    }\n}"
    )


def test_ctk_second_run_leaves_the_same_bytes(toolkit: Path, tmp_path: Path) -> None:
    daemon = tmp_path / "daemon.json"
    daemon.write_text(json.dumps(DAEMON_JSON))
    configure = ("runtime", "configure", "--runtime=docker", f"--config={daemon}")
    assert ctk(toolkit, *configure).returncode == 0
    first = daemon.read_bytes()
    assert ctk(toolkit, *configure).returncode == 0
    assert daemon.read_bytes() == first


def test_ctk_creates_an_absent_config_and_can_set_the_default(
    toolkit: Path, tmp_path: Path
) -> None:
    daemon = tmp_path / "etc/docker/daemon.json"
    result = ctk(toolkit, "runtime", "configure", "--config", str(daemon), "--set-as-default")
    assert result.returncode == 0
    assert 'msg="Config file does not exist; using empty config"' in result.stderr
    assert json.loads(daemon.read_text()) == {
        "default-runtime": "nvidia",
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    }


def test_ctk_escapes_and_formats_like_go(toolkit: Path, tmp_path: Path) -> None:
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"label": "a<b>&c", "ratio": 0.5, "tiny": 1e-7, "big": 1e22}')
    assert ctk(toolkit, "runtime", "configure", f"--config={daemon}").returncode == 0
    text = daemon.read_text()
    assert '"label": "a\\u003cb\\u003e\\u0026c"' in text
    assert '"ratio": 0.5' in text and '"tiny": 1e-7' in text and '"big": 1e+22' in text


def test_ctk_refuses_an_empty_config_like_the_real_one(toolkit: Path, tmp_path: Path) -> None:
    daemon = tmp_path / "daemon.json"
    daemon.write_text("")
    result = ctk(toolkit, "runtime", "configure", f"--config={daemon}")
    assert result.returncode == 1
    assert 'level=error msg="unable to load config for runtime docker: EOF"' in result.stderr
    assert daemon.read_text() == ""


def test_ctk_version(toolkit: Path) -> None:
    assert ctk(toolkit, "--version").stdout == "NVIDIA Container Toolkit CLI version 1.19.0\n"


def test_runtime_hands_its_arguments_to_runc(toolkit: Path, tmp_path: Path) -> None:
    runc = tmp_path / "runc"
    runc.write_text('#!/bin/sh\necho "runc $*"\n')
    runc.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    result = run(toolkit / "nvidia-container-runtime", "--root", "/r", "create", "x", env=env)
    assert result.stdout == "runc --root /r create x\n"


def test_hook_reads_its_stdin_and_succeeds(toolkit: Path) -> None:
    result = run(toolkit / "nvidia-container-runtime-hook", "prestart", input='{"pid": 1}')
    assert result.returncode == 0


def test_container_cli_version(toolkit: Path) -> None:
    result = run(toolkit / "nvidia-container-cli", "--version")
    assert result.stdout.splitlines()[:2] == ["cli-version: 1.19.0", "lib-version: 1.19.0"]
