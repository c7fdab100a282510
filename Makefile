# The two commands of the README, and the few a developer needs.
#   make demo    set up .venv and train the fit-a-line example with 2 trainers, locally
#   make test    set up .venv and run ruff and the whole test suite (what CI runs)
#   make chaos   longer chaos schedules than CI's (tests/chaos/harness.py): five PS seeds of
#                stub trainers, then five collective seeds of fit-a-line (~2 min each)
#   make bench   the benchmark report: dispatch, re-queue, failover, footprint (docs/benchmarks.md)
#   make proto   regenerate the gRPC code from proto/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= test,paddle
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

.PHONY: demo test lint chaos bench proto
demo: $(STAMP)
	$(BIN)/paddlecloud local train --example fit-a-line --epochs 5 --output output/fit-a-line --fresh

# Two pytest workers (pytest-xdist): most tests wait on real processes, so two share two cores
# well; the suite takes about 11 minutes on CI's 2 cores instead of about 19 in one worker.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -n 2

lint: $(STAMP)
	$(BIN)/ruff check .

chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.harness --seed 1 --seed 2 --seed 3 --seed 4 --seed 5 --faults 12 --epochs 5
	$(BIN)/python -m tests.chaos.harness --mode collective --seed 1 --seed 2 --seed 3 --seed 4 --seed 5 --faults 6 --epochs 5

bench: $(STAMP)
	$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python bench/report.py

proto: $(STAMP)
	$(BIN)/python -m paddlecloud.protogen
