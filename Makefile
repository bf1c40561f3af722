# The newcomer's two commands (README): `make demo` and `make test`. Both run as root on a fresh
# Debian/Ubuntu machine and install what they need (host packages, a pinned virtualenv). An
# owner's control machine needs only `make venv` (no root where python3 has venv and ensurepip).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum requirements.txt | cut -c1-12)

INVENTORY ?= inventories/lab.py

.PHONY: venv demo test unit plan compliance lane-bench lab-up lab-down bench copy-bench \
	router-bench on-demand-bench prometheus-config status clients variables

$(STAMP): requirements.txt
	@command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null \
	  || { [ "$$(id -u)" = 0 ] || { echo "python3 with venv and ensurepip is needed: as root," \
	         "apt-get install python3 python3-venv"; exit 1; }; \
	       apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv; }
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt
	rm -f $(VENV)/.installed-* && touch $@

# The OpenCode client from npm (its package opencode-ai, pinned), which the end-to-end tests run
# against the lab's lanes with what `make clients` wrote; in .tools/, beside the repository.
OPENCODE_VERSION := 1.18.33
OPENCODE_STAMP := .tools/opencode/.installed-$(OPENCODE_VERSION)

$(OPENCODE_STAMP):
	@command -v npm >/dev/null || { [ "$$(id -u)" = 0 ] || { echo "npm is needed: as root," \
	         "apt-get install npm"; exit 1; }; \
	       apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }
	npm install --prefix .tools/opencode --no-save --no-audit --no-fund --loglevel=error \
	  opencode-ai@$(OPENCODE_VERSION)
	rm -f .tools/opencode/.installed-* && touch $@

# The virtualenv alone (.venv, the pinned requirements): what an owner's control machine needs.
venv: $(STAMP)

# Boot the simulated lab, deploy to it, check it, and show an endpoint answering.
demo: $(STAMP)
	$(PY) -m tests.simlab demo

# Lint, unit tests, then end-to-end tests on the simulated lab (SIMLAB=0 skips those). Three
# workers, a lab each (ids SIMLAB_ID, +100 and +200), on two cores: the lab tests wait on
# boots, ssh and services more than they use the CPU (a serial run kept 2 cores 37% busy for
# 37 minutes; two workers took 55 minutes of pytest, three 54: each test ran longer), and each
# worker takes whole units (tests/conftest.py work_unit) in the order collected.
LAB_ID := $(or $(SIMLAB_ID),0)
WORKERS := --dist loadgroup --no-loadscope-reorder \
	$(foreach offset,0 100 200,--tx popen//env:SIMLAB_ID=$(shell echo $$(($(LAB_ID) + $(offset)))))

test: $(STAMP) $(OPENCODE_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m tests.simlab caches  # as root, first: host packages, images, llama-server, wheels
	$(PY) -m pytest -p no:cacheprovider --durations=30 $(WORKERS) tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a broken suite, not a pass"; exit 1; fi; \
	  exit $$rc

unit: $(STAMP)
	$(PY) -m pytest -m "not lab" tests

# What a deploy will do to each box, from the inventory alone (no box is contacted);
# BOX=<name> for one box, JSON=1 for the plan as JSON.
plan: $(STAMP)
	$(PY) -m stages.show_plan --inventory $(INVENTORY) $(if $(BOX),--box $(BOX)) $(if $(JSON),--json)

# docs/variables.md, the inventory's variables reference, written from the keys' declarations
# (spark/inventory/, spark/fleet.py, spark/lane.py) and group_data/all.py's defaults.
variables: $(STAMP)
	$(PY) -m tools.options_reference

# Is every box still what the inventory says? Read-only; INVENTORY=inventories/sim.py for the lab.
compliance: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider tests/compliance --inventory $(INVENTORY) -n 4 --dist loadgroup

# A Prometheus configuration for the inventory's boxes (docs/reference.md: Watching the fleet): OUT/prometheus.yml
# (a scrape job per box, its key read from KEYS=<dir>, else where make clients puts it) and
# OUT/spark-rules.yml (the alerts); no box is contacted.
prometheus-config: $(STAMP)
	$(PY) -m stages.prometheus_config --inventory $(INVENTORY) --out $(or $(OUT),prometheus) \
	  $(if $(KEYS),--keys-dir $(KEYS))

# One table for the whole inventory from the boxes' metrics endpoints (no SSH); exit 1 when anything
# is red. KEYS=<dir> where the boxes' metrics keys are, if not where make clients puts them
# (<box>.key; docs/reference.md: Watching the fleet).
status: $(STAMP)
	@$(PY) -m stages.status --inventory $(INVENTORY) $(if $(KEYS),--keys-dir $(KEYS))

# One opencode.json for the whole fleet in OpenCode's configuration directory (DIR=<dir>, else
# ~/.config/opencode): the router's provider with every served name, its fleet key copied from the
# router's box, 0600 (docs/clients.md); PER_LANE=1: a provider per lane, each with its lane's key,
# instead. Each box's metrics key and the router's fleet key, 0600 too, where make status and
# make prometheus-config read them (KEYS).
clients: $(STAMP)
	$(PY) -m stages.clients --inventory $(INVENTORY) $(if $(DIR),--dir $(DIR)) \
	  $(if $(KEYS),--metrics-keys-dir $(KEYS)) $(if $(PER_LANE),--per-lane)

# Every lane of every box measured against the field's figures (docs/reference.md: Lanes). It loads each
# lane for about a minute, one lane of one box at a time: run it deliberately (deploy.py never
# does); INVENTORY=inventories/sim.py for the lab, whose stand-ins give only their own numbers.
lane-bench: $(STAMP)
	$(VENV)/bin/pyinfra -y --serial $(INVENTORY) lane_bench.py

# What a deploy costs against the cost of only asking its questions (CONTRIBUTING.md:
# Performance). Boots its own lab: SIMLAB_ID=<n> keeps it apart from another one; writes
# bench-results.json.
# BENCH_ARGS passes bench.run's options (make passes none of its own): BENCH_ARGS="--hosts 0".
# Then on-demand-bench's, copy-bench's and router-bench's.
bench: $(STAMP)
	$(PY) -m bench.run $(BENCH_ARGS)
	$(PY) -m bench.on_demand $(ON_DEMAND_BENCH_ARGS)
	$(PY) -m bench.copy_rate $(COPY_BENCH_ARGS)
	$(PY) -m bench.router $(ROUTER_BENCH_ARGS)

# A lane on demand: a request's first token when it starts its lane against the lane's own start
# (CONTRIBUTING.md: Performance, docs/on-demand.md); boots its own lab (SIMLAB_ID=<n>), deploys
# tests/e2e/on_demand_inventory.py; writes on-demand-results.json.
# ON_DEMAND_BENCH_ARGS passes bench.on_demand's options: ON_DEMAND_BENCH_ARGS="--reps 3".
on-demand-bench: $(STAMP)
	$(PY) -m bench.on_demand $(ON_DEMAND_BENCH_ARGS)

# The fleet copy's rate against curl's over the same link (CONTRIBUTING.md: Performance; no lab:
# two network namespaces as root, else loopback); writes copy-rate-results.json.
# COPY_BENCH_ARGS passes bench.copy_rate's options: COPY_BENCH_ARGS="--file-mib 512 --dir /dev/shm".
copy-bench: $(STAMP)
	$(PY) -m bench.copy_rate $(COPY_BENCH_ARGS)

# The fleet's router (LiteLLM's proxy, pinned; docs/design.md: the router) against the lane
# directly, on loopback with the vLLM stand-in: time to first token and requests/s at 16
# concurrent as ratios, its memory; installs its own virtualenv under SPARK_ROUTER_CACHE
# (default /var/cache/spark-router); writes router-results.json.
# ROUTER_BENCH_ARGS passes bench.router's options: ROUTER_BENCH_ARGS="--ttft-samples 50".
router-bench: $(STAMP)
	$(PY) -m bench.router $(ROUTER_BENCH_ARGS)

lab-up: $(STAMP)
	$(PY) -m tests.simlab up

lab-down: $(STAMP)
	$(PY) -m tests.simlab down
