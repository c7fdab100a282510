# The two commands of the README, and the few a developer needs.
#   make demo    set up .venv with PaddlePaddle only (the `paddle` extra) and train the
#                fit-a-line example with 2 trainers, locally
#   make test    what CI runs (.ci/run adds CI=true): set up .venv with the test extras and
#                .venv-checkov, then ruff and the whole test suite
#   make unit    the inner loop: the `unit` tier alone (pure tests: no etcd, no process, no
#                socket; tests/unit_tier.py enforces it), ~1,360 tests in a few minutes
#   make chaos   longer chaos schedules than CI's (tests/chaos/harness.py): five PS seeds of
#                stub trainers, then five collective seeds of fit-a-line (~2 min each)
#   make ps-proof  real fleet PS (Paddle 2.6.2, in a venv of its own: tests/paddle_ps.py) under each
#                fault paddlecloud recovers from; one line per run ending OK or FAILED
#   make bench   the benchmark report: dispatch, re-queue, failover, footprint (docs/benchmarks.md)
#   make proto   regenerate the gRPC code from proto/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_EXTRAS ?= paddle
TEST_EXTRAS ?= test,paddle
CHECKOV_VENV ?= .venv-checkov
comma := ,
# one stamp per set of extras: `make demo` then `make test` adds the test extras to the venv
stamp = $(VENV)/.installed-$(subst $(comma),-,$(1))

# PYTHONWARNINGS: setuptools' editable build warns that folders named as packages may shadow
# them (they are the packages); said on every install, it is noise on a first `make demo`
$(VENV)/.installed-%: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e '.[$(subst -,$(comma),$*)]'
	touch $@

# checkov (tests/k8s/test_k8s_checkov.py) pins older packaging and python-dateutil than this
# project's venv has: it gets a venv of its own. Where it cannot be installed its test skips,
# saying so in the summary (and fails under CI=true).
$(CHECKOV_VENV)/bin/checkov:
	($(PYTHON) -m venv $(CHECKOV_VENV) && $(CHECKOV_VENV)/bin/pip install -q "checkov==3.3.30") \
	  || echo "warning: installing checkov into $(CHECKOV_VENV) failed: its test will skip" >&2

.PHONY: demo test unit lint chaos ps-proof bench proto
demo: $(call stamp,$(DEMO_EXTRAS))
	$(BIN)/paddlecloud local train --example fit-a-line --epochs 5 --output output/fit-a-line --fresh

# Two pytest workers (pytest-xdist): most tests wait on real processes, so two share two cores
# well; the suite took 27 minutes of pytest on 2 cores in a fresh clone (2,057 tests, this phase;
# `make unit` alone: 1,360 of them). It prints its 30 slowest tests.
test: $(call stamp,$(TEST_EXTRAS)) $(CHECKOV_VENV)/bin/checkov
	$(BIN)/ruff check .
	$(BIN)/python -m tests.containers
	$(BIN)/pytest -n 2 --durations=30

unit: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/pytest -n 2 -m unit

lint: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/ruff check .

chaos: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/python -m tests.chaos.harness --seed 1 --seed 2 --seed 3 --seed 4 --seed 5 --faults 12 --epochs 5
	$(BIN)/python -m tests.chaos.harness --mode collective --seed 1 --seed 2 --seed 3 --seed 4 --seed 5 --faults 6 --epochs 5

ps-proof: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/python -m tests.ps_faults --fault none --fault trainer-kill --fault trainer-kill-gloo --fault trainer0-restart --fault pserver-kill --fault pserver-kill-gloo
	PADDLECLOUD_PS_PROOF=1 $(BIN)/pytest -n 2 -m paddle_ps

bench: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python bench/report.py

proto: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/python -m paddlecloud.protogen
