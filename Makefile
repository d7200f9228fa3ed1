# trainprobe: `make demo` and `make test` each install what is missing, then run.
# Both create and use a virtual environment at .venv in the repository root.

PYTHON     ?= python3
VENV       := .venv
VPY        := $(VENV)/bin/python
TORCH_PIN  := torch==2.13.0
STAMP      := $(VENV)/.installed
# Debian packages the probes and the tests use (perf, numactl, bcc and kernel headers for eBPF,
# hwloc/pciutils for topology cross-checks, chromium for rendering tests).
APT_PKGS   := linux-perf numactl python3-bpfcc bpfcc-tools bpftool linux-headers-amd64 hwloc pciutils chromium slurm-wlm munge

.PHONY: demo test deps system venv host clean

demo: deps
	$(VENV)/bin/trainprobe demo

# Two runs (tests/conftest.py says which tests are which): the tests whose assertions another test's
# load cannot move run on $(TEST_WORKERS) xdist workers; then the `serial` ones run alone. Both always
# run; `make test` fails if either did.
TEST_WORKERS ?= 2

test: deps
	@rc=0; \
	$(VPY) -m pytest -q -n $(TEST_WORKERS) -m "not serial" tests || rc=$$?; \
	$(VPY) -m pytest -q -m serial tests || rc=$$?; \
	exit $$rc

# Host changes (mounting tracefs, linking kernel headers) happen only when asked: `make host`, or
# TRAINPROBE_PREPARE_HOST=1 (which .ci/run sets). Under CI (TRAINPROBE_REQUIRE_LIVE=1) a failed
# system-package install fails `make`; elsewhere it is reported and the probes that need the
# package say so.
deps: system venv $(if $(filter 1,$(TRAINPROBE_PREPARE_HOST)),host)

# System packages: installed only when missing, and only where we may (root with apt-get).
system:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; \
	    log=$$(mktemp -t trainprobe-apt.XXXXXX); \
	    if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing) >"$$log" 2>&1; \
	    then rm -f "$$log"; \
	    else tail -20 "$$log"; rm -f "$$log"; \
	      if [ "$${TRAINPROBE_REQUIRE_LIVE:-0}" != 0 ]; then echo "apt-get failed:$$missing (CI needs every package)"; exit 1; fi; \
	      echo "apt-get failed: the probes that need$$missing will say so and skip"; fi; \
	  elif [ "$${TRAINPROBE_REQUIRE_LIVE:-0}" != 0 ]; then echo "missing:$$missing and cannot install them (CI needs every package)"; exit 1; \
	  else echo "not root: skipping system packages$$missing (the probes that need them will say so)"; fi; \
	fi

venv: $(STAMP)

$(STAMP): setup.cfg setup.py
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(TORCH_PIN)
	$(VPY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# What eBPF needs on a fresh machine: tracefs, and kernel headers where bcc looks for them.
# Changes the host (a mount, links under /lib/modules): only when asked.
host:
	@sh scripts/prepare-host.sh

clean:
	rm -rf $(VENV) *.egg-info build dist .pytest_cache
