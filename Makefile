# The two commands of the quick start: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.run-deps: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.test-deps: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,lint,bench]'
	touch $@ $(VENV)/.run-deps

run: $(VENV)/.run-deps
	@echo "Serving examples/counter on http://127.0.0.1:8080 (data in ./data). Try, in another shell:"
	@echo "  curl -X POST http://127.0.0.1:8080/counter/a/_rpc/incr -H 'content-type: application/json' -d '{\"by\": 2}'"
	@echo "  curl http://127.0.0.1:8080/counter/a/"
	@echo "Stop with Ctrl-C."
	$(BIN)/actorkeep serve examples.counter.app:app --data ./data --host 127.0.0.1 --port 8080

lint: $(VENV)/.test-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(VENV)/.test-deps lint
	$(BIN)/python -m pytest -q

bench: $(VENV)/.test-deps
	$(BIN)/python bench/rpc.py
	$(BIN)/python bench/http.py
	$(BIN)/python bench/durable.py

clean:
	rm -rf $(VENV) data .mypy_cache .pytest_cache .ruff_cache
