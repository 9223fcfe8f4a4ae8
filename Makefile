# gear's build and test entry points. `make test` is the command the README gives
# and .ci/run calls.

GO ?= go

.PHONY: all build test vet fmt-check ptx

all: build

build:
	$(GO) build ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

test: fmt-check vet
	$(GO) test -count=1 ./...
