# One entry point. `make test` and `make demo` work on a fresh machine (see hack/setup.sh).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup build-k8s lint unit test demo up down status clean

setup:
	bash hack/setup.sh

build-k8s:
	bash hack/build-k8s.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: setup
	$(VENV)/bin/pytest tests/unit

# The test command of README.md and .ci/run: set-up, linters, then every test.
test: lint
	$(VENV)/bin/pytest

demo: setup
	bash hack/demo.sh

up: setup
	$(PY) -m hack.localcluster up

down:
	-$(VENV)/bin/gpuferry agents stop
	$(PY) -m hack.localcluster down

status:
	$(PY) -m hack.localcluster status

clean: down
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
