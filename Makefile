# moonraft — see README.md.
GO ?= go
PKGS := ./...
FUZZTIME ?= 10s
# Fuzz targets run briefly in `make test`; `make fuzz FUZZTIME=5m` runs them longer.
FUZZ_TARGETS := \
	./fsm:FuzzDecodeCommand \
	./fsm:FuzzApplyStream \
	./fsm:FuzzRestore \
	./snapshots:FuzzReader \
	./oplog:FuzzDecode \
	./oplog:FuzzDecodePutEndPayload

.PHONY: all build test unit fuzz lint bench cover clean

all: build

build:
	$(GO) build $(PKGS)

test: lint unit
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME)

unit:
	$(GO) test -race -count=1 $(PKGS)

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) $$pkg; \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

bench:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$${BENCHTIME:-1x} ./fsm/ ./lease/ ./oplog/ ./snapshots/

cover:
	$(GO) test -count=1 -coverprofile=coverage.out ./fsm/
	$(GO) tool cover -func=coverage.out | tail -1

clean:
	rm -rf bin run tests/out coverage.out
