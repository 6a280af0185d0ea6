# The test command CI runs is `make test`. It needs PostgreSQL on 127.0.0.1:5432
# (trust auth, user postgres) and RabbitMQ on 127.0.0.1:5672 (guest/guest) with
# rabbitmqctl on PATH: the tests create their own databases and vhosts.
GO      ?= go
BIN     ?= bin
PROGRAMS = payment-service fake-gateway order-publisher inboxctl

.PHONY: all build test check fmt vet lint clean

all: check build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ $(addprefix ./cmd/,$(PROGRAMS))

# check: formatting and vet, then the whole suite with the race detector (group
# commit, the default), the packages that commit messages again with a
# transaction per message, then the tests that restart the broker itself,
# alone so that they disturb no other.
COMMIT_PACKAGES = ./internal/inbox ./internal/consumer ./internal/payment ./internal/deadletter ./internal/e2e
test: check
	$(GO) test -race -count=1 -timeout 40m ./...
	@echo "== the integration suite again with a transaction per message (GROUP_COMMIT_MAX=1)"
	TEST_GROUP_COMMIT_MAX=1 $(GO) test -race -count=1 -timeout 30m $(COMMIT_PACKAGES)
	$(GO) test -race -count=1 -timeout 15m -tags disruptive -run Disruptive ./internal/e2e

check: fmt vet

fmt:
	@out=$$(gofmt -l cmd internal); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)

# Fault scripts (scripts/faults, scripts/chaos.sh): local processes on the local
# RabbitMQ and PostgreSQL (or docker compose: STACK=compose), each run on a fresh
# vhost and fresh databases. `faults` runs every scenario in turn and stops at
# the first FAIL; scripts/faults/broker-restart.sh stops the local broker for a
# few seconds. `chaos` is the bounded run CI uses.
.PHONY: faults chaos
FAULT_SCRIPTS ?= $(sort $(wildcard scripts/faults/*.sh))
CHAOS_FLAGS   ?= --duration 60s --orders 1500

faults: build
	@for s in $(FAULT_SCRIPTS); do echo "== $$s"; ./$$s || exit 1; done

chaos: build
	./scripts/chaos.sh $(CHAOS_FLAGS)
