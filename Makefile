# The two commands of the README:
#   make run   set up (agents + binary) and serve rooms (agenthost serve) on omp and the built-in model
#   make test  set up and run every test, with the race detector
GO ?= go

.PHONY: setup run demo test check fuzz bench

setup:
	@./scripts/setup.sh

run: setup
	./bin/agenthost doctor
	./bin/agenthost serve $(ARGS)

# One turn against omp on the built-in model, printed (what `make run` did
# before the server).
demo: setup
	./bin/agenthost prompt --agent omp "Run this: [[tool:bash {\"command\":\"echo hello from omp\"}]]"

test: setup
	$(GO) vet ./...
	AGENTHOST_CLUSTER_TESTS=1 $(GO) test -race -count=1 -timeout 10m ./...

# Static checks beyond vet (staticcheck is fetched through the Go module proxy).
check:
	test -z "$$(gofmt -l .)"
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.6.1 ./...

# Fuzz each target (FUZZTIME=10m for a real run).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./rpc -run '^$$' -fuzz '^FuzzFramer$$' -fuzztime $(FUZZTIME)
	$(GO) test ./rpc -run '^$$' -fuzz '^FuzzScanFrame$$' -fuzztime $(FUZZTIME)
	$(GO) test ./rpc -run '^$$' -fuzz '^FuzzReassembler$$' -fuzztime $(FUZZTIME)
	$(GO) test ./procd -run '^$$' -fuzz '^FuzzEnvelope$$' -fuzztime $(FUZZTIME)
	$(GO) test ./procd -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZTIME)
	$(GO) test ./internal/snapshot -run '^$$' -fuzz '^FuzzParseRawDiff$$' -fuzztime $(FUZZTIME)
	$(GO) test ./internal/snapshot -run '^$$' -fuzz '^FuzzParseStatus$$' -fuzztime $(FUZZTIME)

bench: setup
	$(GO) test ./rpc -run '^$$' -bench . -benchmem
	$(GO) test ./procd -run '^$$' -bench PipeThroughput -benchtime 10x -count 3
	$(GO) test ./internal/snapshot -run '^$$' -bench . -benchtime 5x
	./bin/agenthost bench
