"""The lab's GGUF model: a tiny llama that llama.cpp's own `llama-server` loads and serves.

Written with the `gguf` package of the llama.cpp source the lab's server is built from
(gguf-py; llama_build.py runs this file in a Python that has its needs): the llama architecture
(llama.cpp's src/llama-model.cpp reads these keys for LLM_ARCH_LLAMA), a SentencePiece-style
vocabulary small enough to read (control tokens, the 256 byte tokens any text falls back to,
printable ASCII), ChatML's chat template (the Qwen models the lanes serve use ChatML:
<|im_start|>role ... <|im_end|>), and weights drawn from a fixed seed: the same bytes on every
machine. It answers nothing sensible, as no model this small could.

    python lab_gguf.py write OUT.gguf     # the model
    python lab_gguf.py describe IN.gguf   # what gguf's reader finds in it, as JSON
"""

from __future__ import annotations

import json
import sys

import gguf
import numpy as np

ARCH = "llama"
NAME = "simlab tiny llama"
# Heads of 32: the lanes' quantized KV cache (--cache-type-k/-v q8_0) needs the head's size a
# multiple of q8_0's block of 32; llama_init_from_model refuses 16 ("K cache type q8_0 with
# block size 32 does not divide n_embd_head_k=16", src/llama-context.cpp, seen on this build).
EMBEDDING, HEADS, FEED_FORWARD, BLOCKS = 64, 2, 128, 2
# The training context llama.cpp reads as n_ctx_train (--ctx-size 0 takes it): the lanes' 131K.
CONTEXT = 131072
RMS_EPS = 1e-5
SEED = 20260
CONTROL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
UNK, BOS, EOS, IM_START, IM_END = range(len(CONTROL))
PRINTABLE = [chr(code) for code in range(0x21, 0x7F)]
SPACE = "\u2581"  # SentencePiece's word boundary
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def vocabulary() -> tuple[list[str], list[int], list[float]]:
    """The tokens, their types (gguf.TokenType) and SentencePiece scores."""
    tokens = [*CONTROL, *(f"<0x{byte:02X}>" for byte in range(256)), SPACE, *PRINTABLE]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * (len(CONTROL) - 1)
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (1 + len(PRINTABLE))
    scores = [0.0] * (len(CONTROL) + 256) + [-float(i) for i in range(1 + len(PRINTABLE))]
    return tokens, [int(t) for t in types], scores


def tensors(vocab: int) -> dict[str, np.ndarray]:
    """The weights, numpy's shapes (rows: ggml's second dimension), float32."""
    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    weights = {"token_embd.weight": normal(vocab, EMBEDDING)}
    for block in range(BLOCKS):
        prefix = f"blk.{block}"
        weights[f"{prefix}.attn_norm.weight"] = np.ones(EMBEDDING, dtype=np.float32)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            weights[f"{prefix}.{name}.weight"] = normal(EMBEDDING, EMBEDDING)
        weights[f"{prefix}.ffn_norm.weight"] = np.ones(EMBEDDING, dtype=np.float32)
        weights[f"{prefix}.ffn_gate.weight"] = normal(FEED_FORWARD, EMBEDDING)
        weights[f"{prefix}.ffn_up.weight"] = normal(FEED_FORWARD, EMBEDDING)
        weights[f"{prefix}.ffn_down.weight"] = normal(EMBEDDING, FEED_FORWARD)
    weights["output_norm.weight"] = np.ones(EMBEDDING, dtype=np.float32)
    weights["output.weight"] = normal(vocab, EMBEDDING)
    return weights


def write(path: str) -> None:
    tokens, types, scores = vocabulary()
    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_name(NAME)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(EMBEDDING)
    writer.add_block_count(BLOCKS)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBEDDING // HEADS)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(IM_END)  # ChatML's turn ends the answer
    writer.add_eot_token_id(IM_END)
    writer.add_unk_token_id(UNK)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, data in tensors(len(tokens)).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def describe(path: str) -> dict[str, object]:
    """What gguf's reader finds: each metadata key's value (a token list: its length, first
    and last items) and each tensor's shape (ggml's order) and type."""
    reader = gguf.GGUFReader(path)
    fields: dict[str, object] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        value = field.contents()
        if isinstance(value, list) and len(value) > 8:
            value = {"length": len(value), "first": value[:6], "last": value[-2:]}
        fields[name] = value
    shapes = {t.name: [[int(n) for n in t.shape], t.tensor_type.name] for t in reader.tensors}
    return {"fields": fields, "tensors": shapes}


if __name__ == "__main__":
    command, file = sys.argv[1:]
    if command == "write":
        write(file)
    else:
        print(json.dumps(describe(file)))
