#!/usr/bin/env bash
# Sets up agenthost on a fresh Linux machine, idempotently. Pinned agents come
# from the npm registry into .tools/ (git ignores node_modules and the agents'
# shared cache); the agenthost binary is built into bin/.
#
#   setup.sh         what `agenthost serve` uses by default: omp on Bun, pi
#                    on Node (.tools/package.json), and bin/agenthost
#   setup.sh --acp   also the ACP agents claude-agent-acp, codex-acp and
#                    copilot (.tools/acp/package.json, about 1.2 GB); agenthost
#                    installs them itself when a command first needs them
#   setup.sh --test  everything the tests need: the ACP agents, Redocly CLI
#                    (.tools/lint/package.json) for the OpenAPI document's
#                    lint, Jaeger's build (the tracing tests' collector,
#                    compiled into Go's build cache), and Chromium for the
#                    page's browser test (from Debian's packages when run as
#                    root); not bin/agenthost, which no test runs
#                    (the tests build what they run, with make test's race
#                    flags)
#
# Needs: go (1.26+), node (20+) and npm on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

acp=0 chromium=0 lint=0 build=1
case "${1:-}" in
"") ;;
--acp) acp=1 ;;
--test) acp=1 chromium=1 lint=1 build=0 ;;
*) printf 'usage: %s [--acp|--test]\n' "$0" >&2; exit 2 ;;
esac

step() { printf '==> %s\n' "$*"; }
fail() { printf 'setup: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || fail "go is not on PATH (Go 1.26 or newer is needed)"
command -v node >/dev/null || fail "node is not on PATH (Node.js 20 or newer is needed for pi)"
command -v npm >/dev/null || fail "npm is not on PATH"

# One node start per question (each takes tens of milliseconds).
# pins DIR PACKAGE...: the pinned versions, space-separated.
pins() {
  node -e 'const [d, ...ps] = process.argv.slice(1); const deps = require(`./${d}/package.json`).dependencies;
console.log(ps.map((p) => deps[p]).join(" "))' "$@"
}
# missing DIR PACKAGE...: PACKAGE@PIN for each not installed at its pin.
missing() {
  node -e 'const [d, ...ps] = process.argv.slice(1); const deps = require(`./${d}/package.json`).dependencies;
for (const p of ps) {
  let have = "";
  try { have = require(`./${d}/node_modules/${p}/package.json`).version; } catch {}
  if (have !== deps[p]) console.log(`${p}@${deps[p]} (installed: ${have || "none"})`);
}' "$@"
}

# install DIR WHAT PACKAGE...: npm install in DIR unless every pinned PACKAGE
# is there at its version (DIR's lock pins the rest).
install() {
  local dir=$1 what=$2 left
  shift 2
  left=$(missing "$dir" "$@")
  if [ -z "$left" ]; then
    step "$what already installed"
    return
  fi
  step "installing $(printf '%s\n' "$left" | cut -d' ' -f1 | paste -sd' ') from the npm registry into $dir/"
  local t0=$SECONDS
  # npm install, not npm ci: omp and copilot list optional native packages
  # for other platforms at versions the registry does not have, which npm ci
  # rejects as an out-of-sync lock. The lock still pins every installed version.
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error)
  left=$(missing "$dir" "$@")
  [ -z "$left" ] || fail "after npm install, still not at their pins: $(printf '%s\n' "$left" | paste -sd';')"
  step "$what installed in $((SECONDS - t0)) s"
}

read -r v_omp v_pi v_bun <<<"$(pins .tools @oh-my-pi/pi-coding-agent @mariozechner/pi-coding-agent bun)"
install .tools "omp $v_omp, pi $v_pi, bun $v_bun" @oh-my-pi/pi-coding-agent @mariozechner/pi-coding-agent bun
if ! .tools/node_modules/.bin/bun --version >/dev/null 2>&1; then
  step "linking bun's platform binary"
  (cd .tools/node_modules/bun && node install.js)
fi
step "bun $(.tools/node_modules/.bin/bun --version), node $(node --version)"

if [ $acp = 1 ]; then
  read -r v_claude v_codex v_copilot <<<"$(pins .tools/acp @agentclientprotocol/claude-agent-acp @agentclientprotocol/codex-acp @github/copilot)"
  install .tools/acp "ACP agents: claude-agent-acp $v_claude, codex-acp $v_codex, copilot $v_copilot" \
    @agentclientprotocol/claude-agent-acp @agentclientprotocol/codex-acp @github/copilot
  # copilot unpacks ~235 MB into its cache on its first start: one cache shared by every run.
  mkdir -p .tools/cache
fi

if [ $lint = 1 ]; then
  # Redocly CLI lints the served OpenAPI document (internal/server's
  # TestOpenAPIRedocly): one bundled package, about 15 MB, in seconds.
  read -r v_redocly <<<"$(pins .tools/lint @redocly/cli)"
  install .tools/lint "Redocly CLI $v_redocly" @redocly/cli
fi

if [ $lint = 1 ]; then
  # The tracing tests export to a real Jaeger, pinned as a Go tool in a
  # module of its own (internal/tracing/testdata/jaeger). Building it is
  # minutes of CPU on an empty build cache: done here, beside make test's
  # vet, the tests' own build of it (the same command and flags) is a cache
  # hit in seconds rather than minutes inside a test's deadline.
  step "building Jaeger into Go's build cache for the tracing tests"
  jaeger_out=$(mktemp -d)
  (cd internal/tracing/testdata/jaeger &&
    GOFLAGS=-buildvcs=false go build -o "$jaeger_out/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger) ||
    { rm -rf "$jaeger_out"; fail "building Jaeger for the tracing tests failed"; }
  rm -rf "$jaeger_out"
fi

if [ $chromium = 1 ]; then
  if command -v chromium >/dev/null; then
    step "chromium for the browser test: $(chromium --version 2>/dev/null || echo present)"
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing chromium from Debian's packages (the page's browser test drives it)"
    apt-get update -qq && apt-get install -y -qq chromium
  else
    step "note: the page's browser test needs Chromium: sudo apt-get install chromium (make test fails that test without it)"
  fi
fi

if [ $build = 0 ]; then
  step "done: the tests build agenthost themselves (make run builds bin/agenthost)"
  exit 0
fi
step "building bin/agenthost"
mkdir -p bin
# -buildvcs=auto: the binary names its revision (agenthost version) even
# where GOFLAGS turns stamping off.
go build -buildvcs=auto -o bin/agenthost ./cmd/agenthost
step "done: bin/agenthost doctor tells what is installed and whether each agent starts"
