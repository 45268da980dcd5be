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
# RATE=0 (default) probes each row's capacity first and offers FRACTION of
# it, so that the verdict does not depend on the machine's speed.
BACKENDS ?= all
INSTANCES ?= 3
DURATION ?= 15s
RATE ?= 0
FRACTION ?= 0.7
DELAY ?= 10ms
STOCK ?= 300
# The probe's steps and its highest rate: past a few hundred purchases/s a
# 2-core machine measures k6 and the runner, not the lock.
PROBE_STEP ?= 2s
PROBE_MAX ?= 400

LOADTEST := $(GO) run ./loadtest/runner -shop $(BIN)/shop -k6 $(K6) -instances $(INSTANCES) -rate $(RATE) -fraction $(FRACTION) -delay $(DELAY) -stock $(STOCK) -step $(PROBE_STEP) -max-rate $(PROBE_MAX)

# Options of `make capacity` (docs/loadtest.md): the latency SLO, each rate
# step's length, and the rows (default: every cross-process backend and
# the lock-free strategies).
SLO ?= 250ms
STEP ?= 3s
CAPACITY_ROWS ?= all
# The command that times one row's serialized window (the ceiling), given
# the row's SHOP_* environment.
CEILING ?= $(BIN)/ceiling
# Where make loadtest and make capacity keep their dated reports.
RECORD ?= docs/results

# The events rows (docs/loadtest.md): the defaults, then each other way of
# delivery and dedup.
EVENTS_ROWS := events events-lock events-none events-direct

.PHONY: k6 loadtest loadtest-smoke loadtest-events loadtest-shop capacity

k6: ## Build the pinned k6 (v1.8.1) into bin/ (only if missing or another version)
	@if [ "$$($(K6) version 2>/dev/null | awk '{print $$2}')" != "$(K6_VERSION)" ]; then \
		echo "go install go.k6.io/k6@$(K6_VERSION) into $(BIN)"; \
		GOBIN=$(BIN) $(GO) install go.k6.io/k6@$(K6_VERSION); \
	fi

loadtest-shop:
	$(GO) build -ldflags='$(LDFLAGS)' -o $(BIN)/shop ./cmd/shop
	$(GO) build -o $(BIN)/ceiling ./loadtest/ceiling
	$(GO) build -o $(BIN)/refuser ./loadtest/refuser

loadtest: k6 loadtest-shop ## k6 against INSTANCES shops per backend (BACKENDS=all), then loadtest/results/report.{md,html} and docs/results/loadtest-<date>.md
	$(WITH_SERVERS) $(LOADTEST) -backends "$(BACKENDS)" -duration $(DURATION) -record $(RECORD)

loadtest-smoke: k6 loadtest-shop ## ~1.5 min: fails unless `none` shows damage, and `redis` and the default events row (through kills, a pause and a broker restart) none
	$(WITH_SERVERS) $(LOADTEST) -backends "none redis events" -duration 5s -stock 200 -step 1s -max-rate 200 -out loadtest/results/smoke

loadtest-events: k6 loadtest-shop ## ~2 min: only the events rows of make loadtest (delivery and dedup ways under faults), with its dated record
	$(WITH_SERVERS) $(LOADTEST) -backends "$(EVENTS_ROWS)" -duration $(DURATION) -record $(RECORD)

capacity: loadtest-shop ## Highest hot-SKU rate per strategy and backend within SLO, beside its ceiling: loadtest/results/capacity.md and docs/results/capacity-<date>.md
	$(WITH_SERVERS) $(GO) run ./loadtest/runner -shop $(BIN)/shop -ceiling "$(CEILING)" -instances $(INSTANCES) -capacity -backends "$(CAPACITY_ROWS)" -slo $(SLO) -step $(STEP) -record $(RECORD)
