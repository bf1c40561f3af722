"""The lab's GGUF model (lab_gguf.py) read back by gguf's own reader (gguf-py of the llama.cpp
source the lab's server is built from). Marked lab: it needs the lab's cache (the sdist, and a
Python with numpy, made on first use by llama_build.py)."""

from __future__ import annotations

import hashlib

import pytest

from tests.simlab import llama_build

pytestmark = pytest.mark.lab

# ChatML, as Qwen's templates write it (the answer turn opened for the model).
CHATML = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' +"
    " message['content'] + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# 5 control tokens, 256 byte tokens, SentencePiece's boundary and printable ASCII's 94.
VOCAB = 5 + 256 + 1 + 94


def test_the_model_reads_back_as_a_tiny_llama_with_chatml() -> None:
    described = llama_build.describe_model(llama_build.lab_model())
    fields = described["fields"]
    lists = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
    assert {key: value for key, value in fields.items() if key not in lists} == {
        "general.architecture": "llama",
        "general.name": "simlab tiny llama",
        "general.file_type": 0,  # ALL_F32
        "llama.context_length": 131072,
        "llama.embedding_length": 64,
        "llama.block_count": 2,
        "llama.feed_forward_length": 128,
        "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 2,
        "llama.rope.dimension_count": 32,  # a head's size: 64 / 2
        "llama.attention.layer_norm_rms_epsilon": 9.999999747378752e-06,  # 1e-5 in float32
        "llama.vocab_size": VOCAB,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 4,
        "tokenizer.ggml.eot_token_id": 4,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }
    assert fields["tokenizer.ggml.tokens"] == {
        "length": VOCAB,
        "first": ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<0x00>"],
        "last": ["}", "~"],
    }
    # gguf.TokenType: UNKNOWN 2, CONTROL 3, BYTE 6, NORMAL 1.
    assert fields["tokenizer.ggml.token_type"] == {
        "length": VOCAB,
        "first": [2, 3, 3, 3, 3, 6],
        "last": [1, 1],
    }
    assert fields["tokenizer.ggml.scores"] == {
        "length": VOCAB,
        "first": [0.0] * 6,
        "last": [-93.0, -94.0],
    }
    tensors = described["tensors"]
    assert len(tensors) == 2 + 9 * 2 + 1  # embeddings and output, 9 a block, the final norm
    # ggml's order: the row length first.
    assert {name: shape for name, shape in tensors.items() if not name.startswith("blk.1.")} == {
        "token_embd.weight": [[64, VOCAB], "F32"],
        "blk.0.attn_norm.weight": [[64], "F32"],
        "blk.0.attn_q.weight": [[64, 64], "F32"],
        "blk.0.attn_k.weight": [[64, 64], "F32"],
        "blk.0.attn_v.weight": [[64, 64], "F32"],
        "blk.0.attn_output.weight": [[64, 64], "F32"],
        "blk.0.ffn_norm.weight": [[64], "F32"],
        "blk.0.ffn_gate.weight": [[64, 128], "F32"],
        "blk.0.ffn_up.weight": [[64, 128], "F32"],
        "blk.0.ffn_down.weight": [[128, 64], "F32"],
        "output_norm.weight": [[64], "F32"],
        "output.weight": [[64, VOCAB], "F32"],
    }


def test_the_model_is_the_same_bytes_on_every_machine() -> None:
    # Written here twice (by hand, 2026-11-28): the same SHA-256 both times, fixed by the seed and
    # the pinned numpy.
    model = llama_build.lab_model().read_bytes()
    assert hashlib.sha256(model).hexdigest() == (
        "fb54b115eaf2d4a2749744889a0a53ef77eb211b7fe4d4a7ff88de20430f9a75"
    )
    assert len(model) == 520992
