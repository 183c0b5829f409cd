"""The gateway's proxy checks against llama.cpp's server (started here; see scripts/real_engine.sh).

Usage: real_engine_test.py LLAMA_SERVER MODEL.gguf KVGATE_GATEWAY WORKDIR

Prints one line per check and a closing `N passed, M failed`; exits 1 if any failed.
"""

import http.client
import json
import re
import socket
import subprocess
import sys
import time

SERVER, MODEL, GATEWAY, WORK = sys.argv[1:5]
results = []
CAP = 60.0  # every wait is bounded by this


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(name):
    def run(fn):
        try:
            fn()
            results.append((name, None))
            print(f"ok   {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, then counted
            results.append((name, e))
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        return fn

    return run


def request(port, method, path, body=None, timeout=CAP):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"content-type": "application/json"} if body is not None else {}
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = conn.getresponse()
    return conn, response


def call(port, method, path, body=None):
    conn, response = request(port, method, path, body)
    data = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), data


def eventually(fn, what):
    deadline = time.monotonic() + CAP
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {CAP:.0f} s: {what}")


engine_port, gateway_port = free_port(), free_port()
log = open(f"{WORK}/llama-server.log", "w")
gateway_log = open(f"{WORK}/gateway.log", "w")
# The gateway first, then the engine: the first requests meet the engine while it loads.
gateway = subprocess.Popen(
    [GATEWAY, "--listen", f"127.0.0.1:{gateway_port}", "--upstream", f"http://127.0.0.1:{engine_port}",
     "--max-in-flight", "2", "--kv-tokens", "512", "--upstream-timeout", "30s", "--max-output-tokens", "200"],
    stderr=gateway_log,
)
engine = subprocess.Popen(
    [SERVER, "-m", MODEL, "--host", "127.0.0.1", "--port", str(engine_port), "-np", "2", "-c", "512",
     "--metrics", "--slots", "-t", "2", "--seed", "7"],
    stdout=log, stderr=log,
)
busy_statuses = []
try:
    # While the engine loads: a 503 of its own (if it is seen) must reach the client as a 503.
    deadline = time.monotonic() + CAP
    while time.monotonic() < deadline and engine.poll() is None:
        try:
            status, headers, body = call(gateway_port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1})
        except OSError:
            time.sleep(0.005)
            continue
        busy_statuses.append(status)
        if status == 200:
            break
        time.sleep(0.005)

    @check("the engine comes up behind the gateway; its busy answers are 503 (not 502)")
    def _():
        counts = {s: busy_statuses.count(s) for s in sorted(set(busy_statuses))}
        assert engine.poll() is None, f"llama-server exited: see {WORK}/llama-server.log"
        assert busy_statuses and busy_statuses[-1] == 200, counts
        assert all(s in (200, 502, 503) for s in busy_statuses), counts
        # 502 only while nothing listened yet (connection refused); once the engine answered, 503s.
        first_answer = next((i for i, s in enumerate(busy_statuses) if s != 502), None)
        assert all(s != 502 for s in busy_statuses[first_answer:]), counts
        print(f"     statuses while the engine started: {counts}")

    @check("SSE passes through chunk by chunk")
    def _():
        conn, response = request(gateway_port, "POST", "/v1/chat/completions", {
            "stream": True, "max_tokens": 24, "ignore_eos": True,
            "messages": [{"role": "user", "content": "tell me a story"}],
        })
        assert response.status == 200, response.status
        assert response.getheader("content-type", "").startswith("text/event-stream")
        events = 0
        while True:
            line = response.fp.readline()
            if not line:
                break
            if line.startswith(b"data: ") and b"[DONE]" not in line:
                events += 1
        conn.close()
        assert events >= 10, f"{events} events"

    @check("the reservation is what the engine generates: max_tokens 7 next to n_predict 150")
    def _():
        status, _, body = call(gateway_port, "POST", "/v1/completions", {
            "prompt": "once upon a time", "max_tokens": 7, "n_predict": 150, "ignore_eos": True,
        })
        assert status == 200, body
        usage = json.loads(body)["usage"]
        assert usage["completion_tokens"] == 7, usage
        status, _, body = call(gateway_port, "POST", "/v1/chat/completions", {
            "n_predict": 150, "ignore_eos": True, "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 5, "max_tokens": 150,
        })
        assert status == 200, body
        assert json.loads(body)["usage"]["completion_tokens"] == 5, body

    def engine_metrics():
        status, _, body = call(engine_port, "GET", "/metrics")
        assert status == 200, status
        return body.decode()

    def metric(text, name):
        match = re.search(rf"^llamacpp:{name}\s+([0-9.e+]+)", text, re.M)
        return float(match.group(1)) if match else None

    @check("a client disconnect aborts the engine's generation")
    def _():
        before = metric(engine_metrics(), "tokens_predicted_total") or 0.0
        conn, response = request(gateway_port, "POST", "/v1/completions", {
            "prompt": "count", "max_tokens": 200, "ignore_eos": True, "stream": True,
        })
        assert response.status == 200
        response.fp.readline()
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        eventually(lambda: metric(engine_metrics(), "requests_processing") == 0, "the engine went idle")
        time.sleep(0.5)
        after = metric(engine_metrics(), "tokens_predicted_total") or 0.0
        print(f"     tokens generated for the abandoned request: {after - before:.0f} of 200")
        assert after - before < 200, (before, after)

    @check("the engine's /metrics is readable")
    def _():
        text = engine_metrics()
        for name in ["prompt_tokens_total", "tokens_predicted_total", "requests_processing"]:
            assert metric(text, name) is not None, name
finally:
    for process in (gateway, engine):
        process.terminate()
    for process in (gateway, engine):
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()

failed = sum(1 for _, e in results if e is not None)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
