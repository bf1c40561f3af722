"""The README's "Re-provisioning after a reimage", followed literally on the lab.

A deployed box is reimaged (`python -m tests.simlab reimage`, as the README says: new host keys,
bare disk); until its new key is trusted, the deploy refuses it (host key checking stays on).
The README's commands then run as written, against the lab's known_hosts file instead of
~/.ssh/known_hosts and the lab address instead of spark-2.local; the fingerprint they show is
compared with the one on the box's disk (its console). The same deploy then brings the box back
without touching the other one, the next run changes nothing, and the compliance suite passes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Deployed, pyinfra, run_on
from tests.e2e.runs import INVENTORY, converged, errors, host_results, output_of
from tests.e2e.test_host_layer import host_snapshot
from tests.simlab import lab as simlab
from tests.simlab.paths import REPO, STATE

pytestmark = pytest.mark.lab

README = Path(REPO) / "README.md"
SECTION = "## Re-provisioning after a reimage"
README_BOX = "spark-2.local"


def readme_commands() -> list[str]:
    """The shell lines of the section's first code block (fenced as ```sh)."""
    text = README.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    block = re.search(r"\n```sh\n(.*?)\n```\n", section, re.DOTALL)
    assert block, f"no code block in README's {SECTION!r}"
    return [line.strip() for line in block[1].splitlines()]


def on_the_lab(command: str, address: str) -> str:
    """A README line for the lab: its address for spark-2.local, its known_hosts for the user's
    (ssh-keygen -R edits ~/.ssh/known_hosts unless told another file with -f)."""
    known = shlex.quote(str(STATE / "known_hosts"))
    command = command.replace(README_BOX, address).replace("~/.ssh/known_hosts", known)
    return re.sub(r"(ssh-keygen -R \S+)", rf"\1 -f {known}", command)


def undisturbed(host: simlab.Host) -> str:
    """What a deploy could disturb on a box: what it installs and writes, and when each of its
    containers and services last started."""
    started = run_on(host, "sudo docker ps -q | xargs -r sudo docker inspect -f "
                           "'{{.Name}} {{.State.StartedAt}}'; systemctl show -p "
                           "ActiveEnterTimestamp docker.service systemd-logind.service",
                     check=False)  # fmt: skip
    return host_snapshot(host) + started


@pytest.fixture(scope="module")
def deployed(deployed_lab: Deployed) -> simlab.Lab:
    return deployed_lab.lab


def test_readme_steps_bring_a_reimaged_box_back(deployed: simlab.Lab) -> None:
    spark_1, spark_2 = deployed.hosts
    before = undisturbed(spark_1)
    env = dict(os.environ, SIMLAB_STATE=str(STATE))
    reimaged = subprocess.run(
        [sys.executable, "-m", "tests.simlab", "reimage", spark_2.name], cwd=REPO, env=env,
        capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    console_key = reimaged.stdout.strip().splitlines()[-1]  # "ssh-ed25519 AAAA... root@spark-2"

    refused = pyinfra(INVENTORY, "deploy.py", "--limit", spark_2.name, check=False)
    output = output_of(refused)
    assert refused.returncode == 1, output
    assert f"[{spark_2.name}] SSH host key error" in output, output

    shown = []
    for line in readme_commands():
        step = subprocess.run(
            ["bash", "-o", "pipefail", "-c", on_the_lab(line, spark_2.mgmt_ip)], cwd=REPO,
            capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        shown += re.findall(r"SHA256:\S+", step.stdout)
    console = subprocess.run(["ssh-keygen", "-lf", "-"], input=console_key, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    assert shown and set(shown) == set(re.findall(r"SHA256:\S+", console)), (shown, console)
    known = (STATE / "known_hosts").read_text().splitlines()
    assert [line for line in known if line.startswith(f"{spark_2.mgmt_ip} ")] == [
        f"{spark_2.mgmt_ip} {' '.join(console_key.split()[:2])}"
    ]

    back = pyinfra(INVENTORY, "deploy.py")
    output = output_of(back)
    assert errors(output) == [], output
    assert host_results(output)[spark_2.name]["Success"] > 0
    assert undisturbed(spark_1) == before
    converged()
