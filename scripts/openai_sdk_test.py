"""The official OpenAI Python SDK against the gateway (started by scripts/openai_sdk.sh).

Usage: openai_sdk_test.py BASE_URL   (e.g. http://127.0.0.1:8080/v1)

Prints one line per check and a closing `N passed, M failed`; exits 1 if any failed.
"""

import sys
import time

import openai

BASE = sys.argv[1]
results = []


def check(name):
    def run(fn):
        try:
            fn()
            results.append((name, None))
            print(f"ok   {name}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
            results.append((name, e))
            print(f"FAIL {name}: {type(e).__name__}: {e}")
        return fn

    return run


client = openai.OpenAI(base_url=BASE, api_key="sk-sdk", max_retries=0, timeout=30)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


@check("chat, not streamed")
def _():
    reply = client.chat.completions.create(model="kvgate-sim", messages=MESSAGES, max_tokens=12)
    assert reply.object == "chat.completion", reply
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content, reply
    assert 1 <= reply.usage.completion_tokens <= 12, reply.usage


@check("chat, streamed, with stream_options.include_usage")
def _():
    stream = client.chat.completions.create(
        model="kvgate-sim", messages=MESSAGES, max_tokens=12, stream=True, stream_options={"include_usage": True}
    )
    text, usage, chunks = "", None, 0
    for chunk in stream:
        chunks += 1
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    assert chunks >= 3 and text, (chunks, text)
    assert usage is not None and 1 <= usage.completion_tokens <= 12, usage


@check("completions, not streamed and streamed")
def _():
    reply = client.completions.create(model="kvgate-sim", prompt="Once upon a time", max_tokens=8)
    assert reply.object == "text_completion" and reply.choices[0].text, reply
    pieces = [c.choices[0].text for c in client.completions.create(model="kvgate-sim", prompt="Hi", max_tokens=8, stream=True) if c.choices]
    assert "".join(pieces), pieces


@check("x-ratelimit-* headers on answers")
def _():
    raw = client.chat.completions.with_raw_response.create(model="kvgate-sim", messages=MESSAGES, max_tokens=4)
    headers = raw.headers
    for name in [
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ]:
        assert name in headers, (name, dict(headers))
    # The sdk tenant's request bucket: 1000 a burst, refilled at one every 2 s; earlier checks spent some.
    assert int(headers["x-ratelimit-limit-requests"]) == 1000, dict(headers)
    assert int(headers["x-ratelimit-remaining-requests"]) < 1000, dict(headers)
    assert int(headers["x-ratelimit-limit-tokens"]) == 500000, dict(headers)
    assert headers["x-ratelimit-reset-requests"].endswith("s"), dict(headers)
    assert raw.parse().choices[0].message.content, raw.parse()


@check("a 429 is a RateLimitError with Retry-After, and the SDK's own retry gets through")
def _():
    slow = openai.OpenAI(base_url=BASE, api_key="sk-slow", max_retries=0, timeout=30)
    slow.chat.completions.create(model="kvgate-sim", messages=MESSAGES, max_tokens=2)
    try:
        slow.chat.completions.create(model="kvgate-sim", messages=MESSAGES, max_tokens=2)
        raise AssertionError("the second request within a second was not limited")
    except openai.RateLimitError as e:
        assert e.status_code == 429
        assert e.response.headers.get("retry-after") and e.response.headers.get("retry-after-ms"), e.response.headers
        assert e.response.headers["x-ratelimit-remaining-requests"] == "0"
        assert e.body["code"] == "rate_limited", e.body
    patient = openai.OpenAI(base_url=BASE, api_key="sk-slow", max_retries=3, timeout=30)
    started = time.monotonic()
    reply = patient.chat.completions.create(model="kvgate-sim", messages=MESSAGES, max_tokens=2)
    assert reply.choices[0].message.content
    assert time.monotonic() - started < 25


@check("a malformed request is a BadRequestError; an unknown key an AuthenticationError")
def _():
    try:
        client.chat.completions.create(model="kvgate-sim", messages=[], max_tokens=2)
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        assert e.body["code"] == "invalid_messages", e.body
    try:
        openai.OpenAI(base_url=BASE, api_key="sk-nobody", max_retries=0).models.list()
        client_unknown = openai.OpenAI(base_url=BASE, api_key="sk-nobody", max_retries=0)
        client_unknown.chat.completions.create(model="kvgate-sim", messages=MESSAGES, max_tokens=2)
        raise AssertionError("unknown key accepted")
    except openai.AuthenticationError as e:
        assert e.status_code == 401


@check("models list")
def _():
    models = client.models.list()
    assert [m.id for m in models.data] == ["kvgate-sim"], models


failed = sum(1 for _, e in results if e is not None)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
