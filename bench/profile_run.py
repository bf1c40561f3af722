"""Where a pyinfra run spends this machine's CPU (issue 40: profile a no-change run): pyinfra's
command line run in this process under cProfile, CPU time (time.process_time) as its clock, so
that waiting on the boxes costs nothing and a loaded machine shifts the figures less than wall
time would.

    SIMLAB_ID=<n> python -m bench.profile_run [--top 40] [--stats PATH] -- \
        -y inventories/sim.py deploy.py

Prints the CPU seconds of pyinfra's phases (its own functions' cumulative time: reading the
inventory and group_data, connecting, loading deploy.py once per box, which calls every
operation, executing the operations) and the top entries by cumulative time. cProfile's own
cost inflates many small calls (a run's 2.3 s of CPU reads about 6 s profiled): compare the
shares, or runs profiled alike.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

# pyinfra 3.10's functions that make a run's phases (pyinfra_cli/cli.py ``_main`` calls them in
# this order), by module and name; tests/unit/test_pyinfra_internals.py pins them.
PHASES = {
    "inventory and group_data": ("pyinfra_cli/inventory.py", "make_inventory"),
    "connect": ("pyinfra/api/connect.py", "connect_all"),
    "deploy.py loaded per box (operations called)": ("pyinfra_cli/util.py", "load_deploy_file"),
    "operations executed": ("pyinfra/api/operations.py", "run_ops"),
}


def profiled(argv: list[str]) -> cProfile.Profile:
    """pyinfra's command line with argv, under cProfile on CPU time; its exit status kept."""
    from pyinfra_cli.main import main as pyinfra_main  # gevent patches this process: here only

    profile = cProfile.Profile(time.process_time)
    sys.argv = ["pyinfra", *argv]
    try:
        profile.runcall(pyinfra_main)
    except SystemExit as exit_:
        if exit_.code:
            raise
    return profile


def phases(stats: pstats.Stats) -> dict[str, float]:
    """Each phase's cumulative CPU seconds (its function's, over every call)."""
    seconds = dict.fromkeys(PHASES, 0.0)
    for (filename, _line, function), (*_, cumulative, _callers) in stats.stats.items():
        for phase, (path, name) in PHASES.items():
            if function == name and filename.endswith(path):
                seconds[phase] += cumulative
    return seconds


def top(profile: cProfile.Profile, count: int) -> str:
    """The first `count` entries by cumulative time, as pstats prints them."""
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(count)
    text = out.getvalue()
    return text[text.find("   ncalls") :]


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile_run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--top", type=int, default=40, help="entries printed")
    parser.add_argument("--stats", type=Path, help="also the raw stats here (pstats, snakeviz)")
    parser.add_argument("pyinfra", nargs=argparse.REMAINDER, help="pyinfra's own arguments")
    args = parser.parse_args()
    argv = args.pyinfra[1:] if args.pyinfra[:1] == ["--"] else args.pyinfra
    if not argv:
        parser.error("give pyinfra's arguments after --, e.g. -- -y inventories/sim.py deploy.py")
    profile = profiled(argv)
    stats = pstats.Stats(profile)
    if args.stats:
        stats.dump_stats(args.stats)
    print(f"\nprofiled CPU seconds, in all: {stats.total_tt:.2f}")
    for phase, seconds in phases(stats).items():
        print(f"  {phase:48} {seconds:6.2f}")
    print(f"\ntop {args.top} by cumulative CPU time:\n{top(profile, args.top)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
