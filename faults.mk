# faults.mk: the fault suite (docs/faults.md). Included by the Makefile,
# which defines GO and WITH_SERVERS; the defaults below let it run alone too
# (make -f faults.mk faults).
GO ?= go
WITH_SERVERS ?= scripts/with-testenv.sh

# How long each fuzz target runs in `make faults` (go test -fuzztime).
FUZZTIME ?= 20s
# Where the fault table is written, besides the test output.
FAULTS_REPORT ?= /tmp/shop-faults-report.txt
# Where a passing run keeps its dated record: the table, with the command,
# the machine and the commit.
RECORD ?= docs/results

# record writes $(RECORD)/$(1)-<date>.md: the title $(2), the command $(3)
# and the report $(4), with the machine and the commit. The commit is read
# before the file is opened, so rewriting today's record is not a dirty tree.
define record
@mkdir -p $(RECORD)
@rev=$$(git describe --always --dirty --abbrev=12 2>/dev/null || echo not recorded); \
out=$(RECORD)/$(1)-$$(date -u +%F).md; { \
  printf '# %s, %s\n\n' '$(2)' "$$(date -u '+%F %H:%M UTC')"; \
  printf 'Machine: %s CPUs (%s).\n\n' "$$(nproc)" "$$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"; \
  printf 'Command: `%s`\n\n' '$(3)'; \
  printf 'Commit: %s\n\n' "$$rev"; \
  printf '```\n'; cat $(4); printf '```\n'; \
} > $$out && echo "record: $$out"
endef

# go test -fuzz takes one target of one package at a time.
FUZZ_TARGETS := ./internal/problem:FuzzDecodeJSON ./internal/auth:FuzzVerify ./internal/idem:FuzzMiddleware

.PHONY: faults faults-record faults-events
faults: ## fault suite, long form (pause, crash, restart, failover, partition, under -race) + $(FUZZTIME) of fuzzing per target; prints the fault × backend table and keeps it in docs/results/faults-<date>.md
	$(WITH_SERVERS) sh -c '\
	  SHOP_FAULTS=full SHOP_FAULTS_REPORT=$(FAULTS_REPORT) $(GO) test -race -count=1 -timeout 30m ./internal/faults/ >$(FAULTS_REPORT).log 2>&1; st=$$?; \
	  grep -E "^(---|ok|FAIL|PASS)|^    --- FAIL|_test.go:[0-9]+:" $(FAULTS_REPORT).log | grep -v "^    --- PASS" || true; \
	  [ $$st -eq 0 ] || { echo "fault suite failed; full output in $(FAULTS_REPORT).log"; exit $$st; }; \
	  for t in $(FUZZ_TARGETS); do \
	    $(GO) test -run "^$$" -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) $${t%%:*} || exit 1; \
	  done; \
	  echo; cat $(FAULTS_REPORT)'
	@$(MAKE) --no-print-directory faults-record

# faults-record writes $(RECORD)/faults-<date>.md from $(FAULTS_REPORT).
faults-record:
	$(call record,faults,shop fault suite,make faults FUZZTIME=$(FUZZTIME),$(FAULTS_REPORT))

# Where the order-event rows are written, besides the test output.
EVENTS_REPORT ?= /tmp/shop-faults-events-report.txt

faults-events: ## the order-event fault rows alone (consumer, relay, broker, a 3-node JetStream cluster, direct delivery), long form, -race; keeps them in docs/results/faults-events-<date>.md
	$(WITH_SERVERS) sh -c '\
	  SHOP_FAULTS=full SHOP_FAULTS_REPORT=$(EVENTS_REPORT) $(GO) test -race -count=1 -timeout 20m -run "^Test(Consumer|Event)" ./internal/faults/ >$(EVENTS_REPORT).log 2>&1; st=$$?; \
	  grep -E "^(---|ok|FAIL|PASS)|^    --- FAIL|_test.go:[0-9]+:" $(EVENTS_REPORT).log | grep -v "^    --- PASS" || true; \
	  [ $$st -eq 0 ] || { echo "event faults failed; full output in $(EVENTS_REPORT).log"; exit $$st; }; \
	  cat $(EVENTS_REPORT)'
	$(call record,faults-events,shop order-event faults,make faults-events,$(EVENTS_REPORT))

# Where the rows of a lock server forgetting a live grant are written.
GRANTS_REPORT ?= /tmp/shop-faults-grants-report.txt
GRANTS_TESTS := ^(TestHolderMasterFaults|TestRedisFailover|TestRedisClusterFailover)$$

.PHONY: faults-grants
faults-grants: ## a lock server forgets a live grant: Redlock's master restarted empty or its clock jumped (faults 10, 11) beside the fenced Redis lock, the Sentinel and Cluster failovers (4), -race; keeps them in docs/results/faults-grants-<date>.md
	$(WITH_SERVERS) sh -c '\
	  SHOP_FAULTS=full SHOP_FAULTS_REPORT=$(GRANTS_REPORT) $(GO) test -race -count=1 -timeout 10m -run "$(GRANTS_TESTS)" ./internal/faults/ >$(GRANTS_REPORT).log 2>&1; st=$$?; \
	  grep -E "^(---|ok|FAIL|PASS)|^    --- FAIL|_test.go:[0-9]+:" $(GRANTS_REPORT).log | grep -v "^    --- PASS" || true; \
	  [ $$st -eq 0 ] || { echo "grant faults failed; full output in $(GRANTS_REPORT).log"; exit $$st; }; \
	  cat $(GRANTS_REPORT)'
	$(call record,faults-grants,shop fault suite: a lock server forgets a live grant,make faults-grants,$(GRANTS_REPORT))
