# qstate: every target sets up what is missing first, so a fresh machine needs only `make`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
JARS    := $(VENV)/jars
JAR_STAMP := $(JARS)/.fetched
MVN     ?= mvn
PYTEST_ARGS ?=
# the read engine's Rust build (engine/): RocksDB's C++ takes minutes to compile, once per
# machine, into this folder outside the clone (every clone on the machine shares it)
CARGO_TARGET_DIR ?= $(HOME)/.cache/qstate/cargo-target
export CARGO_TARGET_DIR
ENGINE_STAMP := $(VENV)/.engine
# RocksDB's C++ as the engine's build leaves it: absent, the next build compiles it (minutes)
ROCKSDB_LIB = $(wildcard $(CARGO_TARGET_DIR)/release/build/librocksdb-sys-*/out/librocksdb.a)
ENGINE_SRC := $(shell find engine -name target -prune -o -type f \( -name '*.rs' -o -name '*.toml' -o -name Cargo.lock \) -print)
CARGO   := cargo --locked

.PHONY: setup node-setup bench-setup run test test-fast soak lint proto clean engine-test engine-lint

NODE_STAMP := clients/node/node_modules/.installed

setup: $(STAMP) $(JAR_STAMP) $(NODE_STAMP)

# the feast extra: tests/feast runs Feast over qstate (docs/feast.md)
$(STAMP): pyproject.toml $(ENGINE_STAMP)
	@command -v java >/dev/null 2>&1 || { echo "qstate needs Java 17 for Spark: apt-get install openjdk-17-jre-headless"; exit 1; }
	$(BIN)/pip install --quiet -e '.[server,dev,feast]'
	@touch $(STAMP)

# qstate-engine (qstate._engine), which the server install requires: built by maturin, in
# release (cargo test and clippy build in release too, so RocksDB compiles once). bindgen needs
# libclang (Debian's libclang-dev), installed here when missing and run as root.
$(ENGINE_STAMP): $(ENGINE_SRC)
	@command -v cargo >/dev/null 2>&1 || { echo "qstate's read engine is Rust: install it (https://rustup.rs), then make again"; exit 1; }
	@ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq libclang-dev >/dev/null; \
		else echo "qstate's read engine needs libclang to build: apt-get install libclang-dev"; exit 1; fi; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 'maturin>=1.7,<2'
	@test -n "$(ROCKSDB_LIB)" || echo "qstate: building the read engine compiles RocksDB's C++ once for this machine, \
	into $(CARGO_TARGET_DIR) (every clone reuses it): about 14 minutes on 2 cores \
	(loadtest/results/setup.md), with no output until it is done"
	cd engine/py && VIRTUAL_ENV=$(abspath $(VENV)) $(abspath $(BIN))/maturin develop --release --locked --quiet
	@touch $(ENGINE_STAMP)

# the engine's own checks: its tests (cargo test), then clippy with warnings as errors and
# rustfmt (make lint)
engine-test: $(ENGINE_STAMP)
	cd engine && $(CARGO) test --release -p qstate-engine-core --quiet

engine-lint: $(ENGINE_STAMP)
	cd engine && cargo fmt --all --check
	cd engine && $(CARGO) clippy --release --workspace --all-targets --quiet -- -D warnings

# JVM parts, from Maven Central, once: the Kafka broker (with its dependencies) and Spark's
# Kafka connector. Nothing is fetched at run time. Where Maven Central is not reachable, put
# the same jars in folders named by QSTATE_KAFKA_JARS and QSTATE_SPARK_JARS.
$(JAR_STAMP): deploy/maven/kafka-broker.pom.xml deploy/maven/spark-kafka.pom.xml
	@command -v $(MVN) >/dev/null 2>&1 || { echo "qstate fetches its jars with Maven: apt-get install maven"; exit 1; }
	rm -rf $(JARS)/kafka $(JARS)/spark
	$(MVN) -q -B -f deploy/maven/kafka-broker.pom.xml dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory=$(abspath $(JARS))/kafka
	$(MVN) -q -B -f deploy/maven/spark-kafka.pom.xml dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory=$(abspath $(JARS))/spark
	@touch $(JAR_STAMP)

# benchmarks (loadtest/): the Redis baseline needs redis-server (Debian package) and redis-py
bench-setup: setup
	@command -v redis-server >/dev/null 2>&1 && command -v wrk >/dev/null 2>&1 && command -v h2load >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq redis-server wrk nghttp2-client; }
	$(BIN)/pip install --quiet -e '.[server,dev,feast,bench]'
	@command -v go >/dev/null 2>&1 || { echo "the open-loop bench needs Go 1.26 (go.dev)"; exit 1; }
	cd loadtest/openloop && go build -o $(abspath $(BIN))/qstate-openloop .
	cd loadtest/rawgrpc && go build -o $(abspath $(BIN))/qstate-rawgrpc .
	@test -x $(BIN)/ghz || GOBIN=$(abspath $(BIN)) go install github.com/bojand/ghz/cmd/ghz@v0.120.0

# under the guard: a make killed outright (kill -9 of make alone) stops the run as SIGTERM
# would, instead of leaving it running without a parent (qstate.embedded.guard)
run: setup
	$(BIN)/python -m qstate.embedded.guard --grace 60 -- $(BIN)/qstate run

test: setup engine-test
	$(BIN)/pytest $(PYTEST_ARGS)

# no JVM: neither Spark nor the Kafka broker (real shard and router processes still run)
test-fast: setup
	$(BIN)/pytest -m "not spark and not kafka" $(PYTEST_ARGS)

# the tests marked long: the five-minute soak of `make run` (CPU hog, truth comparison) and the
# chaos and multi-host scenarios make test leaves out; longer: python -m loadtest.soak
soak: setup
	QSTATE_LONG=1 $(BIN)/pytest -m long $(PYTEST_ARGS)

# mypy and lint-imports read qstate through .lint/, the installed tree drawn with symlinks
# (tests/mirror.py): they walk folders, and qstate.jobs is not under service/
lint: setup engine-lint
	$(BIN)/ruff check .
	$(BIN)/python -m tests.mirror .lint >/dev/null
	$(BIN)/mypy -p qstate -p loadtest -p tests
	PYTHONPATH=.lint $(BIN)/lint-imports --no-cache

proto: setup
	$(BIN)/python -m tests.mirror .lint >/dev/null
	$(BIN)/python -m grpc_tools.protoc -I.lint --python_out=.lint --grpc_python_out=.lint \
		--pyi_out=.lint .lint/qstate/proto/shard.proto .lint/qstate/proto/qstate.proto

clean:
	rm -rf $(VENV) .qstate .pytest_cache .lint clients/node/node_modules

# Node example client (clients/node): its dependencies from the committed package-lock.json
node-setup: $(NODE_STAMP)

$(NODE_STAMP): clients/node/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "the Node gRPC client needs Node.js 18+ and npm: apt-get install nodejs npm"; exit 1; }
	cd clients/node && npm ci --no-audit --no-fund
	@touch $(NODE_STAMP)
