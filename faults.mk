# faults.mk: the fault suite (docs/faults.md). Included by the Makefile,
# which defines GO and WITH_SERVERS; the defaults below let it run alone too
# (make -f faults.mk faults).
GO ?= go
WITH_SERVERS ?= scripts/with-testenv.sh

# How long each fuzz target runs in `make faults` (go test -fuzztime).
FUZZTIME ?= 20s
# Where the fault table is written, besides the test output.
FAULTS_REPORT ?= /tmp/shop-faults-report.txt

# go test -fuzz takes one target of one package at a time.
FUZZ_TARGETS := ./internal/problem:FuzzDecodeJSON ./internal/auth:FuzzVerify ./internal/idem:FuzzMiddleware

.PHONY: faults
faults: ## fault suite, long form (pause, crash, restart, failover, partition, under -race) + $(FUZZTIME) of fuzzing per target; prints the fault × backend table
	$(WITH_SERVERS) sh -c '\
	  SHOP_FAULTS=full SHOP_FAULTS_REPORT=$(FAULTS_REPORT) $(GO) test -race -count=1 -timeout 30m ./internal/faults/ >$(FAULTS_REPORT).log 2>&1; st=$$?; \
	  grep -E "^(---|ok|FAIL|PASS)|^    --- FAIL|_test.go:[0-9]+:" $(FAULTS_REPORT).log | grep -v "^    --- PASS" || true; \
	  [ $$st -eq 0 ] || { echo "fault suite failed; full output in $(FAULTS_REPORT).log"; exit $$st; }; \
	  for t in $(FUZZ_TARGETS); do \
	    $(GO) test -run "^$$" -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) $${t%%:*} || exit 1; \
	  done; \
	  echo; cat $(FAULTS_REPORT)'
