# The two commands of the quick start: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench clean system-deps

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
	@echo "The dashboard and the admin API are on http://127.0.0.1:8081; from here: .venv/bin/actorkeep ls"
	@echo "Stop with Ctrl-C. README.md has more."
	$(BIN)/actorkeep serve examples.jobs.app:app --data ./data --host 127.0.0.1 --port 8080 \
		--admin 127.0.0.1:8081

lint: $(VENV)/.test-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The system programs the tests run, from Debian's packages (each command is its package's
# name): strace (tests/test_gate.py counts fsyncs by thread), wrk (bench/http.py's load),
# Prometheus (tests/test_metrics.py scrapes with it), valgrind (bench/instructions.py counts
# with it), Chromium (tests/test_dashboard.py drives it) and PostgreSQL (tests/pg.py starts
# its own servers under temporary directories).
SYSTEM_DEPS := strace wrk prometheus valgrind chromium

system-deps:
	@missing=""; for cmd in $(SYSTEM_DEPS); do \
		command -v $$cmd >/dev/null || missing="$$missing $$cmd"; done; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql-15"; \
	if [ -n "$$missing" ]; then sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		echo "installing$$missing"; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq $$missing >/dev/null; fi

# The two sweeps run side by side (one core each), then the tests on every core (decision 0025).
test: $(VENV)/.test-deps lint system-deps
	@echo "$(BIN)/python -m sim --seeds 200 --check-determinism  (beside the next)"
	@$(BIN)/python -m sim --seeds 200 --check-determinism > $(VENV)/sim-sweep.log 2>&1 & one=$$!; \
	echo "$(BIN)/python -m sim --cluster --seeds 60 --check-determinism"; \
	$(BIN)/python -m sim --cluster --seeds 60 --check-determinism; cluster=$$?; \
	wait $$one; single=$$?; cat $(VENV)/sim-sweep.log; \
	test $$single -eq 0 && test $$cluster -eq 0
	$(BIN)/python -m pytest -q -n auto -m "not alone"
	$(BIN)/python -m pytest -q -m alone

bench: $(VENV)/.test-deps system-deps
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
