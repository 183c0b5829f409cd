"""Writes a tiny random-weight Llama model as GGUF, for running llama.cpp's server without downloading
weights: 2 layers, 64-wide, 4 attention heads (2 KV heads), a 256-token context, f32, and a byte-level
SentencePiece vocabulary (<unk>, <s>, </s>, the 128 ASCII bytes as <0xNN>, '▁' and a-z). It generates
noise, fast, which is all the gateway's tests need: tokens, streams, limits, cancellation.

Usage: real_engine_model.py OUT.gguf [--wide]

`--wide` writes a larger one (8 layers, 512-wide, about 130 MB) that takes the server a moment to load:
long enough for requests to meet its "Loading model" answer.
"""

import sys

import gguf
import numpy as np

WIDE = "--wide" in sys.argv[2:]
N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER, N_CTX = (512, 8, 4, 2048, 8, 512) if WIDE else (64, 4, 2, 128, 2, 256)
HEAD_DIM = N_EMBD // N_HEAD


def vocabulary():
    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for byte in range(128):
        tokens.append(f"<0x{byte:02X}>".encode())
        types.append(gguf.TokenType.BYTE)
    for piece in ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]:
        tokens.append(piece.encode())
        types.append(gguf.TokenType.NORMAL)
    scores = [0.0] * 3 + [-1000.0] * 128 + [-1.0] * 27
    return tokens, scores, types


def main(path):
    rng = np.random.default_rng(1234)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("kvgate-tiny-random")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def tensor(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    # numpy shapes are (rows, columns); GGUF stores them reversed, as llama.cpp expects.
    tensor("token_embd.weight", n_vocab, N_EMBD)
    ones("output_norm.weight", N_EMBD)
    tensor("output.weight", n_vocab, N_EMBD)
    for i in range(N_LAYER):
        ones(f"blk.{i}.attn_norm.weight", N_EMBD)
        tensor(f"blk.{i}.attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
        tensor(f"blk.{i}.attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
        tensor(f"blk.{i}.attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
        tensor(f"blk.{i}.attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
        ones(f"blk.{i}.ffn_norm.weight", N_EMBD)
        tensor(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        tensor(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        tensor(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {path}: {n_vocab} tokens, {N_LAYER} layers, {N_EMBD} wide")


if __name__ == "__main__":
    main(sys.argv[1])
