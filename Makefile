# qstate: every target sets up what is missing first, so a fresh machine needs only `make`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup run test test-fast lint proto proto-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v java >/dev/null 2>&1 || { echo "qstate needs Java 17 for Spark: apt-get install openjdk-17-jre-headless"; exit 1; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: setup
	$(BIN)/qstate run

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

# unit tests only: no JVM, no broker
test-fast: setup
	$(BIN)/pytest -m "not spark" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy service jobs loadtest

proto: setup
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. proto/shard.proto proto/qstate.proto

clean:
	rm -rf $(VENV) .qstate .pytest_cache
