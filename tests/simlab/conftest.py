"""Fixtures of the lab's own tests."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.simlab.serving import hf_standin

# A GGUF file's first bytes with nothing after them (ggml's gguf.cpp: the magic, version 3, no
# tensors, no metadata): what the hub and `hf` stand-ins' tests serve as the lab's model.
EMPTY_GGUF = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)


@pytest.fixture
def gguf_model(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[bytes]:
    """The stand-ins' GGUF files hold EMPTY_GGUF (given as the lab gives its model to the hub)."""
    path = Path(tmp_path_factory.mktemp("model")) / "model.gguf"
    path.write_bytes(EMPTY_GGUF)
    monkeypatch.setenv(hf_standin.GGUF_MODEL_VARIABLE, str(path))
    hf_standin.gguf_model.cache_clear()
    yield EMPTY_GGUF
    hf_standin.gguf_model.cache_clear()
