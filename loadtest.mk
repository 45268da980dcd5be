# loadtest.mk: the k6 load test (docs/loadtest.md). Included by the Makefile,
# which defines GO, BIN and WITH_SERVERS; the defaults below let it run alone
# too (make -f loadtest.mk loadtest-smoke).
GO ?= go
BIN ?= $(CURDIR)/bin
WITH_SERVERS ?= scripts/with-testenv.sh

# k6 v1.x: v2's module path (go.k6.io/k6/v2) does not resolve through the
# proxy this project uses.
K6_VERSION := v1.8.1
K6 := $(BIN)/k6

# Options of `make loadtest` (docs/loadtest.md): rows, instances per row,
# length of each k6 phase, seckill purchases per second, the sleep inside
# every read-modify-write, and the stock of the hot SKU.
BACKENDS ?= all
INSTANCES ?= 3
DURATION ?= 15s
RATE ?= 100
DELAY ?= 10ms
STOCK ?= 300

LOADTEST := $(GO) run ./loadtest/runner -shop $(BIN)/shop -k6 $(K6) -instances $(INSTANCES) -rate $(RATE) -delay $(DELAY) -stock $(STOCK)

.PHONY: k6 loadtest loadtest-smoke loadtest-shop

k6: ## Build the pinned k6 (v1.8.1) into bin/ (only if missing or another version)
	@if [ "$$($(K6) version 2>/dev/null | awk '{print $$2}')" != "$(K6_VERSION)" ]; then \
		echo "go install go.k6.io/k6@$(K6_VERSION) into $(BIN)"; \
		GOBIN=$(BIN) $(GO) install go.k6.io/k6@$(K6_VERSION); \
	fi

loadtest-shop:
	$(GO) build -o $(BIN)/shop ./cmd/shop

loadtest: k6 loadtest-shop ## k6 against INSTANCES shops per backend (BACKENDS=all), then loadtest/results/report.{md,html}
	$(WITH_SERVERS) $(LOADTEST) -backends "$(BACKENDS)" -duration $(DURATION)

loadtest-smoke: k6 loadtest-shop ## ~30 s: fails unless `none` shows damage and `redis` shows none
	$(WITH_SERVERS) $(LOADTEST) -backends "none redis" -duration 5s -stock 200 -out loadtest/results/smoke
