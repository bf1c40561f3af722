"""Write a Prometheus configuration for the inventory's boxes, contacting no box.

    .venv/bin/python -m stages.prometheus_config [--inventory inventories/lab.py] [--out DIR]
        [--keys-dir ~/.config/spark-provisioning/metrics-keys]

`make prometheus-config` runs it: DIR/prometheus.yml (a scrape job per box) and
DIR/spark-rules.yml (the alert rules), from spark/prometheus.py. Each box's metrics key is read
from KEYS_DIR/<box>.key, and each router box's fleet key from KEYS_DIR/fleet/<box>.key, where
`make clients` copies them (docs/reference.md: Watching the fleet).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spark import prometheus
from stages.settings import plan_or_say_why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default="inventories/lab.py")
    parser.add_argument("--out", type=Path, default=Path("prometheus"))
    parser.add_argument("--keys-dir", default=prometheus.KEYS_DIR)
    args = parser.parse_args(argv)
    if (plan := plan_or_say_why(args.inventory)) is None:
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    keys_dir = str(Path(args.keys_dir).expanduser().absolute())  # as Prometheus reads it
    config = prometheus.scrape_config(plan, keys_dir)
    (args.out / "prometheus.yml").write_text(prometheus.dump(config))
    (args.out / prometheus.RULES_FILE).write_text(prometheus.dump(prometheus.rules(plan)))
    boxes = sum(1 for box in plan.boxes if box.metrics is not None)
    routers = len(plan.fleet.boxes)
    lanes = len(config["scrape_configs"]) - boxes - routers
    print(f"{args.out}/prometheus.yml: {boxes} box(es), {lanes} lane(s) and {routers} router(s);"
          f" their keys in {keys_dir}/<box>.key, the routers' fleet keys in"
          f" {prometheus.fleet_key_file(keys_dir, '<box>')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
