# gear's build and test entry points. `make test` is the command the README gives
# and .ci/run calls.

GO ?= go
NVCC ?= ../shared/tools/nvcc
KERNELS := cuda/internal/kernels

.PHONY: all build test vet fmt-check unit race fuzz ptx

all: build

build:
	$(GO) build ./...

vet:
	$(GO) vet ./...

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
	$(FUZZ) -fuzz='^FuzzParseMapping$$' ./gmi
	$(FUZZ) -fuzz='^FuzzParseTopology$$' ./gmi
	$(FUZZ) -fuzz='^FuzzParseHeader$$' ./store
	$(FUZZ) -fuzz='^FuzzCheckpointReader$$' ./store
	$(FUZZ) -fuzz='^FuzzDecodeHeader$$' ./collective

test: fmt-check vet build unit race fuzz

# ptx regenerates the embedded PTX from the CUDA sources (no GPU needed) and
# records the hashes that TestSumsMatchSources checks.
ptx:
	$(NVCC) -ptx -arch=compute_80 -o $(KERNELS)/gear.ptx $(KERNELS)/gear.cu
	cd $(KERNELS) && sha256sum *.cu *.cuh gear.ptx > SHA256SUMS
