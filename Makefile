# shop: distributed locks, shown and measured. `make help` lists the targets.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin
GO ?= go
BIN := $(CURDIR)/bin
# Servers for tests and benchmarks: see docs/testing.md (set the SHOP_TEST_*
# variables to use servers of your own instead).
WITH_SERVERS := scripts/with-testenv.sh
BENCH_DURATION ?= 4s

.PHONY: help run build test test-unit vet fmt bench servers-up servers-down openapi-lint

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: ## Start one instance on :8080, SHOP_ENV=dev (public dev secrets), on SQLite + in-process Redis; needs only Go
	SHOP_ENV=dev $(GO) run ./cmd/shop serve

build: ## Build bin/shop, static, as the Docker image does
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/shop ./cmd/shop

test: openapi-lint ## Lint openapi.yaml, install and start the test servers on loopback, then go vet and go test -race ./...
	$(WITH_SERVERS) bash -c '$(GO) vet ./... && $(GO) test -race -count=1 -timeout 15m ./...'

test-unit: ## Only the tests that need no server (the rest skip; never use this in CI)
	$(GO) test -race -count=1 ./...

vet: ## go vet and gofmt check
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }

fmt: ## gofmt the tree
	gofmt -w .

# Redocly CLI, pinned by tools/openapi-lint/package-lock.json; needs Node
# 20.19+ or 22.12+ (Redocly's own requirement) and npm.
OPENAPI_LINT := tools/openapi-lint
openapi-lint: $(OPENAPI_LINT)/node_modules/.package-lock.json ## Lint internal/apidoc/openapi.yaml with Redocly's recommended rules, warnings as errors
	cd $(OPENAPI_LINT) && REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
		npx --no-install redocly lint --config redocly.yaml ../../internal/apidoc/openapi.yaml

$(OPENAPI_LINT)/node_modules/.package-lock.json: $(OPENAPI_LINT)/package-lock.json
	cd $(OPENAPI_LINT) && npm ci --no-audit --no-fund

bench: ## Benchmarks of every backend beside its peers and its server's raw round trip, as one table
	$(WITH_SERVERS) bash -c 'SHOP_BENCH_DURATION=$(BENCH_DURATION) $(GO) test -run "^$$" -bench "Uncontended" -benchtime=1s -count=5 ./internal/lockkit/lockbench/ | tee /tmp/shop-bench-uncontended.txt && SHOP_BENCH_DURATION=$(BENCH_DURATION) $(GO) test -run "^$$" -bench "Contended" -benchtime=1x -timeout 30m ./internal/lockkit/lockbench/ | tee /tmp/shop-bench-contended.txt' 
	@awk -f scripts/benchtable.awk /tmp/shop-bench-uncontended.txt /tmp/shop-bench-contended.txt

include loadtest.mk compose.mk
-include faults.mk

servers-up: ## Start the test servers and leave them running (source /tmp/shop-testenv/env to use them)
	scripts/testenv.sh up --with-sentinel

servers-down: ## Stop the test servers started by servers-up
	scripts/testenv.sh down
