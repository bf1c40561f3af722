"""Every secret the deploy handles is in its root-only file on the box, and nowhere else.

Before a deploy from bare hosts, sentinels take the place of the Hugging Face token (the
inventory's token file) and of each lane's API key (a key file already on the box, which the
deploy keeps); the Ray token, the controller's own (shared by every lab on this machine, so not
replaced), and each box's metrics key (made there) are read back from the boxes. Each box is
then searched, as root, for all of them: every process's argv (/proc/*/cmdline, containers'
processes included), the unit files, the whole journal with its metadata (the command lines sudo
and systemd log), `docker inspect` and `docker logs` of every container, and every
world-readable file under /etc, /run, /var, /home and /tmp.
The secrets reach the search on its stdin, never in an argv. The only hits allowed are the
secret files themselves, which the search must find (so it can fail).
"""

from __future__ import annotations

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
from spark.router import ENVIRONMENT as ROUTER_ENVIRONMENT
from tests.conftest import CLIENTS, pyinfra, reimage_all, run_on
from tests.e2e.runs import INVENTORY, output_of
from tests.simlab import lab as simlab
from tests.simlab.paths import REPO, STATE

pytestmark = pytest.mark.lab

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


def as_root(host: simlab.Host, script: str, stdin: str) -> str:
    """A script's stdout, run by root on a box, given `stdin` (which stays out of every argv)."""
    result = subprocess.run(
        ["ssh", "-F", str(STATE / "ssh_config"), "-o", "BatchMode=yes", host.name,
         f"sudo sh -c {shlex.quote(script)}"],
        input=stdin, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return result.stdout


@pytest.fixture(scope="module")
def deployed(lab: simlab.Lab) -> Iterator[dict[str, Any]]:
    reimage_all(lab)
    planted = {"hf": f"hf_SENTINEL{secrets.token_hex(16)}"}
    HF_TOKEN_FILE.write_text(planted["hf"])
    try:
        for host in lab.hosts:
            for lane in LANES:
                key = f"SENTINEL-{host.name}-{lane['name']}-{secrets.token_hex(16)}"
                planted[f"{host.name} {lane['name']}"] = key
                as_root(host, f"install -d -m 700 {box_paths.SECRETS_DIR}; umask 077;"
                              f" cat > {box_paths.key_path(lane['name'])}", key)  # fmt: skip
        output = output_of(pyinfra(INVENTORY, "deploy.py"))
    finally:
        HF_TOKEN_FILE.unlink()
    yield {"lab": lab, "planted": planted, "output": output}
    pyinfra(INVENTORY, "deploy.py")  # the lanes back to no token, for the modules after


def test_secrets_are_in_their_files_and_nowhere_else(deployed: dict[str, Any]) -> None:
    hosts = deployed["lab"].hosts
    ray_token = run_on(hosts[0], f"sudo cat {ray.TOKEN_PATH}").strip()
    assert len(ray_token) == 64
    # Each box's metrics key, made on the box (operations/metrics.py), is searched for too.
    metrics_keys = [run_on(host, f"sudo cat {metrics.KEY_PATH}").strip() for host in hosts]
    assert all(len(key) == 43 for key in metrics_keys)  # 32 random bytes, base64 unpadded
    # The fleet key, made on the router's box (the head: group_data's router_box None).
    fleet_key = run_on(hosts[0], f"sudo cat {box_paths.FLEET_KEY}").strip()
    assert len(fleet_key) == 43
    every = [*deployed["planted"].values(), ray_token, *metrics_keys, fleet_key]
    # The deploy kept the planted keys, and the lanes serve with them.
    for host in hosts:
        for lane in LANES:
            assert (
                run_on(host, f"sudo cat {box_paths.key_path(lane['name'])}").strip()
                == (deployed["planted"][f"{host.name} {lane['name']}"])
            )
    keys = [box_paths.key_path(lane["name"]) for lane in LANES]
    secret_files = {
        f"secret file {path}"
        for path in (ray.TOKEN_PATH, box_paths.HF_TOKEN, metrics.KEY_PATH, *keys)
    }
    # The router's box holds the fleet key and, in the router's environment file, every lane's.
    router_files = {f"secret file {path}" for path in (box_paths.FLEET_KEY, ROUTER_ENVIRONMENT)}
    for host in hosts:
        places = as_root(host, SEARCH, "".join(f"{secret}\n" for secret in every)).splitlines()
        expected = secret_files | (router_files if host is hosts[0] else set())
        assert set(places) == expected, f"{host.name}: secrets found in {places}"
    clients = "".join(path.read_text() for path in CLIENTS.glob("*.json"))
    for place, text in (("pyinfra's output", deployed["output"]), ("client files", clients)):
        assert not [secret for secret in every if secret in text], f"a secret in {place}"
