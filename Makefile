# The two commands: `make demo` (the main job) and `make test` (every test).
# Both do all set-up on a fresh Debian 12 machine as root; nothing is installed by hand.

SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.8
TOOLS := $(CURDIR)/.tools
UV := $(TOOLS)/bin/uv
VENV := $(CURDIR)/.venv
# prometheus: for promtool (its daemon is not started); chromium: the dashboard's browser tests;
# clang and libbpf-dev build the agent's eBPF object, libbpf1 loads it; prometheus-postgres-exporter:
# the live canary's application SLI, read from a real exporter in front of pgbench's database
# mariadb-server with sysbench (and prometheus-mysqld-exporter: every query's time, its SLI), and
# redis-server (its append-only file) with redis-benchmark: the live canary judged on
# applications nobody here tuned it to (bench.live_apps); tuned: its real profile files, read by the
# agent to say what else sets a device's queue (its daemon is not started)
DEBIAN_PACKAGES := python3 python3-venv ca-certificates git util-linux e2fsprogs fio rocksdb-tools systemd qemu-system-x86 busybox-static cpio prometheus chromium clang libbpf-dev libbpf1 prometheus-postgres-exporter sparse perl mariadb-server sysbench prometheus-mysqld-exporter redis-server tuned

export PATH := $(TOOLS)/bin:$(VENV)/bin:$(PATH)
# Use the machine's Python; never download one.
export UV_PYTHON := $(PYTHON)
export UV_PYTHON_DOWNLOADS := never

.PHONY: demo test setup system-packages lint contracts docs typecheck unit bench dist clean

# The demo keeps its database, tokens and agent state in .demo/ unless told otherwise.
demo: setup
	BLKPILOT_DATA_DIR=$${BLKPILOT_DATA_DIR:-$(CURDIR)/.demo} blkpilot demo

test: setup lint contracts typecheck docs unit

# The agent's eBPF objects. CO-RE: compiled once, relocated by libbpf against the running
# kernel's BTF when they are loaded.
BPF_OBJECTS := agent/ebpf/blklat.bpf.o

setup: system-packages $(VENV)/.synced $(BPF_OBJECTS)

agent/ebpf/%.bpf.o: agent/ebpf/%.bpf.c agent/ebpf/build.sh | system-packages
	sh agent/ebpf/build.sh $< $@

system-packages:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if ! $(PYTHON) -c 'import venv, ensurepip' 2>/dev/null; then missing="$$missing python3-venv"; fi; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  guard=""; if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    printf '#!/bin/sh\n# blkpilot: packages installed for tools start no daemons\nexit 101\n' \
	      > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && guard=yes; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  status=$$?; [ -n "$$guard" ] && rm -f /usr/sbin/policy-rc.d; exit $$status; \
	fi

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# Everything from uv.lock, exactly: the project with all extras and the dev tools.
$(VENV)/.synced: $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --all-extras
	@touch $@

lint:
	ruff check .
	ruff format --check .

# the layout's import contracts (pyproject.toml [tool.importlinter])
contracts:
	lint-imports --no-cache

# the documentation site, strictly: a broken link or a page left out of the nav fails
docs:
	NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir .site

typecheck:
	mypy

# two workers (this machine's cores), a test file to each at a time: module fixtures (a lab
# boot, a fleet) are set up once, and much of the suite waits on processes and devices. Then
# the tests marked solo, alone: they judge a change against the host's own noise, and the
# other worker's bursts are more than the CPU hog on one core they are held to
unit:
	pytest --numprocesses 2 --dist loadfile -m "not solo"
	pytest -m solo

# Every benchmark's full run, one after another (hours; python -m bench list says which
# takes how long): python -m bench run NAME runs one
bench: setup
	for name in $$(python -m bench list | cut -d' ' -f1); do \
	  python -m bench run $$name || exit $$?; \
	done

# What a deployment installs (docs/operations.md, "Deploying"): the wheel built from this
# checkout, and the locked versions of everything it depends on as pip constraints, so that a
# node gets exactly what was tested (the roles' blkpilot_*_constraints)
dist: setup
	rm -rf dist && $(UV) build --wheel -q -o dist
	$(UV) export --frozen --all-extras --no-dev --no-hashes --no-emit-project \
	  --format requirements.txt -q -o dist/constraints.txt

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .pytest_cache .site
