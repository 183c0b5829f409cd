# Sourced by the scripts that run the gateway binary: `start_gateway LOG BINARY ARGS...` starts it on a free
# loopback port (the gateway binds port 0 and prints the address it got), stops it when the script exits,
# and sets `gateway_pid` and `url` (http://127.0.0.1:PORT). Returns non-zero if it does not start.
start_gateway() {
    local log="$1"
    shift
    "$@" --listen 127.0.0.1:0 2>"$log" &
    gateway_pid=$!
    trap 'kill "$gateway_pid" 2>/dev/null || true; wait "$gateway_pid" 2>/dev/null || true' EXIT
    url=""
    for _ in $(seq 1 100); do
        url="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -n1 || true)"
        [ -n "$url" ] && return 0
        kill -0 "$gateway_pid" 2>/dev/null || { cat "$log" >&2; return 1; }
        sleep 0.1
    done
    echo "the gateway did not start" >&2
    return 1
}
