#!/usr/bin/env bash
# Sets up everything agenthost needs on a fresh Linux machine, idempotently:
# the pinned agents (omp on Bun, pi on Node, and the ACP agents claude-agent-acp,
# codex-acp and copilot) from the npm registry into .tools/ (git ignores its
# node_modules and the agents' shared cache), and the agenthost binary in bin/.
# Needs: go (1.26+), node (20+) and npm on PATH; the page's browser test
# needs Chromium (installed here from Debian's packages when run as root).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '==> %s\n' "$*"; }
fail() { printf 'setup: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || fail "go is not on PATH (Go 1.26 or newer is needed)"
command -v node >/dev/null || fail "node is not on PATH (Node.js 20 or newer is needed for pi)"
command -v npm >/dev/null || fail "npm is not on PATH"

# The pinned packages, read from .tools/package.json (its lock pins the rest).
pkgs=(@oh-my-pi/pi-coding-agent @mariozechner/pi-coding-agent bun
  @agentclientprotocol/claude-agent-acp @agentclientprotocol/codex-acp @github/copilot)

want() { node -p "require('./.tools/package.json').dependencies['$1']"; }
have() { # installed version of an npm package in .tools, or nothing
  node -p "try { require('./.tools/node_modules/$1/package.json').version } catch { '' }" 2>/dev/null
}

missing=()
for p in "${pkgs[@]}"; do
  [ "$(have "$p")" = "$(want "$p")" ] || missing+=("$p@$(want "$p")")
done
if [ ${#missing[@]} -eq 0 ] && .tools/node_modules/.bin/bun --version >/dev/null 2>&1; then
  step "agents already installed: omp $(want @oh-my-pi/pi-coding-agent), pi $(want @mariozechner/pi-coding-agent), bun $(want bun)"
  step "ACP agents already installed: claude-agent-acp $(want @agentclientprotocol/claude-agent-acp), codex-acp $(want @agentclientprotocol/codex-acp), copilot $(want @github/copilot)"
else
  step "installing ${missing[*]:-the bun binary} from the npm registry into .tools/ (1-3 minutes, about 1.5 GB with the ACP agents)"
  # npm install, not npm ci: omp lists optional native packages for other
  # platforms at versions the registry does not have, which npm ci rejects
  # as an out-of-sync lock. The lock still pins every installed version.
  (cd .tools && npm install --no-audit --no-fund --loglevel=error)
  for p in "${pkgs[@]}"; do
    [ "$(have "$p")" = "$(want "$p")" ] || fail "$p is at '$(have "$p")' after npm install, want $(want "$p")"
  done
  if ! .tools/node_modules/.bin/bun --version >/dev/null 2>&1; then
    step "linking bun's platform binary"
    (cd .tools/node_modules/bun && node install.js)
  fi
fi
# copilot unpacks ~235 MB into its cache on its first start: one cache shared by every run.
mkdir -p .tools/cache
step "bun $(.tools/node_modules/.bin/bun --version), node $(node --version)"

if command -v chromium >/dev/null; then
  step "chromium for the browser test: $(chromium --version 2>/dev/null || echo present)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  step "installing chromium from Debian's packages (the page's browser test drives it)"
  apt-get update -qq && apt-get install -y -qq chromium
else
  step "note: the page's browser test needs Chromium: sudo apt-get install chromium (make test fails that test without it)"
fi

step "building bin/agenthost"
mkdir -p bin
go build -o bin/agenthost ./cmd/agenthost
step "done: bin/agenthost doctor tells what is installed and whether each agent starts"
