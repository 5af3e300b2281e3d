VENV ?= .venv
PYTEST_ARGS ?=

.PHONY: setup test lint format transcribe-samples

setup:
	bash scripts/setup.sh

test:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

transcribe-samples:
	$(VENV)/bin/specscribe transcribe samples/
