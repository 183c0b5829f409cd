#!/usr/bin/env bash
# The official OpenAI Python SDK, unchanged, against the gateway (simulated engine): chat and completions,
# streamed and not, `x-ratelimit-*` headers, a 429 it retries by itself and one it reports, a 400.
#
#   scripts/openai_sdk.sh
#
# Installs `openai` from PyPI into target/openai-sdk-venv (kept between runs), builds the gateway, starts
# it on a free loopback port with a config file of two tenants, runs scripts/openai_sdk_test.py, and
# stops it. Exits non-zero when a check fails. CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
out="target/openai-sdk"
venv="target/openai-sdk-venv"
mkdir -p "$out"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import openai' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check openai
fi
"$venv/bin/python" -c 'import openai; print("openai", openai.__version__)'

cargo build --quiet -p kvgate-gateway --bin kvgate-gateway
# Keys are stored as SHA-256 digests, as an operator writes them (`kvgate-gateway --hash-key`).
sdk_key="$(printf '%s' sk-sdk | "$target/debug/kvgate-gateway" --hash-key)"
cat > "$out/gateway.toml" <<TOML
max_in_flight = 8
kv_tokens = 20000
token_rate = 50000.0

[[tenants]]
name = "sdk"
keys = ["$sdk_key"]
priority = "interactive"
request_rate = 0.5
request_burst = 1000

[[tenants]]
name = "slow"
keys = ["sk-slow"]
request_rate = 1.0
request_burst = 1
TOML

. scripts/lib/gateway.sh
start_gateway "$out/gateway.log" "$target/debug/kvgate-gateway" --config-file "$out/gateway.toml" --sim-tokens-per-sec 400
"$venv/bin/python" scripts/openai_sdk_test.py "$url/v1"
