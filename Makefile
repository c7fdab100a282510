# The two commands of the README, and the few a developer needs.
#   make test    set up .venv and run ruff and the whole test suite (what CI runs)
#   make proto   regenerate the gRPC code from proto/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= test

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

.PHONY: test lint proto
test: $(VENV)/.installed-$(EXTRAS)
	$(BIN)/ruff check .
	$(BIN)/pytest

lint: $(VENV)/.installed-$(EXTRAS)
	$(BIN)/ruff check .

proto: $(VENV)/.installed-$(EXTRAS)
	$(BIN)/python -m paddlecloud.protogen
