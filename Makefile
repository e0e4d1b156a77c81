# The two commands of the README:
#   make run   set up what serve uses (omp, pi, Bun, the binary) and serve rooms (agenthost serve) on omp and the built-in model
#   make test  set up everything (the ACP agents and Chromium too) and run every test, with the race detector
GO ?= go

.PHONY: setup setup-acp setup-test run demo test check fuzz bench chaos

# omp, pi, Bun and bin/agenthost: what serve and prompt use by default.
setup:
	@./scripts/setup.sh

# The ACP agents (claude-agent-acp, codex-acp, copilot) as well; agenthost
# also installs them itself when a command first needs them.
setup-acp:
	@./scripts/setup.sh --acp

# Everything the tests drive: the ACP agents and Chromium as well.
setup-test:
	@./scripts/setup.sh --test

run: setup
	./bin/agenthost doctor --transport rpc
	./bin/agenthost serve $(ARGS)

# One turn against omp on the built-in model (what `make run` did before the
# server): omp runs a command in a throwaway folder, confined to it, and the
# file it wrote is shown.
demo: setup
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	echo 'agenthost prompt: omp, on the built-in model, runs: echo hello from omp > hello.txt' && \
	./bin/agenthost prompt --agent omp --cwd "$$d" "Run this: [[tool:bash {\"command\":\"echo hello from omp > hello.txt\"}]]" && \
	echo "hello.txt, which omp wrote in its folder: $$(cat "$$d/hello.txt")"

# go vet runs every analyzer first; go test's own subset of them would only
# analyze every dependency again (about a minute of CPU on a cold cache).
# Both build with the race flags (GOFLAGS, which the tests' own go builds
# inherit too), so that vet's compile of every dependency is the one the
# tests link. On an empty build cache, vet and the test build take 216 s;
# setup's plain build of bin/agenthost (which no test runs, so setup
# --test skips it), a plain vet and the race build took 374 s.
# The race detector instruments our code and every dependency but SQLite's
# C translated to Go (modernc.org/sqlite/lib, its libc and allocator): that
# code locks with its own mutexes and is tested upstream, and instrumented
# it made the store's tests take 6.7 s instead of 2.9 s. The driver
# (modernc.org/sqlite), database/sql and everything calling them stay
# instrumented.
# A program built with -race sleeps 1 s as it exits (GORACE's
# atexit_sleep_ms), for reports from goroutines still running; the tests'
# helper processes (agents, servers and daemons run from the test binary)
# exit by the hundred, and tests wait for them. A race is still reported
# when it happens, and goleak checks the test binaries leave no goroutine.
RACEFLAGS ?= -race -gcflags=modernc.org/sqlite/lib=-race=false -gcflags=modernc.org/libc/...=-race=false -gcflags=modernc.org/memory=-race=false
GORACE ?= atexit_sleep_ms=0
TEST_GOFLAGS = $(strip $(GOFLAGS) $(RACEFLAGS))
# go test runs the packages in the order they are named, two at a time on
# two cores; ./... names them alphabetically, which left rpc (about 160 s)
# to start last and run alone. The longest start first (figures of a CI
# run); ./... still names every package, and each runs once.
TEST_FIRST = ./cmd/agenthost ./internal/rpcagent ./internal/roomclaims ./rpc ./internal/natsroom ./internal/acpagent ./internal/server
# Setup (downloads: the agents from the npm registry, Chromium) runs beside
# vet (the CPU: compiling every dependency), not before it; the tests start
# once both are done, and not if either failed.
test:
	@./scripts/setup.sh --test & setup=$$!; \
	GOFLAGS="$(TEST_GOFLAGS)" $(GO) vet ./...; vet=$$?; \
	wait $$setup || { echo "make test: setup failed" >&2; exit 1; }; \
	exit $$vet
	GOFLAGS="$(TEST_GOFLAGS)" GORACE="$(GORACE)" AGENTHOST_CLUSTER_TESTS=1 $(GO) test -vet=off -count=1 -timeout 20m $(TEST_FIRST) ./...

# Static checks beyond vet (staticcheck is fetched through the Go module proxy).
check:
	test -z "$$(gofmt -l .)"
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.6.1 ./...
	@# The README says every package builds on macOS, the BSDs and Windows.
	GOOS=darwin $(GO) build ./...
	GOOS=freebsd $(GO) build ./...
	GOOS=windows $(GO) build ./...

# Fuzz each target (FUZZTIME=10m for a real run).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./rpc -run '^$$' -fuzz '^FuzzFramer$$' -fuzztime $(FUZZTIME)
	$(GO) test ./rpc -run '^$$' -fuzz '^FuzzScanFrame$$' -fuzztime $(FUZZTIME)
	$(GO) test ./rpc -run '^$$' -fuzz '^FuzzReassembler$$' -fuzztime $(FUZZTIME)
	$(GO) test ./rpc -run '^$$' -fuzz '^FuzzParseChunk$$' -fuzztime $(FUZZTIME)
	$(GO) test ./procd -run '^$$' -fuzz '^FuzzEnvelope$$' -fuzztime $(FUZZTIME)
	$(GO) test ./procd -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZTIME)
	$(GO) test ./internal/snapshot -run '^$$' -fuzz '^FuzzParseRawDiff$$' -fuzztime $(FUZZTIME)
	$(GO) test ./internal/snapshot -run '^$$' -fuzz '^FuzzParseStatus$$' -fuzztime $(FUZZTIME)
	$(GO) test ./internal/detail -run '^$$' -fuzz '^FuzzRedact$$' -fuzztime $(FUZZTIME)

bench: setup
	$(GO) test ./rpc -run '^$$' -bench . -benchmem
	$(GO) test ./procd -run '^$$' -bench PipeThroughput -benchtime 10x -count 3
	$(GO) test ./internal/snapshot -run '^$$' -bench . -benchtime 5x
	./bin/agenthost bench

# The cluster's fault-injection checker, larger than make test runs it (1
# round over 4 rooms): CHAOS_ROUNDS rounds of its faults (kill -9 of a
# holder, SIGSTOP of a holder past its lease, a lost answer to a log append,
# a full queue, a whole-cluster restart, and the long ones make test leaves
# out: kill -9 of the node leading the log and the lease bucket, a partition
# of it healed, and, as root, a full disk then freed) over CHAOS_ROOMS
# rooms; its figures are logged at the end.
CHAOS_ROUNDS ?= 5
CHAOS_ROOMS ?= 8
chaos:
	AGENTHOST_CLUSTER_TESTS=1 AGENTHOST_CHAOS_LONG=1 AGENTHOST_CHAOS_ROUNDS=$(CHAOS_ROUNDS) AGENTHOST_CHAOS_ROOMS=$(CHAOS_ROOMS) \
		$(GO) test -race -count=1 -timeout 60m -run '^TestServe_NATSClusterFaults$$' -v ./cmd/agenthost
