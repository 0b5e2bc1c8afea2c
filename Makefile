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
	./oplog:FuzzDecodePutEndPayload \
	./oplog:FuzzFollowerApply \
	./cororpc:FuzzReadRequest \
	./structpack:FuzzUnmarshal

.PHONY: all build run failover test unit fuzz lint bench cover clean proto jepsen soak overload mooncake-golden mooncake-bench mooncake-failover sustained scale

all: build

build:
	$(GO) build $(PKGS)
	$(GO) build -o bin/moonraft ./cmd/node
	$(GO) build -o bin/moonctl ./cmd/moonctl
	$(GO) build -o bin/moonbench ./cmd/moonbench

# run starts a three-node cluster on loopback; Ctrl-C stops it.
run: build
	./scripts/run.sh

# The black-box failover at the default flags (docs/BENCHMARKS.md).
failover: build
	KILLS=$${KILLS:-10} ./scripts/failover.sh

test: lint unit
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME)

unit:
	$(GO) test -race -count=1 $(PKGS)

fuzz:
	@FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh $(FUZZ_TARGETS)

# Mooncake's master_bench against mooncake_master and against moonraft, in
# one sitting (docs/BENCHMARKS.md).
mooncake-bench: build
	./scripts/mooncake-bench.sh

# Mooncake's master_bench writing for minutes (DURATION, default 600 s)
# into three nodes exporting to etcd, the leader's export watched and
# plotted beside it (docs/BENCHMARKS.md).
sustained: build
	./scripts/sustained.sh

# Production size (issue 41): three nodes filled to each of SCALE_SIZES
# objects with SCALE_CLIENTS clients pinging; memory, snapshots, idle
# traffic, failover, restart and join at each size, then mooncake_master's
# RSS at the same counts (docs/BENCHMARKS.md). SCALE_OUT keeps the JSON,
# the plot and the tables.
SCALE_SIZES ?= 1000000,3000000
SCALE_CLIENTS ?= 10000
SCALE_OUT ?= /tmp/scale
scale: build
	mkdir -p $(SCALE_OUT)
	./bin/moonbench --local --scale $(SCALE_SIZES) --scale-clients $(SCALE_CLIENTS) --json $(SCALE_OUT)/scale.json --plot $(SCALE_OUT)/scale.svg >$(SCALE_OUT)/scale.txt
	SIZES=$(SCALE_SIZES) ./scripts/mooncake-rss.sh >>$(SCALE_OUT)/scale.txt
	cat $(SCALE_OUT)/scale.txt

# The same Mooncake HA client loop while the serving master is killed:
# Mooncake's own HA pair against moonraft; then plain C and Python clients
# behind haproxy, without etcd (docs/BENCHMARKS.md).
mooncake-failover: build
	./scripts/mooncake-failover.sh

# Rewrite mooncakeapi/testdata/golden.txt from the real Mooncake master and
# clients in ../shared/mooncake (or MOONCAKE_DIR), through a logging proxy.
mooncake-golden:
	$(GO) test -tags mooncakecapture -count=1 -run '^TestCaptureGolden$$' -v ./mooncakeapi/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags failpoints ./node/
	$(GO) vet -tags mooncakecapture ./mooncakeapi/

bench:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$${BENCHTIME:-1x} ./fsm/ ./lease/ ./oplog/ ./snapshots/

cover:
	$(GO) test -count=1 -coverprofile=coverage.out ./fsm/
	$(GO) tool cover -func=coverage.out | tail -1

clean:
	rm -rf bin run tests/out coverage.out

# proto regenerates transport/proto from moonraft.proto. The generator
# versions are pinned to match google.golang.org/protobuf and
# google.golang.org/grpc in go.mod; protoc itself comes from Debian's
# protobuf-compiler (its version is recorded in the generated headers).
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
TOOLS_BIN := $(CURDIR)/bin/tools

proto:
	@command -v protoc >/dev/null 2>&1 || { echo "protoc not found: apt-get install protobuf-compiler"; exit 1; }
	@$(TOOLS_BIN)/protoc-gen-go --version 2>/dev/null | grep -qx 'protoc-gen-go $(PROTOC_GEN_GO_VERSION)' || \
		GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@$(TOOLS_BIN)/protoc-gen-go-grpc --version 2>/dev/null | grep -qx 'protoc-gen-go-grpc $(patsubst v%,%,$(PROTOC_GEN_GO_GRPC_VERSION))' || \
		GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	protoc -I transport/proto \
		--plugin=protoc-gen-go=$(TOOLS_BIN)/protoc-gen-go \
		--plugin=protoc-gen-go-grpc=$(TOOLS_BIN)/protoc-gen-go-grpc \
		--go_out=transport/proto --go_opt=paths=source_relative \
		--go-grpc_out=transport/proto --go-grpc_opt=paths=source_relative \
		transport/proto/moonraft.proto

# certs writes a test PKI into ./run/certs for running with TLS locally: a CA,
# node certificates n0..n2 (SANs localhost, 127.0.0.1, ::1), a moonctl client
# certificate, an expired client certificate and an admin token
# (docs/OPERATIONS.md). Production brings its own CA.
.PHONY: certs
certs:
	$(GO) run ./scripts/gencerts --dir run/certs --expired

# jepsen runs the fault suite (tests/jepsen): every nemesis, mixed on a
# schedule drawn from SEED (empty: a fresh seed, printed), for DURATION of
# faults under load, then the end-of-run checks. Output: tests/out/<run>/.
# NEMESES (comma-separated) draws the schedule from those nemeses only.
DURATION ?= 10m
SEED ?=
NEMESES ?=
jepsen:
	JEPSEN_DURATION=$(DURATION) JEPSEN_SEED=$(SEED) JEPSEN_NEMESES=$(NEMESES) $(GO) test -count=1 -run 'TestJepsen$$' -timeout 0 -v ./tests/jepsen/

# overload: a herd of CLIENTS (ten times the clients at which puts peak)
# with 200 ms deadlines against a three-node cluster (docs/RELIABILITY.md);
# MAX_PENDING sets the nodes' --max-pending-writes (default: theirs).
CLIENTS ?= 2560
MAX_PENDING ?=
overload:
	OVERLOAD_CLIENTS=$(CLIENTS) OVERLOAD_MAX_PENDING=$(MAX_PENDING) $(GO) test -count=1 -run 'TestOverload$$' -timeout 10m -v ./tests/jepsen/

# soak: steady load with the nemeses for DURATION, sampling every node's
# resources; fails on growth without bound (docs/RELIABILITY.md).
soak:
	SOAK_DURATION=$(DURATION) JEPSEN_SEED=$(SEED) $(GO) test -count=1 -run 'TestSoak$$' -timeout 0 -v ./tests/jepsen/
