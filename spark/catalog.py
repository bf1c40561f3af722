"""Known checkpoints: what the memory estimate and the SM121 rules need of a model (its
config.json and the size of its weights), and the field's throughput figures for it, each with
its source (data/model-catalog.json)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spark import llamacpp
from spark.checks import matching, refused
from spark.vllm_release import DATA

# The concurrencies the throughput probe measures (templates/spark-lane-bench.j2), as seed 004
# reports its cluster: 1 (serial), 2 and 4 concurrent requests of 256 completion tokens.
CONCURRENCIES = (1, 2, 4)
# Where a figure comes from: a seed ("seed 004: ...") or a public address (https://..., or
# owner/repo#123).
FIGURE_SOURCE = re.compile(r"(?i).*(\bseed \d{3}\b|https?://\S+|\b[\w.-]+/[\w.-]+#\d+).*", re.S)


class Figure(BaseModel):
    """A decode rate the field gives for a model at one concurrency, and where it comes from."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    tok_s: float = Field(
        gt=0,
        le=5000,
        description="aggregate decode tokens per second of all the concurrent requests (0 < x"
        " <= 5000)",
    )
    kind: Literal["measured", "reported", "expected"] = Field(
        description="measured (a measurement whose source gives its setup), reported (a rate a"
        " source states from use, without its setup) or expected (a guide's expectation)"
    )
    source: Annotated[
        str,
        matching(
            FIGURE_SOURCE,
            "{!r} names no source; say where the figure comes from: a seed (seed 004: ...) or"
            " a public address (https://..., or owner/repo#123)",
        ),
    ] = Field(description="where the figure comes from, and its setup")


class Throughput(BaseModel):
    """The field's figures for a model, which the throughput probe compares a lane with."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    decode_tok_s: dict[int, Figure] = Field(
        min_length=1,
        description="by concurrency (1, 2 or 4 requests at once): {tok_s, kind, source}",
    )

    @field_validator("decode_tok_s", mode="before")
    @classmethod
    def _concurrencies(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # pydantic says what it wants
        figures, problems = {}, []
        for key, figure in value.items():
            concurrency = int(key) if isinstance(key, str) and key.isdigit() else key
            if concurrency not in CONCURRENCIES:
                problems.append(
                    f"concurrency {key!r}: the probe measures at"
                    f" {', '.join(map(str, CONCURRENCIES))} requests at once; give figures for"
                    " those only"
                )
            figures[concurrency] = figure
        return refused(figures, problems)

    def for_probe(self) -> str:
        """The figures as the probe's --figures takes them: JSON, by concurrency."""
        return json.dumps(
            {str(c): figure.model_dump() for c, figure in sorted(self.decode_tok_s.items())}
        )


class ModelSpec(BaseModel):
    """What the memory estimate and the rules need to know of a checkpoint (its config.json
    and the size of its weights), and the field's throughput figures for it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    weights_gib: float = Field(gt=0, le=1024, description="GiB the weights take once loaded")
    attention_layers: int = Field(
        ge=1,
        le=1024,
        description="layers whose KV cache grows with the context: every layer of a plain"
        " transformer, only the full-attention ones of a hybrid (Gated DeltaNet, sliding window)",
    )
    kv_heads: int = Field(ge=1, le=1024, description="num_key_value_heads of config.json")
    layers: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="num_hidden_layers of config.json (a GGUF's block_count): every block, which"
        " llama.cpp's --n-gpu-layers counts with the output layer (None: not checked)",
    )
    head_dim: int = Field(ge=1, le=4096, description="head_dim of config.json")
    quantization: Literal[
        "bf16", "fp8", "awq", "gptq", "mxfp4", "nvfp4", "nvfp4-modelopt", "gguf"
    ] = Field(
        description="the checkpoint's format: bf16, fp8, awq, gptq, mxfp4, nvfp4"
        " (compressed-tensors, from llm-compressor), nvfp4-modelopt (NVIDIA ModelOpt) or gguf"
        " (llama.cpp's file, any of its quantizations: weights_gib is the file's size)"
    )
    max_context: int | None = Field(
        None, ge=1, description="max_position_embeddings of config.json (None: not checked)"
    )
    throughput: Throughput | None = Field(
        None,
        description="the field's decode rates for the model, by concurrency, each with its kind"
        " and source: {decode_tok_s: {1: {tok_s, kind, source}, 2: ..., 4: ...}} (None: none"
        " known; the probe then only measures)",
    )

    def kv_bytes_per_token(self, kv_cache_dtype: str | None) -> float:
        """Keys and values of one token in every attention layer; "auto" keeps the model's
        bf16 activations (2 bytes), the fp8 kinds take 1, llama.cpp's cache types their own
        (llamacpp.KV_CACHE_BYTES: q8_0 34 bytes per 32 values)."""
        dtype = kv_cache_dtype or "auto"
        size = llamacpp.KV_CACHE_BYTES.get(dtype) or (1 if dtype.startswith("fp8") else 2)
        return 2 * self.attention_layers * self.kv_heads * self.head_dim * size


def catalog(models: dict[str, Any]) -> dict[str, ModelSpec]:
    """The catalog's entries validated, or ValueError naming each entry and field at fault."""
    specs, problems = {}, []
    for name, entry in models.items():
        try:
            specs[name] = ModelSpec.model_validate(
                {key: value for key, value in entry.items() if key != "source"}
            )
        except ValidationError as error:
            for item in error.errors():
                where = ".".join(str(part) for part in item["loc"])
                what = item["ctx"]["error"] if item["type"] == "value_error" else item["msg"]
                problems += [
                    f"model-catalog.json: {name}: {where}: {line}"
                    for line in str(what).splitlines()
                ]
    return refused(specs, problems)


# Known checkpoints: the field's figures and the models' config.json, each entry with its source.
CATALOG: dict[str, ModelSpec] = catalog(
    json.loads((DATA / "model-catalog.json").read_text())["models"]
)
