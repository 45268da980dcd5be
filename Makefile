# shop: distributed locks, shown and measured. `make help` lists the targets.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin
GO ?= go
BIN := $(CURDIR)/bin
# Servers for tests and benchmarks: see docs/testing.md (set the SHOP_TEST_*
# variables to use servers of your own instead).
WITH_SERVERS := scripts/with-testenv.sh

.PHONY: help run build image test test-unit vet staticcheck fmt bench events-bench servers-up servers-down openapi-lint

# Variables a target's description names, shown by make help with their value.
HELP_VARS := FUZZTIME

help: ## List the targets
	@if [ -t 1 ]; then on=$$'\033[36m' off=$$'\033[0m'; fi; \
	$(foreach v,$(HELP_VARS),$(v)='$($(v))') on="$$on" off="$$off" awk 'BEGIN {FS = ":.*## "} \
		/^[a-zA-Z0-9_-]+:.*## / { d = $$2; \
			while (match(d, /\$$\([A-Z_]+\)/)) { v = substr(d, RSTART + 2, RLENGTH - 3); d = substr(d, 1, RSTART - 1) ENVIRON[v] substr(d, RSTART + RLENGTH) } \
			printf "  %s%-16s%s %s\n", ENVIRON["on"], $$1, ENVIRON["off"], d }' $(MAKEFILE_LIST)

run: ## Start one instance on :8080 (metrics on 127.0.0.1:9100), SHOP_ENV=dev (public dev secrets), on SQLite + in-process Redis; needs only Go
	SHOP_ENV=dev $(GO) run -ldflags='$(LDFLAGS)' ./cmd/shop serve

# What shop version prints: git describe of the checkout, and its commit.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
export VERSION REVISION
LDFLAGS := -X main.version=$(VERSION) -X main.revision=$(REVISION)

build: ## Build bin/shop, static, as the Docker image does, stamped with git describe's version
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w $(LDFLAGS)' -o $(BIN)/shop ./cmd/shop

image: ## Build the Docker image lockbench/shop:local, stamped with git describe's version
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t lockbench/shop:local .

test: openapi-lint staticcheck ## Lint openapi.yaml, install and start the test servers on loopback, then go vet, staticcheck and go test -race ./...
	$(WITH_SERVERS) bash -c '$(GO) vet ./... && $(STATICCHECK) ./... && $(GO) test -race -count=1 -timeout 15m ./...'

test-unit: ## Only the tests that need no server (the rest skip; never use this in CI)
	$(GO) test -race -count=1 ./...

vet: staticcheck ## go vet, staticcheck and gofmt check
	$(GO) vet ./...
	$(STATICCHECK) ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }

# staticcheck, pinned: its releases follow Go's (0.8 checks Go 1.26 code).
# It prints "staticcheck 2026.2.2 (0.8.2)"; the module version is the one
# in parentheses.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(BIN)/staticcheck

staticcheck: ## Build the pinned staticcheck (v0.8.2) into bin/ (only if missing or another version)
	@if [ "$$($(STATICCHECK) -version 2>/dev/null | sed -n 's/.*(\(.*\))$$/v\1/p')" != "$(STATICCHECK_VERSION)" ]; then \
		echo "go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) into $(BIN)"; \
		GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); \
	fi

fmt: ## gofmt the tree
	gofmt -w .

# Redocly CLI and Spectral, pinned by tools/openapi-lint/package-lock.json;
# needs Node 20.19+ or 22.12+ (Redocly's own requirement) and npm.
OPENAPI_LINT := tools/openapi-lint
openapi-lint: $(OPENAPI_LINT)/node_modules/.package-lock.json ## Lint internal/apidoc/openapi.yaml with Redocly's recommended rules and Spectral's oas rules, warnings as errors
	cd $(OPENAPI_LINT) && REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
		npx --no-install redocly lint --config redocly.yaml ../../internal/apidoc/openapi.yaml
	cd $(OPENAPI_LINT) && npx --no-install spectral lint --ruleset .spectral.yaml --fail-severity=hint ../../internal/apidoc/openapi.yaml

$(OPENAPI_LINT)/node_modules/.package-lock.json: $(OPENAPI_LINT)/package-lock.json
	@node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>22||a==22&&b>=12||a==20&&b>=19?0:1)' 2>/dev/null || \
		{ echo "openapi-lint: needs Node 20.19+ or 22.12+ with npm (Redocly's requirement; Debian 12's nodejs is 18): install one from nodejs.org or NodeSource, or run the Go tests alone with 'scripts/with-testenv.sh go test ./...'" >&2; exit 1; }
	cd $(OPENAPI_LINT) && npm ci --no-audit --no-fund

# make bench: BENCH_ROUNDS rounds, each running every subject once (A B A B
# ...), so that a drift in the machine's speed lands on both sides of each
# ratio, and every other round in reverse order (A B, B A), so that no
# subject always follows the same one; the table takes every ratio inside
# a round (scripts/benchtable.awk). Wall clock is only read that way. The
# contended subjects run in three shapes each (32 processes x 1 waiter,
# 3 x 4, 1 x 32). A round took 1.7 min on 2 cores that other jobs kept
# busy (9 rounds and the rest: 19 min), so the default of 7 keeps the
# whole target within about 15 min. The Redis subjects are also measured
# in instruments that repeat whatever the machine does
# (scripts/redis-instructions.sh: server and client instructions under
# callgrind, calls on the wire, client allocations), and ZooKeeper's
# recipes in requests and watch notifications per release (BenchmarkHerd,
# once: the counts are exact). The tables go to
# docs/results/bench-<date>.md with the command, the machine and the commit.
BENCH_ROUNDS ?= 7
BENCH_UNCONTENDED ?= 300ms
BENCH_CONTENDED ?= 1s
BENCH_CYCLES ?= 1000
BENCH_RESULTS := docs/results/bench-$(shell date -u +%Y-%m-%d).md
# The commit the benchmark binary is built from, read when make starts.
BENCH_COMMIT := $(shell git rev-parse --short HEAD)$(shell git diff --quiet HEAD -- . ':!docs/results' || echo ', with uncommitted changes')

bench: ## Every backend beside its peer and its server's raw round trips, contended in three shapes of processes x waiters, interleaved rounds; Redis in callgrind instructions, ZooKeeper's herd effect in requests per release; writes docs/results/bench-<date>.md
	@command -v valgrind >/dev/null || { echo "bench: needs valgrind (apt-get install valgrind) for the instruction counts" >&2; exit 1; }
	$(GO) test -c -o $(BIN)/lockbench.test ./internal/lockkit/lockbench/
	$(GO) build -o $(BIN)/rediscycles ./internal/lockkit/lockbench/rediscycles
	set -o pipefail; $(WITH_SERVERS) bash -c 'for r in $$(seq $(BENCH_ROUNDS)); do echo "round $$r"; \
		SHOP_BENCH_ROUND=$$r $(BIN)/lockbench.test -test.run "^$$" -test.bench "Uncontended" -test.benchtime=$(BENCH_UNCONTENDED) || exit 1; \
		SHOP_BENCH_ROUND=$$r SHOP_BENCH_DURATION=$(BENCH_CONTENDED) $(BIN)/lockbench.test -test.run "^$$" -test.bench "Contended" -test.benchtime=1x -test.timeout 30m || exit 1; \
		done; $(BIN)/lockbench.test -test.run "^$$" -test.bench "Herd" -test.benchtime=1x' | tee $(BIN)/bench-rounds.txt
	set -o pipefail; scripts/redis-instructions.sh $(BIN)/lockbench.test $(BIN)/rediscycles $(BENCH_CYCLES) 3 | tee $(BIN)/bench-instructions.md
	@mkdir -p docs/results
	@{ echo "# make bench, $$(date -u '+%Y-%m-%d %H:%M') UTC"; echo; \
		echo "- Command: \`make bench BENCH_ROUNDS=$(BENCH_ROUNDS) BENCH_UNCONTENDED=$(BENCH_UNCONTENDED) BENCH_CONTENDED=$(BENCH_CONTENDED) BENCH_CYCLES=$(BENCH_CYCLES)\`"; \
		echo "- Machine: $$(nproc) cores, $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $$(redis-server --version | cut -d' ' -f1-3)"; \
		echo "- Commit: $(BENCH_COMMIT)"; echo; \
		echo "## Uncontended Redis cycle, in instruments that repeat"; echo; \
		echo "Medians and ranges of 3 interleaved runs of $(BENCH_CYCLES) cycles. Server instructions: callgrind on a private redis-server, the same wall time idle subtracted (its timer). Client instructions: callgrind on internal/lockkit/lockbench/rediscycles, the difference of runs of 200 and 200 + $(BENCH_CYCLES) cycles (start-up cancels); GC off (its cost is the allocations), each reply read once it has arrived (no wait in the Go scheduler, whose cost depends on timing). Calls: counted on the wire (no pipelining: round trips). Allocations: the client's, per cycle (testing.B)."; echo; \
		cat $(BIN)/bench-instructions.md; echo; \
		echo "## Wall clock: medians and ranges of $(BENCH_ROUNDS) interleaved rounds"; echo; \
		echo '```'; awk -f scripts/benchtable.awk $(BIN)/bench-rounds.txt; echo '```'; } > $(BENCH_RESULTS)
	@echo "wrote $(BENCH_RESULTS)"

# make events-bench: what the outbox adds to placing an order (statements,
# p50/p99 against the same place without it, interleaved rounds) and the
# relay's events per second to a real nats-server, on MariaDB and on SQLite.
EVENTS_RESULTS := docs/results/events-$(shell date -u +%Y-%m-%d).md

events-bench: ## Measure the outbox's cost per place and the relay's events per second (MariaDB and SQLite); writes docs/results/events-<date>.md
	@mkdir -p docs/results
	@{ echo "# make events-bench, $$(date -u '+%Y-%m-%d %H:%M') UTC"; echo; \
		echo "- Command: \`make events-bench\`"; \
		echo "- Machine: $$(nproc) cores, $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), shared with other work"; \
		echo "- Commit: $(BENCH_COMMIT)"; echo; } > $(EVENTS_RESULTS)
	$(WITH_SERVERS) bash -c 'for dsn in "$$SHOP_TEST_MYSQL_DSN" ""; do \
		SHOP_TEST_MYSQL_DSN="$$dsn" SHOP_MEASURE_OUT=$(CURDIR)/$(EVENTS_RESULTS) $(GO) test -count=1 -p 1 -timeout 20m \
			-run "^TestMeasure" ./internal/order/ ./internal/events/ || exit 1; done'
	@echo "wrote $(EVENTS_RESULTS)"

include loadtest.mk compose.mk
-include faults.mk

servers-up: ## Start the test servers and leave them running (source /tmp/shop-testenv/env to use them)
	scripts/testenv.sh up --with-sentinel

servers-down: ## Stop the test servers started by servers-up
	scripts/testenv.sh down
