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
	$(BIN)/python -m pip install -q -e '.[test,lint,bench,cluster]'
	touch $@ $(VENV)/.run-deps

run: $(VENV)/.run-deps
	@echo "Serving examples/jobs on http://127.0.0.1:8080 (data in ./data). Try, in another shell:"
	@echo "  curl -X PUT http://127.0.0.1:8080/api/main/settings/endpoint -d 'https://example.com/hook'"
	@echo "  curl -X POST http://127.0.0.1:8080/api/main/events -H 'content-type: application/json' -d '{\"type\": \"signup\"}'"
	@echo "  curl http://127.0.0.1:8080/deliverer/main/deliveries"
	@echo "The admin API is on http://127.0.0.1:8081; and from here: .venv/bin/actorkeep ls"
	@echo "Stop with Ctrl-C. README.md has more."
	$(BIN)/actorkeep serve examples.jobs.app:app --data ./data --host 127.0.0.1 --port 8080 \
		--admin 127.0.0.1:8081

lint: $(VENV)/.test-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(VENV)/.test-deps lint
	@command -v chromium >/dev/null || { sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq chromium >/dev/null; }
	$(BIN)/python -m sim --seeds 200 --check-determinism
	$(BIN)/python -m sim --cluster --seeds 100 --check-determinism
	$(BIN)/python -m pytest -q

bench: $(VENV)/.test-deps
	@command -v wrk >/dev/null || { sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		$$sudo apt-get install -y -qq wrk >/dev/null; }
	$(BIN)/python bench/rpc.py
	$(BIN)/python bench/http.py
	$(BIN)/python bench/durable.py
	$(BIN)/python bench/gates.py
	$(BIN)/python bench/cluster_commit.py
	$(BIN)/python bench/cluster_failover.py
	$(BIN)/python bench/cluster_actors.py
	$(BIN)/python bench/cluster_crash.py

clean:
	rm -rf $(VENV) data .mypy_cache .pytest_cache .ruff_cache
