#!/usr/bin/env bash
# The official OpenAI Node SDK, with its default retries, against the gateway limited to 2 requests/s
# (burst 2, simulated engine): twelve concurrent streamed chat completions must all be served with at most
# 15 refusals in all (issue #33, "hints that do not herd": the SDK sleeps exactly `retry-after-ms`, without
# jitter, so equal hints bring refused clients back together).
#
#   scripts/openai_node.sh                   # asserts
#   EXPECT=baseline scripts/openai_node.sh   # measures and prints only
#
# Installs `openai` (pinned below; OPENAI_NODE_VERSION overrides) from npm into $OPENAI_NODE_CACHE
# (default ~/.cache/kvgate/openai-node, kept between runs), builds the gateway (release), starts it on a
# free loopback port, runs scripts/openai_node_test.mjs, and stops it. The gateway's log, with one JSON
# line per request, goes to target/openai-node/gateway.log. Needs node >= 18 and npm (installed with apt-get
# when missing). Exits non-zero when the check fails. CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${OPENAI_NODE_VERSION:-4.104.0}"
target="${CARGO_TARGET_DIR:-target}"
cache="${OPENAI_NODE_CACHE:-$HOME/.cache/kvgate/openai-node}/$version"
out="target/openai-node"
mkdir -p "$out" "$cache"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

installed="$(node -p 'require(process.argv[1]).version' "$cache/node_modules/openai/package.json" 2>/dev/null || true)"
if [ "$installed" != "$version" ]; then
    [ -f "$cache/package.json" ] || echo '{ "private": true }' > "$cache/package.json"
    timeout 300 npm install --prefix "$cache" --no-audit --no-fund --loglevel=error "openai@$version" >/dev/null
fi
echo "node $(node --version), openai $(node -p 'require(process.argv[1]).version' "$cache/node_modules/openai/package.json")"

cargo build --quiet --release -p kvgate-gateway --bin kvgate-gateway

. scripts/lib/gateway.sh
# Only the rate limits: room for all twelve in flight and in the queue, no KV budget.
start_gateway "$out/gateway.log" "$target/release/kvgate-gateway" \
    --rate 2 --rate-burst 2 --max-in-flight 64 --queue 256 --sim-tokens-per-sec 400
OPENAI_NODE_DIR="$cache" timeout 120 node scripts/openai_node_test.mjs "$url/v1"
