# gear's build and test entry points. `make test` is the command the README gives
# and .ci/run calls.

GO ?= go
NVCC ?= ../shared/tools/nvcc
KERNELS := cuda/internal/kernels

# The modules of the repository: gear itself and the examples that are modules
# of their own (built against this checkout through a replace directive).
MODULES := . examples/external examples/gorgonia-cu

.PHONY: all build test vet lint fmt-check tidy-check unit race fuzz ptx

all: build

build:
	$(GO) build ./...

vet:
	$(GO) vet ./...
	cd examples/external && $(GO) vet ./...

# lint runs staticcheck at a pinned version, built through the module proxy
# (it is no dependency of the module).
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	$(STATICCHECK) ./...

# tidy-check fails when go mod tidy would change any module's go.mod or go.sum.
tidy-check:
	@for m in $(MODULES); do (cd $$m && $(GO) mod tidy -diff) || { echo "go mod tidy would change $$m/go.mod or go.sum"; exit 1; }; done

fmt-check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# unit runs every package's tests once.
unit:
	$(GO) test -count=1 ./...

# race runs the packages with concurrency under the race detector.
race:
	$(GO) test -count=1 -race ./rank/... ./launch/... ./collective/... ./store/... ./sample/... ./roles/... ./jobs/...

# fuzz gives each parser's fuzz target a short budget, counted in executions (a
# time budget can end while a worker minimizes, which go test reports as a failure).
FUZZ_EXECS ?= 50000x
FUZZ = $(GO) test -run='^$$' -fuzztime=$(FUZZ_EXECS) -fuzzminimizetime=50x
fuzz:
	$(FUZZ) -fuzz='^FuzzParse$$' ./jobs
	$(FUZZ) -fuzz='^FuzzParseHostlist$$' ./rank
	$(FUZZ) -fuzz='^FuzzDecode$$' ./rank
	$(FUZZ) -fuzz='^FuzzAuth$$' ./rank
	$(FUZZ) -fuzz='^FuzzReadFrame$$' ./rank
	$(FUZZ) -fuzz='^FuzzCoordinatorHandshake$$' ./rank
	$(FUZZ) -fuzz='^FuzzParseMapping$$' ./gmi
	$(FUZZ) -fuzz='^FuzzParseTopology$$' ./gmi
	$(FUZZ) -fuzz='^FuzzParseHeader$$' ./store
	$(FUZZ) -fuzz='^FuzzCheckpointReader$$' ./store
	$(FUZZ) -fuzz='^FuzzFreeQueue$$' ./store
	$(FUZZ) -fuzz='^FuzzDecodeHeader$$' ./collective
	$(FUZZ) -fuzz='^FuzzParseName$$' ./internal/shmname

test: fmt-check vet lint tidy-check build unit race fuzz python-test

# ptx regenerates the embedded PTX from the CUDA sources (no GPU needed) and
# records the hashes that TestSumsMatchSources checks, and the compiler's
# release line, which TestPTXIsCurrent compares with the nvcc it finds.
ptx:
	$(NVCC) -ptx -arch=compute_80 -o $(KERNELS)/gear.ptx $(KERNELS)/gear.cu
	$(NVCC) --version 2>/dev/null | grep -m1 'Cuda compilation tools' > $(KERNELS)/NVCC_VERSION
	cd $(KERNELS) && sha256sum *.cu *.cuh gear.ptx > SHA256SUMS

# python builds libgear (the C ABI, cmd/libgear) into the Python package, so
# that `python3 -m pytest python` and `pip install ./python` find it.
PYTHON ?= /usr/bin/python3
.PHONY: python python-test
# go-nvml's C header marks calls gear never makes as deprecated; gcc's
# warnings about them say nothing of gear.
python:
	CGO_CFLAGS="$${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" $(GO) build -buildmode=c-shared -o python/gear/libgear.so ./cmd/libgear
	mv python/gear/libgear.h python/gear/gear.h

# python-test runs the Python package's tests; with GEAR_REQUIRE_PYTHON=1 a
# skipped test fails the run (python/tests/conftest.py).
python-test: python
	$(PYTHON) -m pytest -q -rs python/tests
