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
cat > "$out/gateway.toml" <<'TOML'
max_in_flight = 8
kv_tokens = 20000
token_rate = 50000.0

[[tenants]]
name = "sdk"
keys = ["sk-sdk"]
priority = "interactive"
request_rate = 0.5
request_burst = 1000

[[tenants]]
name = "slow"
keys = ["sk-slow"]
request_rate = 1.0
request_burst = 1
TOML

"$target/debug/kvgate-gateway" --listen 127.0.0.1:0 --config "$out/gateway.toml" --sim-tokens-per-sec 400 \
    2>"$out/gateway.log" &
gateway_pid=$!
trap 'kill "$gateway_pid" 2>/dev/null || true; wait "$gateway_pid" 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 100); do
    url="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$out/gateway.log" | head -n1 || true)"
    [ -n "$url" ] && break
    kill -0 "$gateway_pid" 2>/dev/null || { cat "$out/gateway.log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { echo "the gateway did not start" >&2; exit 1; }
"$venv/bin/python" scripts/openai_sdk_test.py "$url/v1"
