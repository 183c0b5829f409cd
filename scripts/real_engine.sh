#!/usr/bin/env bash
# A real inference engine behind the gateway, without a GPU or downloaded weights: llama.cpp's own
# `llama-server`, built from the llama.cpp sources inside the `llama-cpp-python` source package (PyPI),
# serving a tiny random-weight Llama model written with the `gguf` package (scripts/real_engine_model.py).
# Then scripts/real_engine_test.py runs the gateway's proxy checks against it:
#
#   - SSE passed through chunk by chunk;
#   - the rewritten limits honoured: `max_tokens` next to a larger `n_predict` (which llama-server reads
#     first) generates exactly the reservation;
#   - a client disconnect aborts the engine's generation (its /metrics and /slots go idle, far fewer tokens
#     than asked are generated);
#   - the engine's busy answer (503 while its model loads) reaches the client as a 503, not a 502;
#   - the engine's /metrics readable.
#
#   scripts/real_engine.sh
#
# The build is cached in $REAL_ENGINE_CACHE (default ~/.cache/kvgate/real-engine; about 12 minutes on
# 2 cores the first time, nothing after); logs go to target/real-engine/. Needs python3 with venv, a C++
# compiler and make; cmake comes from PyPI. Exits non-zero when a check fails.
# LLAMA_CPP_PYTHON_VERSION picks the source package (default below).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
target="${CARGO_TARGET_DIR:-target}"
cache="${REAL_ENGINE_CACHE:-$HOME/.cache/kvgate/real-engine}"
work="target/real-engine"
venv="$cache/venv"
server="$cache/llama-server-$version"
mkdir -p "$work" "$cache"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check gguf numpy cmake

if [ ! -x "$server" ]; then
    src="$cache/src-$version"
    if [ ! -d "$src" ]; then
        "$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$version" -d "$cache/sdist"
        mkdir -p "$src"
        tar -xzf "$cache/sdist/llama_cpp_python-$version.tar.gz" -C "$src" --strip-components=1
    fi
    build="$cache/build-$version"
    "$venv/bin/cmake" -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >"$work/cmake.log"
    "$venv/bin/cmake" --build "$build" --target llama-server -j "$(nproc)" >"$work/build.log"
    cp "$build/bin/llama-server" "$server"
fi
"$server" --version 2>&1 | head -n 2

model="$cache/tiny-wide.gguf"
[ -f "$model" ] || "$venv/bin/python" scripts/real_engine_model.py "$model" --wide

cargo build --quiet -p kvgate-gateway --bin kvgate-gateway
"$venv/bin/python" scripts/real_engine_test.py "$server" "$model" "$target/debug/kvgate-gateway" "$work"
