"""The throughput probe (issue 16): the field's figures in the model catalog."""

from __future__ import annotations

import json

import pytest

from operations.recipes import CATALOG, catalog

# --- the field's figures -------------------------------------------------------------------------


def test_the_catalog_carries_the_seeds_figures() -> None:
    cluster = CATALOG["Qwen/Qwen3-235B-A22B-GPTQ-Int4"].throughput
    assert cluster is not None
    assert {c: f.tok_s for c, f in cluster.decode_tok_s.items()} == {1: 17.0, 2: 24.1, 4: 36.4}
    assert all(
        f.kind == "measured" and "seed 004" in f.source for f in cluster.decode_tok_s.values()
    )
    coder = CATALOG["bullpoint/Qwen3-Coder-Next-AWQ-4bit"].throughput
    assert coder is not None and coder.decode_tok_s[1].tok_s == 54.0
    assert "seed 003" in coder.decode_tok_s[1].source and coder.decode_tok_s[1].kind == "reported"
    assert json.loads(cluster.for_probe())["4"]["tok_s"] == 36.4
    assert CATALOG["Qwen/Qwen3-0.6B"].throughput is None


SPEC = {
    "source": "a test",
    "weights_gib": 1.5,
    "attention_layers": 28,
    "kv_heads": 8,
    "head_dim": 128,
    "quantization": "bf16",
}


@pytest.mark.parametrize(
    ("figures", "said"),
    [
        (
            {"3": {"tok_s": 20.0, "kind": "measured", "source": "seed 004"}},
            "org/model: throughput.decode_tok_s: concurrency '3': the probe measures at 1, 2, 4"
            " requests at once; give figures for those only",
        ),
        (
            {"1": {"tok_s": 20.0, "kind": "measured", "source": "my own box"}},
            "org/model: throughput.decode_tok_s.1.source: 'my own box' names no source; say where"
            " the figure comes from: a seed (seed 004: ...) or a public address",
        ),
        (
            {"1": {"tok_s": 0, "kind": "measured", "source": "seed 004"}},
            "org/model: throughput.decode_tok_s.1.tok_s: Input should be greater than 0",
        ),
        (
            {"1": {"tok_s": 20.0, "kind": "guessed", "source": "seed 004"}},
            "org/model: throughput.decode_tok_s.1.kind: Input should be 'measured', 'reported'"
            " or 'expected'",
        ),
        (
            {"1": {"tok_s": 20.0, "kind": "measured", "source": "seed 004", "per_box": 1}},
            "org/model: throughput.decode_tok_s.1.per_box: Extra inputs are not permitted",
        ),
    ],
    ids=["concurrency", "source", "rate", "kind", "unknown-key"],
)
def test_a_catalog_figure_that_is_wrong_is_refused_naming_it(figures: dict, said: str) -> None:
    entry = SPEC | {"throughput": {"decode_tok_s": figures}}
    with pytest.raises(ValueError) as error:
        catalog({"org/model": entry})
    assert f"model-catalog.json: {said}" in str(error.value)


def test_a_figure_may_cite_a_public_address() -> None:
    source = "https://example.org/spark-numbers, 1 request"
    entry = SPEC | {"throughput": {"decode_tok_s": {"1": {"tok_s": 9, "kind": "reported",
                                                          "source": source}}}}  # fmt: skip
    assert catalog({"org/model": entry})["org/model"].throughput.decode_tok_s[1].tok_s == 9.0
