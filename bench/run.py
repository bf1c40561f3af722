"""What a deploy costs on the simulated lab, against the cost of only asking its questions.

    SIMLAB_ID=<n> python -m bench.run [--reps 3] [--converge-reps 2] [--hosts 8]

Boots its own lab (as root; SIMLAB_ID keeps it apart from other labs), measures each run
several times, alternating the variants within each repetition (minimum and median: these
machines are noisy), prints a table and writes it as JSON (bench-results.json):

- the first converge of 2 bare hosts, on freshly reimaged hosts each time; the serving image
  is loaded into each host's docker before the clock starts (on a real box it is a pull);
- the no-change re-run on 2 hosts, with -y and without it (pyinfra's change-detection pass,
  then Enter: what a person types), pyinfra as it ships;
- pyinfra with an empty deploy (start, validate, connect, disconnect): the floor of any run;
- pyinfra asking only the questions (bench/questions_deploy.py: the empty deploy, the plan, and
  each host asked the no-change run's questions in its one command): the floor of a no-change
  run through pyinfra, which the no-change -y run is measured against as well as the limit;
- the limit: the distinct fact commands of the no-change run, asked of each host in one SSH
  session as one script under one sudo, hosts in parallel;
- `make status` (stages/status.py: every box's metrics endpoint, no SSH; issue 28 asks under 2 s
  for 8 boxes), with each box's metrics key copied as the README says;
- on a lab of --hosts bare hosts (0 skips it): one first converge, the same no-change runs,
  empty deploy, limit and `make status`.

Remote commands are counted on the hosts, not in the code: sshd logs every session (each
command and file transfer) once this script sets LogLevel VERBOSE there; its journal is read
from the host's disk, so reading it adds no session.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from operations.metrics import KEY_PATH
from tests.conftest import reimage_all
from tests.e2e.test_host_layer import changes
from tests.simlab import lab as simlab
from tests.simlab.paths import REPO, STATE

PYINFRA = str(REPO / ".venv/bin/pyinfra")
INVENTORY = "inventories/sim.py"
DEPLOY = "deploy.py"
EMPTY_DEPLOY = str(Path(__file__).with_name("empty_deploy.py"))
QUESTIONS_DEPLOY = str(Path(__file__).with_name("questions_deploy.py"))
STARTED = re.compile(r"Starting session: (command|subsystem)")
CLOSED = re.compile(r"session closed for user")  # pam_unix, as the client's connection ends
STEADY = 10  # seconds
COMMAND_LINE = re.compile(r"Running command on (\S+): \(pty=\w+\) (.*)$")
# -y or not, for each no-change variant
VARIANTS = {"no_change": True, "no_change_confirm": False}


# --- the lab hosts' own record of what ran ------------------------------------------------------


def journal(host: simlab.Host, *args: str) -> str:
    """The host's journal, read from its disk (a host just booted may not have flushed it yet)."""
    argv = ["journalctl", "-D", str(host.dir / "root/var/log/journal"), "--no-pager", *args]
    deadline = time.monotonic() + 30
    while (result := subprocess.run(argv, capture_output=True, text=True)).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host.name}: journalctl failed: {result.stderr}")
        time.sleep(0.5)
    return result.stdout


def cursor(host: simlab.Host) -> str:
    return journal(host, "-n", "0", "--show-cursor").split("-- cursor: ")[1].strip()


def count_sessions(text: str) -> int | None:
    """SSH sessions (commands and file transfers) in sshd's journal text; None while the
    client's connection is not over (pam_unix logs its end last)."""
    return len(STARTED.findall(text)) if CLOSED.search(text) else None


def sessions_since(host: simlab.Host, after: str) -> int:
    """SSH sessions the host started after the cursor, once the client's connection is over
    (journald may write the last lines a moment after the client exits). Should the end of
    the connection not show (3 times in one bench run), a count that held for
    STEADY seconds is taken, and said on stderr."""
    count, since, deadline = None, time.monotonic(), time.monotonic() + 120
    while time.monotonic() < deadline:
        text = journal(host, "--after-cursor", after, "-o", "cat", "_COMM=sshd")
        now, ended = len(STARTED.findall(text)), count_sessions(text) is not None
        if now != count:
            count, since = now, time.monotonic()
        elif ended or time.monotonic() - since > STEADY:
            if not ended:
                print(f"{host.name}: no end of connection in sshd's journal", file=sys.stderr)
            return now
        time.sleep(0.3)
    raise RuntimeError(f"{host.name}: sshd's journal did not settle")


def prepare_hosts(lab: simlab.Lab) -> None:
    """sshd logs each session (a fresh image logs only logins); the serving image is pulled
    before the clock starts (the converges are timed without it, as before the lab pulled)."""
    for host in lab.hosts:
        simlab.pull_image(host)
        # journald may still be writing to /run only (read here from the host's disk).
        simlab.ssh(host, "echo LogLevel VERBOSE | sudo tee /etc/ssh/sshd_config.d/00-bench.conf"
                         " >/dev/null && sudo journalctl --flush"
                         " && sudo systemctl reload ssh")  # fmt: skip
        # sshd re-executes itself on reload (systemctl does not wait for it): a moment
        # without a listener.
        time.sleep(0.5)
        simlab.wait_for_sshd(host, time.monotonic() + simlab.BOOT_TIMEOUT)


# --- runs ---------------------------------------------------------------------------------------


def pyinfra(lab: simlab.Lab, *args: str, yes: bool = True) -> dict:
    """One pyinfra run: wall time, this machine's CPU time for it (pyinfra's own work), output,
    and the sessions each host saw."""
    env = dict(os.environ, SIMLAB_STATE=str(STATE))
    cursors = {host.name: cursor(host) for host in lab.hosts}
    argv = [PYINFRA, *(["-y"] if yes else []), INVENTORY, *args]
    start, used = time.monotonic(), cpu_of_children()
    # Without -y pyinfra asks before it executes: the newline answers.
    result = subprocess.run(argv, cwd=REPO, env=env, input="\n", capture_output=True, text=True)
    seconds, cpu = time.monotonic() - start, cpu_of_children() - used
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}")
    sessions = {host.name: sessions_since(host, cursors[host.name]) for host in lab.hosts}
    return {"seconds": seconds, "cpu": cpu, "sessions": sessions, "result": result}


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def no_change(lab: simlab.Lab, yes: bool) -> dict:
    run = pyinfra(lab, DEPLOY, yes=yes)
    if changed := changes(run["result"]):
        raise RuntimeError(f"a re-run changed {changed} host-operations: not a no-change run")
    return run


def fact_commands(output: str) -> dict[str, list[str]]:
    """The commands pyinfra's --debug output says it ran on each host, in order: with nothing to
    change, each is one fact's command (pyinfra runs it as ``sudo -H -n sh -c '<command>'``)."""
    sent: dict[str, list[str]] = {}
    lines = iter(output.splitlines())
    for line in lines:
        if match := COMMAND_LINE.search(line):
            name, command = match.groups()
            argv = None
            while argv is None:
                try:
                    argv = shlex.split(command)
                except ValueError:  # a script of several lines (nmcli.py's netplan reader)
                    if (more := next(lines, None)) is None:
                        raise RuntimeError(f"a command left open: {command}") from None
                    command += "\n" + more
            if argv[:5] != ["sudo", "-H", "-n", "sh", "-c"] or len(argv) != 6:
                raise RuntimeError(f"not a fact command of this deploy: {command}")
            sent.setdefault(name, []).append(argv[5])
    return sent


def questions(lab: simlab.Lab) -> dict[str, list[str]]:
    """The distinct commands a no-change -y run sends each host (one per fact), as pyinfra
    logged them; their number is checked against the hosts' own count."""
    run = pyinfra(lab, "--debug", DEPLOY)
    sent = fact_commands(run["result"].stdout + run["result"].stderr)
    counted = {name: len(commands) for name, commands in sent.items()}
    if counted != run["sessions"]:
        raise RuntimeError(f"pyinfra logged {counted} commands, the hosts saw {run['sessions']}")
    return {name: list(dict.fromkeys(commands)) for name, commands in sent.items()}


def limit_script(commands: list[str]) -> str:
    """The questions as one script: each in its own subshell, stdin closed, as pyinfra's
    ``sh -c`` runs them; run under one sudo."""
    script = "; ".join(f"( {command} ) </dev/null" for command in commands)
    return f"sudo -H -n sh -c {shlex.quote(script)} >/dev/null"


def limit(lab: simlab.Lab, asked: dict[str, list[str]]) -> dict:
    """Every host asked all its questions in one SSH session, one script, hosts in parallel."""

    def ask(host: simlab.Host) -> None:
        simlab.ssh(host, limit_script(asked[host.name]))

    cursors = {host.name: cursor(host) for host in lab.hosts}
    start = time.monotonic()
    with ThreadPoolExecutor(len(lab.hosts)) as pool:
        list(pool.map(ask, lab.hosts))
    seconds = time.monotonic() - start
    sessions = {host.name: sessions_since(host, cursors[host.name]) for host in lab.hosts}
    return {"seconds": seconds, "sessions": sessions}


def status(lab: simlab.Lab, keys: Path) -> dict:
    """`make status` once: its wall time and exit status (1 where a row is red), and the SSH
    sessions the hosts saw meanwhile (none: it reads the metrics endpoints)."""
    cursors = {host.name: cursor(host) for host in lab.hosts}
    argv = [sys.executable, "-m", "stages.status", "--inventory", INVENTORY]
    argv += ["--keys-dir", str(keys)]
    start = time.monotonic()
    result = subprocess.run(argv, cwd=REPO, env=dict(os.environ, SIMLAB_STATE=str(STATE)),
                            capture_output=True, text=True)  # fmt: skip
    seconds = time.monotonic() - start
    sessions = {host.name: sessions_since(host, cursors[host.name]) for host in lab.hosts}
    return {"seconds": seconds, "sessions": sessions, "exit": result.returncode}


def available_gib() -> float:
    """MemAvailable of this machine, which runs every lab host."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return round(int(line.split()[1]) / 2**20, 1)
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def summarize(runs: list[dict]) -> dict[str, object]:
    seconds = [round(run["seconds"], 3) for run in runs]
    commands = sorted({n for run in runs for n in run["sessions"].values()})
    summary = {"min": min(seconds), "median": statistics.median(seconds), "runs": seconds,
               "commands_per_host": commands}  # fmt: skip
    if all("cpu" in run for run in runs):
        summary["cpu_median"] = round(statistics.median(run["cpu"] for run in runs), 3)
    return summary


def converged_lab(lab: simlab.Lab, reps: int) -> dict[str, dict]:
    """The no-change variants, the empty deploy and the limit, alternating in each repetition."""
    asked = questions(lab)
    keys = Path(tempfile.mkdtemp(prefix="bench-metrics-keys-"))
    for host in lab.hosts:  # each box's metrics key, one file per box (README)
        (keys / f"{host.name}.key").write_text(simlab.ssh(host, f"sudo cat {KEY_PATH}"))
    names = [*VARIANTS, "empty_deploy", "questions_only", "limit", "status"]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(reps):
        for name, yes in VARIANTS.items():
            runs[name].append(no_change(lab, yes))
        runs["empty_deploy"].append(pyinfra(lab, EMPTY_DEPLOY))
        runs["questions_only"].append(pyinfra(lab, QUESTIONS_DEPLOY))
        runs["limit"].append(limit(lab, asked))
        runs["status"].append(status(lab, keys))
    results = {name: summarize(entries) for name, entries in runs.items()}
    results["status"]["exits"] = sorted({run["exit"] for run in runs["status"]})
    results["questions_per_host"] = sorted({len(q) for q in asked.values()})
    return results


def first_converges(lab: simlab.Lab, reps: int) -> dict[str, dict]:
    runs = []
    for _ in range(reps):
        reimage_all(lab)
        prepare_hosts(lab)
        runs.append(pyinfra(lab, DEPLOY))
    return {"first_converge": summarize(runs)}


# --- report -------------------------------------------------------------------------------------

LABELS = {
    "first_converge": "first converge, bare hosts, -y",
    "no_change": "no-change re-run, -y",
    "no_change_confirm": "no-change re-run, without -y (change detection, Enter)",
    "empty_deploy": "pyinfra with an empty deploy (start + connect)",
    "questions_only": "pyinfra asking only the questions, one command",
    "limit": "limit: one SSH session, one script per host",
    "status": "make status (metrics endpoints, no SSH)",
}


def table(results: dict) -> str:
    lines = [f"{'run':58} {'hosts':>5} {'min s':>7} {'median s':>9} {'commands/host':>14}"
             f" {'pyinfra CPU s':>14}"]  # fmt: skip
    for hosts, section in results["labs"].items():
        for name, label in LABELS.items():
            if name in section:
                entry = section[name]
                commands = ",".join(str(n) for n in entry["commands_per_host"])
                cpu = f"{entry['cpu_median']:.2f}" if "cpu_median" in entry else "-"
                lines.append(f"{label:58} {hosts:>5} {entry['min']:7.2f} {entry['median']:9.2f}"
                             f" {commands:>14} {cpu:>14}")  # fmt: skip
    lines.append("")
    lines += [f"{name:64} {value:7.2f}" for name, value in results["ratios"].items()]
    return "\n".join(lines)


def ratios(labs: dict[str, dict]) -> dict[str, float]:
    labs = {hosts: section for hosts, section in labs.items() if "limit" in section}
    if not labs:
        return {}
    out = {}
    for hosts, section in labs.items():
        for name in VARIANTS:
            out[f"{name} / limit, {hosts} hosts (medians)"] = (
                section[name]["median"] / section["limit"]["median"]
            )
        if "questions_only" in section:  # what pyinfra's start and one command take already
            out[f"questions_only / limit, {hosts} hosts (medians)"] = (
                section["questions_only"]["median"] / section["limit"]["median"]
            )
            out[f"no_change / questions_only, {hosts} hosts (medians)"] = (
                section["no_change"]["median"] / section["questions_only"]["median"]
            )
        # issue 27: the run without -y within 1.5x its own -y run
        out[f"no_change_confirm / no_change, {hosts} hosts (medians)"] = (
            section["no_change_confirm"]["median"] / section["no_change"]["median"]
        )
    small, *large = labs
    for hosts in large:
        for name in VARIANTS:
            out[f"{name}, {hosts} hosts / {small} hosts (medians)"] = (
                labs[hosts][name]["median"] / labs[small][name]["median"]
            )
    return {name: round(value, 2) for name, value in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each no-change run")
    parser.add_argument("--converge-reps", type=int, default=2, help="of each first converge")
    parser.add_argument("--hosts", type=int, default=8, help="the larger lab (0: skip it)")
    parser.add_argument("--json", default=str(REPO / "bench-results.json"))
    args = parser.parse_args()  # fmt: skip
    if os.geteuid() != 0:
        parser.error("the lab needs root")

    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "memory_gib": round(memory, 1),
                    "load_average_at_start": os.getloadavg(), "python": platform.python_version()},
        "reps": args.reps, "converge_reps": args.converge_reps, "labs": {},
    }  # fmt: skip

    started = time.monotonic()

    def save(moment: str) -> None:
        """Results so far, with this machine's load (other labs may run on it too)."""
        results["machine"][f"load_average_{moment}"] = os.getloadavg()
        results["machine"][f"available_gib_{moment}"] = available_gib()
        results["ratios"] = ratios(results["labs"])
        results["bench_seconds"] = round(time.monotonic() - started)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")

    try:
        simlab.down()
        save("no_lab")
        lab = simlab.up(2)
        results["labs"]["2"] = first_converges(lab, args.converge_reps)
        save("2_hosts_converged")
        results["labs"]["2"] |= converged_lab(lab, args.reps)
        save("2_hosts_measured")
        if args.hosts:
            lab = simlab.up(args.hosts)
            prepare_hosts(lab)
            # Once: a bare lab of this size is booted once (reimaging it all again is slow).
            first = summarize([pyinfra(lab, DEPLOY)])
            results["labs"][str(args.hosts)] = {"first_converge": first}
            save(f"{args.hosts}_hosts_converged")
            results["labs"][str(args.hosts)] |= converged_lab(lab, args.reps)
            save(f"{args.hosts}_hosts_measured")
    finally:
        simlab.down()
    print(table(results))
    print(f"\n{args.json} written; the bench took {results['bench_seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
