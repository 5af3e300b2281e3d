VENV ?= .venv
PYTEST_ARGS ?=
# Two pytest workers, each test file whole on one (its module fixtures load once); `-n 0` in
# PYTEST_ARGS runs serially.
PYTEST_WORKERS ?= 2

.PHONY: setup test lint format transcribe-samples

setup:
	bash scripts/setup.sh

test:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

transcribe-samples:
	$(VENV)/bin/specscribe transcribe samples/
