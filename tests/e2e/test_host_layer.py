"""The host layer on the simulated lab: bare hosts, deploy, look at the hosts, deploy again;
then every secret the deploys handled is in its root-only file on the box, and nowhere else.

Tests in this module run in order on the session's lab; each later one stands on the deploy
made by `test_first_deploy_converges`.

Before that deploy from bare hosts, sentinels take the place of the Hugging Face token (the
inventory's token file) and of each lane's API key (a key file already on the box, which the
deploy keeps); the Ray token, the controller's own (shared by every lab on this machine, so not
replaced), and each box's metrics key (made there) are read back from the boxes. Each box is
then searched, as root, for all of them: every process's argv (/proc/*/cmdline, containers'
processes included), the unit files, the whole journal with its metadata (the command lines sudo
and systemd log), `docker inspect` and `docker logs` of every container, and every
world-readable file under /etc, /run, /var, /home and /tmp. The secrets reach the search on its
stdin, never in an argv. The only hits allowed are the secret files themselves, which the search
must find (so it can fail).
"""

from __future__ import annotations

import re
import runpy
import secrets
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operations import metrics, ray
from spark import box_paths
from tests.conftest import CLIENTS, pyinfra, reimage_all, run_on
from tests.simlab import lab as simlab
from tests.simlab.paths import REPO, STATE

pytestmark = pytest.mark.lab

TWINS = [twin for twin, _hca in simlab.FABRIC_TWINS]
INVENTORY = "inventories/sim.py"
LANES: list[dict[str, Any]] = runpy.run_path(str(Path(REPO) / "group_data" / "all.py"))["lanes"]
HF_TOKEN_FILE = STATE / "hf-token"  # the lab inventory's hf_token_file, when it exists
# Run as root on a box, the secrets one a line on stdin: one line per place holding one.
SEARCH = r"""
set -u
p=$(mktemp); cat > "$p"
hit() { grep -qF -f "$p" && echo "$1"; }
for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f"; echo; done 2>/dev/null | hit argv
cat /etc/systemd/system/*.service /etc/systemd/system/*.d/*.conf 2>/dev/null | hit "unit files"
journalctl --no-pager -o verbose | hit journal
ids=$(docker ps -aq)
docker inspect $ids | hit "docker inspect"
for c in $ids; do docker logs "$c" 2>&1; done | hit "docker logs"
find /etc /run /var /home /tmp -type f -perm -004 -size -20M -print0 2>/dev/null |
  xargs -0 -r grep -lF -f "$p" 2>/dev/null | sed 's/^/world-readable /'
grep -rlF -f "$p" /etc/spark/secrets | sed 's/^/secret file /'
rm -f "$p"
"""
# pyinfra's output of each deploy in this module: searched for the secrets too.
OUTPUTS: list[str] = []


def text_of(result: subprocess.CompletedProcess) -> str:
    """pyinfra's output without its colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)


def changes(result: subprocess.CompletedProcess) -> int:
    """The number of host-operations pyinfra reports as changed (its results table)."""
    text = text_of(result)
    total = re.search(r"Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", text)
    assert total, f"no results table in pyinfra's output:\n{text}"
    _hosts, changed, errors, _unchanged = total.groups()
    assert errors == "-", f"pyinfra reported errors:\n{text}"
    return 0 if changed == "-" else int(changed)


def host_snapshot(host: simlab.Host) -> str:
    """What the deploy changes, read straight from the host."""
    return run_on(host, "dpkg-query -W 'nvidia*' 2>/dev/null; apt-mark showhold; "
                        "nmcli -t -f NAME,DEVICE connection show; ls /etc/apt/preferences.d "
                        "/etc/apt/sources.list.d /etc/spark 2>&1; cat /etc/docker/daemon.json "
                        "2>&1", check=False)  # fmt: skip


def as_root(host: simlab.Host, script: str, stdin: str) -> str:
    """A script's stdout, run by root on a box, given `stdin` (which stays out of every argv)."""
    result = subprocess.run(
        ["ssh", "-F", str(STATE / "ssh_config"), "-o", "BatchMode=yes", host.name,
         f"sudo sh -c {shlex.quote(script)}"],
        input=stdin, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return result.stdout


# The sentinels planted before the first deploy: the token, and each box's lane keys.
PLANTED: dict[str, str] = {}


@pytest.fixture(scope="module")
def bare(lab: simlab.Lab) -> Iterator[simlab.Lab]:
    reimage_all(lab)
    PLANTED["hf"] = f"hf_SENTINEL{secrets.token_hex(16)}"
    HF_TOKEN_FILE.write_text(PLANTED["hf"])
    try:
        for host in lab.hosts:
            for lane in LANES:
                key = f"SENTINEL-{host.name}-{lane['name']}-{secrets.token_hex(16)}"
                PLANTED[f"{host.name} {lane['name']}"] = key
                as_root(host, f"install -d -m 700 {box_paths.SECRETS_DIR}; umask 077;"
                              f" cat > {box_paths.key_path(lane['name'])}", key)  # fmt: skip
        yield lab
    finally:
        HF_TOKEN_FILE.unlink(missing_ok=True)  # the default after this module: no token


def test_dry_run_changes_nothing(bare: simlab.Lab) -> None:
    before = [host_snapshot(host) for host in bare.hosts]
    result = pyinfra(INVENTORY, "deploy.py", "--dry")
    assert "spark-1" in result.stdout + result.stderr
    assert [host_snapshot(host) for host in bare.hosts] == before


def detected(result: subprocess.CompletedProcess) -> list[str]:
    """The rows of pyinfra's "Detected changes" table (a run without -y) that name boxes."""
    table = text_of(result).split("--> Detected changes:", 1)[1]
    table = table.split("Detected changes may not", 1)[0]
    return [line.strip() for line in table.splitlines() if re.search(r"\d+ \(spark-", line)]


def test_first_deploy_converges(bare: simlab.Lab) -> None:
    # The command as README's quick start ("5. Deploy") types it: no -y, Enter after the plan
    # (46 s from bare on a 2-core machine shared with other labs; the second, below, 16 s).
    result = pyinfra(INVENTORY, "deploy.py", typed=True)
    OUTPUTS.append(text_of(result))
    assert "Press enter to execute" in result.stderr
    assert detected(result), result.stderr  # the plan showed what it would change
    assert changes(result) > 0


def test_driver_580_is_installed_held_and_running(bare: simlab.Lab) -> None:
    for host in bare.hosts:
        assert "nvidia-driver-580-open" in run_on(host, "apt-mark showhold").split()
        smi = run_on(host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
        assert smi.strip() == "580.142"


def test_apt_refuses_the_590_branch_even_through_the_metapackage(bare: simlab.Lab) -> None:
    host = bare.hosts[0]
    plan = run_on(host, "apt-get install -s nvidia-driver-open 2>&1", check=False)
    assert "Inst nvidia-driver-590-open" not in plan
    policy = run_on(host, "apt-cache policy nvidia-driver-590-open")
    assert re.search(r"Candidate: \(none\)", policy), policy
    upgrade = run_on(host, "apt-get -s dist-upgrade 2>&1")
    assert "590" not in upgrade


def test_fabric_twins_carry_jumbo_frames(bare: simlab.Lab) -> None:
    a, b = bare.hosts
    for n, twin in enumerate(TWINS):
        for host in bare.hosts:
            assert run_on(host, f"cat /sys/class/net/{twin}/mtu").strip() == "9000"
        peer = f"192.168.{100 + n}.11"
        ping = run_on(a, f"ping -c 1 -W 3 -M do -s 8972 -I {twin} {peer}", check=False)
        assert "1 received" in ping, f"{twin}: {ping}"
    profiles = run_on(b, "nmcli -t -f NAME,DEVICE connection show --active")
    # NetworkManager's automatic "Wired connection N" profiles are gone from the twins.
    assert "Wired connection" not in profiles


def test_gid_index_3_is_roce_v2_ipv4_on_both_hcas(bare: simlab.Lab) -> None:
    for host in bare.hosts:
        for n, (_twin, hca) in enumerate(simlab.FABRIC_TWINS):
            port = f"/sys/class/infiniband/{hca}/ports/1"
            gid = run_on(host, f"cat {port}/gids/3 {port}/gid_attrs/types/3").split("\n")
            last_octet = 10 + host.index - 1
            assert gid[0].endswith(f":ffff:c0a8:{100 + n:02x}{last_octet:02x}"), gid
            assert gid[1] == "RoCE v2"


def test_cluster_environment_file(bare: simlab.Lab) -> None:
    for host in bare.hosts:
        env = run_on(host, "cat /etc/spark/cluster.env")
        own = f"192.168.100.{9 + host.index}"
        assert re.search(rf"^VLLM_HOST_IP=\"?{re.escape(own)}\"?$", env, re.M), env
        assert re.search(r"^MASTER_ADDR=\"?192\.168\.100\.10\"?$", env, re.M), env
        assert re.search(r"^RAY_memory_monitor_refresh_ms=\"?0\"?$", env, re.M), env
        assert re.search(r"^NCCL_IB_HCA=\"?rocep1s0f1,roceP2p1s0f1\"?$", env, re.M), env
        assert re.search(r"^NCCL_IB_ADDR_FAMILY=\"?AF_INET\"?$", env, re.M), env
        assert "NCCL_IB_GID_INDEX" not in env  # NCCL selects each box's entry (roce.py)
        assert run_on(host, "stat -c '%U %a' /etc/spark/cluster.env").strip() == "root 644"
        # Login shells see it too.
        login = run_on(host, "bash -lc 'echo $RAY_memory_monitor_refresh_ms $VLLM_HOST_IP'")
        assert login.split() == ["0", own]


def test_container_toolkit_and_docker_runtime(bare: simlab.Lab) -> None:
    for host in bare.hosts:
        version = run_on(host, "dpkg-query -W -f '${Version}' nvidia-container-toolkit")
        assert version == "1.19.0-1"
        runtimes = run_on(host, "sudo docker info --format '{{json .Runtimes}}'")
        assert '"nvidia"' in runtimes


def test_host_hygiene(bare: simlab.Lab) -> None:
    for host in bare.hosts:
        logind = run_on(host, "systemd-analyze cat-config systemd/logind.conf")
        assert re.search(r"^RemoveIPC=no", logind, re.M)
        # Only sshd's listener is protected: a unit-wide OOMScoreAdjust would hand -1000 to
        # every login and whatever runs from it (the kernel would kill docker instead).
        assert run_on(host, "cat /proc/self/oom_score_adj").strip() != "-1000"
        assert run_on(host, "systemctl show -p OOMScoreAdjust --value ssh").strip() == "0"
        pid = run_on(host, "systemctl show -p MainPID --value ssh").strip()
        listener = run_on(host, f"cat /proc/{pid}/oom_score_adj").strip()
        capabilities = run_on(host, "sudo grep CapEff /proc/self/status").split()[1]
        if int(capabilities, 16) & (1 << 24):  # CAP_SYS_RESOURCE: lowering a score needs it
            assert listener == "-1000"
        else:  # the lab's sandbox withholds it: the deploy then leaves the score alone
            assert listener == "0"


def test_second_deploy_changes_nothing(bare: simlab.Lab) -> None:
    before = [host_snapshot(host) for host in bare.hosts]
    result = pyinfra(INVENTORY, "deploy.py", "--debug", typed=True)
    OUTPUTS.append(text_of(result))
    assert detected(result) == [], result.stderr  # nothing planned,
    assert changes(result) == 0, result.stdout  # nothing done
    assert [host_snapshot(host) for host in bare.hosts] == before
    # A box is asked what its five stages read in one command (operations/asked.py; deploy.py
    # says every stage's questions first), in change detection; with nothing changed, the
    # execution asks nothing again. pyinfra detects box after box: the first box's NCCL check
    # reads the other's verdict before the other's stages are prepared, in a command of its own.
    asked = re.findall(r"Running command on (\S+):", result.stdout + result.stderr)
    assert sorted(asked.count(host.name) for host in bare.hosts) == [1, 2]


@pytest.mark.parametrize("mode", ["--serial", "--no-wait"])
def test_serial_and_no_wait_are_refused_on_the_pair_before_any_operation(
    bare: simlab.Lab, mode: str
) -> None:
    result = pyinfra(INVENTORY, "deploy.py", mode, check=False)
    output = text_of(result)
    assert result.returncode == 1, output
    assert re.search(rf"--> pyinfra error.*: {mode} runs (every|each)", output), output
    assert "operations need all 2 boxes of this run at each step" in output
    assert "Beginning operation run" not in output and "Starting operation" not in output


def test_secrets_are_in_their_files_and_nowhere_else(bare: simlab.Lab) -> None:
    ray_token = run_on(bare.hosts[0], f"sudo cat {ray.TOKEN_PATH}").strip()
    assert len(ray_token) == 64
    # Each box's metrics key, made on the box (operations/metrics.py), is searched for too.
    metrics_keys = [run_on(host, f"sudo cat {metrics.KEY_PATH}").strip() for host in bare.hosts]
    assert all(len(key) == 43 for key in metrics_keys)  # 32 random bytes, base64 unpadded
    every = [*PLANTED.values(), ray_token, *metrics_keys]
    # The deploy kept the planted keys, and the lanes serve with them.
    for host in bare.hosts:
        for lane in LANES:
            assert (
                run_on(host, f"sudo cat {box_paths.key_path(lane['name'])}").strip()
                == PLANTED[f"{host.name} {lane['name']}"]
            )
    keys = [box_paths.key_path(lane["name"]) for lane in LANES]
    secret_files = {
        f"secret file {path}"
        for path in (ray.TOKEN_PATH, box_paths.HF_TOKEN, metrics.KEY_PATH, *keys)
    }
    for host in bare.hosts:
        places = as_root(host, SEARCH, "".join(f"{secret}\n" for secret in every)).splitlines()
        assert set(places) == secret_files, f"{host.name}: secrets found in {places}"
    clients = "".join(path.read_text() for path in CLIENTS.glob("*.json"))
    assert len(OUTPUTS) == 2  # the first deploy's and the second's
    for place, text in (("pyinfra's output", "".join(OUTPUTS)), ("client files", clients)):
        assert not [secret for secret in every if secret in text], f"a secret in {place}"
