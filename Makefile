# The test command CI runs is `make test`. It needs PostgreSQL on 127.0.0.1:5432
# (trust auth, user postgres) and RabbitMQ on 127.0.0.1:5672 (guest/guest) with
# rabbitmqctl on PATH: the tests create their own databases and vhosts.
GO      ?= go
BIN     ?= bin
# Every directory of cmd/ is a program: the one place the list lives.
PROGRAMS = $(notdir $(wildcard cmd/*))
# The kit is a Go module of its own (kit/go.mod), which go.mod replaces with
# ./kit: ./... stops at its directory, so each command that covers the whole
# code names the kit's packages by their module path too.
KIT := $(shell awk '$$1 == "module" { print $$2; exit }' kit/go.mod)

.PHONY: all build test check fmt vet lint clean

# Static analysis, pinned (built from the Go module proxy on first use, then
# cached): go mod verify, staticcheck over the module, gosec over its
# non-test code. gosec's exceptions, each justified here or at its line
# (#nosec G… -- why):
#   G404  math/rand draws jitter, fault-injection probabilities, demo loads
#         and lease tokens (which only tell a claim's holder apart): none is
#         a secret.
#   kit/internal/testenv, kit/kittest/faultkit, kit/kittest/erlnode  test support: it runs rabbitmqctl, the programs and
#         scripts it is given (G204), on paths of the tests' own (G304).
#   bench/, .ci/  separate modules, tools of the project.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
# go test through gotestsum (pinned, built from the Go module proxy on first
# use): the output of go test, and the JSON of each run in TEST_REPORT, which
# make test-times (and CI) turn into the longest packages and tests.
GOTESTSUM   ?= gotest.tools/gotestsum@v1.13.0
TEST_REPORT ?= .test-report
GOTEST       = $(GO) run $(GOTESTSUM) --format standard-quiet
# Every go test run: the race detector, no cached results, and test binaries
# linked without DWARF (-w): stack traces and race reports do not read it,
# and every go test run links its test binaries again (a -race one is seconds
# of CPU). A debugger wants it: make test TESTFLAGS='-race -count=1'.
TESTFLAGS    = -race -count=1 -ldflags=-w
GOSEC       ?= github.com/securego/gosec/v2/cmd/gosec@v2.30.0

all: check build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ $(addprefix ./cmd/,$(PROGRAMS))

# The tests come in two tiers, both against the real PostgreSQL and RabbitMQ:
#
# make test, the one to run first (5 to 10 minutes on 2 cores, about 15 cold): formatting,
# vet, static analysis and the alert rules; the whole suite with the race
# detector (group commit, the default) but the slow proofs below; beside it
# the tests whose subject is the commit path (COMMIT_PATH) again with a
# transaction per message.
#
# make test-faults, the slow proofs (CI runs them after make test): the fault
# kit's scenarios against the payment service in each inbox mode (every
# scenario once per mode; they run three at a time, the two modes' trials
# and the generator's tests sharing the slots, each on a vhost,
# databases and processes of its own) and the shipping example's own crash
# point in each mode (the kit's scenarios are proven on the payment
# service); the generator's tests (a copy of the repository, built and
# tested); and, first, the tests that disturb the whole broker (a restart, a
# memory alarm, a message size cap), one package at a time (-p 1) so that
# they disturb no other.
SLOW_TESTS  = UnderFaults|NewProjectScript
# The second pass: the packages whose tests take TEST_GROUP_COMMIT_MAX
# (testenv.GroupCommit, kit/internal/testenv), the tests of the commit path among them, but those
# that set their own batch size or none (NOT_COMMIT_PATH): they would run
# the same way twice.
COMMIT_PACKAGES = $(KIT)/internal/consumer ./internal/payment ./internal/e2e ./examples/...
COMMIT_PATH = Apply|Applied|Duplicate|Dedupe|Twice|Commit|Writes|Batched|BackendsTerminated|SQLState|DatabaseError|SameIDDifferentPayload|UnderNewID|Conflicting|Emit|Decline|CrashPoints|ThousandOrders|SIGTERMUnderLoad|ShipsEachOrderOnce|CrashAfterCarrierBook|^TestConcurrent|^TestBufferedStoresThenProcessesOnce$$|^TestDeadLetterCopyNoQueueTookIsNotAcked$$
NOT_COMMIT_PATH = ^TestGroupCommitIsolatesAFailingMessage$$|^TestHungHandlerBatchedWithTheNextMessageCommitsNothing$$|^TestMigrationsApplyTwice$$
FAULTS_PARALLEL ?= 3

.PHONY: test-faults test-suite test-commit-path
# The two passes run side by side (each test on a vhost and databases of its
# own): alone, the first left the machine a quarter idle while its longest
# packages ran. The second's lines begin "tx-per-message: ".
test: check lint test-rules
	@$(MAKE) --no-print-directory -j2 test-suite test-commit-path

test-suite:
	@mkdir -p $(TEST_REPORT)
	@echo "== $$(date -u +%T) the whole suite with the race detector, but the slow proofs (make test-faults)"
	$(GOTEST) --jsonfile $(TEST_REPORT)/1-suite.json -- $(TESTFLAGS) -timeout 30m -skip '$(SLOW_TESTS)' ./... $(KIT)/...

test-commit-path: SHELL := bash
test-commit-path: .SHELLFLAGS := -o pipefail -c
test-commit-path:
	@mkdir -p $(TEST_REPORT)
	@echo "== $$(date -u +%T) beside it, the commit path again with a transaction per message (GROUP_COMMIT_MAX=1)"
	TEST_GROUP_COMMIT_MAX=1 $(GOTEST) --jsonfile $(TEST_REPORT)/2-tx-per-message.json -- $(TESTFLAGS) -timeout 20m -run '$(COMMIT_PATH)' -skip '$(SLOW_TESTS)|Trace|$(NOT_COMMIT_PATH)' $(COMMIT_PACKAGES) 2>&1 | sed -u 's/^/tx-per-message: /'

# Its two halves, which CI runs apart (the broker's tests first, alone on
# the machine; the rest beside other steps): test-disruptive, test-scenarios.
test-faults:
	$(MAKE) test-disruptive
	$(MAKE) test-scenarios

.PHONY: test-disruptive test-scenarios
test-disruptive:
	@mkdir -p $(TEST_REPORT)
	@echo "== $$(date -u +%T) the tests that disturb the whole broker, one package at a time"
	$(GOTEST) --jsonfile $(TEST_REPORT)/5-disruptive.json -- $(TESTFLAGS) -timeout 15m -p 1 -tags disruptive -run Disruptive $(KIT)/internal/consumer ./internal/e2e

test-scenarios:
	@mkdir -p $(TEST_REPORT)
	@echo "== $$(date -u +%T) the fault kit's scenarios, both inbox modes, and the generator's tests"
	$(GOTEST) --jsonfile $(TEST_REPORT)/3-faults.json -- $(TESTFLAGS) -timeout 30m -parallel $(FAULTS_PARALLEL) -run '^TestPaymentUnderFaults(Buffered)?$$|^TestNewProjectScript' ./internal/e2e
	$(GOTEST) --jsonfile $(TEST_REPORT)/4-shipping-faults.json -- $(TESTFLAGS) -timeout 15m -parallel $(FAULTS_PARALLEL) -run '^TestShippingUnderFaults(Buffered)?$$/^crash-after-carrier-book$$' ./examples/shipping

# Where the time went, from the JSON of each go test run of make test (and
# of test-cluster): the longest packages and tests (.ci/testtimes).
.PHONY: test-times
test-times:
	cd .ci/testtimes && $(GO) run . $(abspath $(TEST_REPORT))

check: fmt vet

# The fuzz targets, each for FUZZTIME: a count of inputs (about 3 to 10 s
# each on 2 cores; a long hunt: make fuzz FUZZTIME=1000000x), not a duration, which Go 1.26's fuzzer can fail at its
# deadline with no input at fault (go.dev/issue/75804). Plain go test runs
# their seeds. Each runs in its package's directory (go test fuzzes only
# the packages of the module it runs in, and the kit is a module of its own).
# A crash leaves its input in the package's testdata/fuzz/:
# commit it with the fix, and it stays a seed.
FUZZ_TARGETS = FuzzDecode:./internal/payment/orders FuzzAdmit:./kit/internal/consumer \
	FuzzChargeRequest:./internal/demo/fakegateway FuzzHeadersFromJSON:./kit/rabbit
FUZZTIME ?= 25000x
.PHONY: fuzz
fuzz:
	@for t in $(FUZZ_TARGETS); do echo "== $${t%%:*} ($(FUZZTIME))"; \
	  (cd $${t#*:} && $(GO) test -run '^$$' -fuzz "^$${t%%:*}\$$" -fuzztime $(FUZZTIME) .) || exit 1; done

# The Prometheus alert and recording rules (deploy/prometheus/rules): valid,
# and each alert firing and not firing in deploy/prometheus/tests. promtool
# comes with Debian's prometheus package.
.PHONY: test-rules
test-rules:
	@command -v promtool >/dev/null || { echo "promtool not found: apt-get install prometheus (Debian), or a Prometheus release's promtool on PATH"; exit 1; }
	promtool check rules deploy/prometheus/rules/*.yml
	@# Groups are evaluated in no set order: an alert reading a series another
	@# group records sees it one interval late, and its tests pass or fail by
	@# chance. The series the alerts read are recorded in the alerts' group.
	@for s in $$(sed -n 's/^ *- record: *//p' deploy/prometheus/rules/recording.yml); do \
	  if grep -q "$$s" deploy/prometheus/rules/alerts.yml; then echo "alerts.yml reads $$s, recorded in recording.yml: record it in the alerts' group"; exit 1; fi; done
	promtool test rules deploy/prometheus/tests/*.yml

fmt:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./... $(KIT)/...

# gosec runs without -quiet: with it, gosec passes a run that found no issue
# even where a package failed to load (its "Golang errors"); its log (a line
# per package) goes nowhere, its summary and any such errors are printed.
# testdata holds a program that must not compile (the root package's typed
# handler test): -quiet had hidden that gosec failed on it.
lint:
	$(GO) mod verify
	cd kit && $(GO) mod verify
	$(GO) run $(STATICCHECK) ./... $(KIT)/...
	$(GO) run $(GOSEC) -log /dev/null -exclude=G404 -exclude-dir=bench -exclude-dir='\.ci' -exclude-dir=kit/internal/testenv -exclude-dir=kit/kittest/faultkit -exclude-dir=kit/kittest/erlnode -exclude-dir=testdata ./...

clean:
	rm -rf $(BIN)

# The Compose stack in one command: what is missing said precisely, stand-in
# images built when no registry answers, up --build --wait, then one line
# about the demo load (orders -> payments, duplicates suppressed, dead
# letters, PASS/FAIL). `down` removes it all, volumes included.
# The cluster tests (-tags cluster) of the kit on a local three-node cluster
# of the machine's RabbitMQ server (scripts/cluster.sh: root, ports
# 5681-5683), started if it is not up and left up (scripts/cluster.sh down
# removes it). CI runs them after make test, and the broker-node-loss
# scenario in both modes (make test-node-loss, below).
.PHONY: test-cluster
test-cluster:
	bash scripts/cluster.sh up >/dev/null
	@mkdir -p $(TEST_REPORT)
	$(GOTEST) --jsonfile $(TEST_REPORT)/6-cluster.json -- $(TESTFLAGS) -timeout 15m -tags cluster -run 'Cluster|LeaderLoss' $(KIT)/rabbit $(KIT)/internal/consumer $(KIT)/internal/testenv

# Broker node loss in both inbox modes side by side (what
# scripts/faults/broker-node-loss.sh --local runs one mode at a time): each
# mode's replicas on a vhost of their own of the local cluster, the leader
# kills of the two in turn, never two nodes down at once.
.PHONY: test-node-loss
test-node-loss:
	bash scripts/cluster.sh up >/dev/null
	@mkdir -p $(TEST_REPORT)
	$(GOTEST) --jsonfile $(TEST_REPORT)/7-node-loss.json -- $(TESTFLAGS) -timeout 25m -tags cluster -run '^TestPaymentOnCluster(Buffered)?$$' ./internal/e2e

.PHONY: up down
up:
	bash scripts/up.sh

down:
	docker compose --profile cluster --profile tracing down -v --remove-orphans

# Fault scripts (scripts/faults, scripts/chaos.sh): by default each runs its
# Go scenario (go test of the service's fault test: local processes on the
# local RabbitMQ and PostgreSQL, a fresh vhost and fresh databases), or the
# Compose stack with STACK=compose. `faults` runs every scenario in turn and
# stops at the first FAIL; broker-restart and broker-stop-outbox-backlog stop
# the local broker. `chaos` is the bounded run CI uses; `chaos-buffered` runs
# it with INBOX_MODE=buffered.
.PHONY: faults chaos chaos-buffered
FAULT_SCRIPTS ?= $(sort $(wildcard scripts/faults/*.sh))
CHAOS_FLAGS   ?= --duration 60s --orders 1500

# A scenario the service or the mode does not have (exit 3, SKIP) is passed over.
faults:
	@for s in $(FAULT_SCRIPTS); do echo "== $$s"; bash $$s; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 3 ] || exit 1; done

chaos:
	bash scripts/chaos.sh $(CHAOS_FLAGS)

# The same with the buffered inbox (every fault script takes INBOX_MODE).
chaos-buffered:
	INBOX_MODE=buffered bash scripts/chaos.sh $(CHAOS_FLAGS)

# Benchmarks: bench/ is a Go module of its own, so that this go.mod never
# carries Watermill. `make bench` builds every program and runs the whole
# comparison on the local RabbitMQ and PostgreSQL (needs pgbench and
# rabbitmqctl), the 5-minute sustained run included: about 15 minutes on 2
# cores. BENCH_FLAGS passes flags, and its -configs replaces the default, e.g.
# make bench BENCH_FLAGS="-messages 5000 -configs amqp091,service-gc".
# bench-smoke proves the harness, every configuration with tiny sizes, in
# about a minute and a half; bench-check is its gofmt, vet and tests.
.PHONY: bench bench-build bench-smoke bench-check
BENCH_FLAGS ?=

bench-build: build
	cd bench && CGO_ENABLED=0 $(GO) build -trimpath -o $(abspath $(BIN))/ ./cmd/...
	cd kit && CGO_ENABLED=0 $(GO) build -trimpath -o $(abspath $(BIN))/ ./internal/cmd/bench-relay

bench: bench-build
	$(BIN)/bench -bin $(BIN) -configs all,sustained $(BENCH_FLAGS)

bench-smoke: bench-build
	$(BIN)/bench -bin $(BIN) -messages 200 -paced 1s -relay-rows 2000 -sustain 5s -sustain-rate 2000 -configs all,sustained $(BENCH_FLAGS)

bench-check:
	@out=$$(gofmt -l bench); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...
