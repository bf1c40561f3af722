"""The lab's registry: what it serves under which names, and the image configs it serves."""

from __future__ import annotations

import json

from tests.simlab import registry, serving


def test_it_serves_the_deploys_table_and_the_llama_image_under_their_registries() -> None:
    assert registry.images() == [
        "nvcr.io/nvidia/vllm:26.04-py3",
        "nvcr.io/nvidia/vllm:26.05-py3",
        "nvcr.io/nvidia/vllm:26.10-py3",
        "ghcr.io/ardge-labs/llama-cpp-dgx-spark:server",
    ]
    assert registry.names() == ["ghcr.io", "nvcr.io"]
    assert registry.split("ghcr.io/ardge-labs/llama-cpp-dgx-spark:server") == (
        "ghcr.io", "ardge-labs/llama-cpp-dgx-spark", "server"
    )  # fmt: skip


def test_the_llama_images_config_carries_its_dockerfile_settings() -> None:
    # The image spec's config: Env, WorkingDir and Entrypoint under "config", the layers'
    # diff_ids under rootfs; docker's default PATH where the image sets none.
    config = json.loads(registry.image_config(serving.LLAMA_IMAGE_TAG, ["sha256:" + "a" * 64]))
    assert config["config"] == {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LLAMA_ARG_HOST=0.0.0.0"],
        "WorkingDir": "/app",
        "Entrypoint": ["/app/llama-server"],
    }  # fmt: skip
    assert config["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + "a" * 64]}
    assert config["os"] == "linux"
    vllm = json.loads(registry.image_config(serving.SERVING_IMAGE_TAG, []))["config"]
    assert vllm == {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}


def test_it_listens_on_the_labs_address_only_with_tls() -> None:
    config = registry.config("10.77.61.1")
    assert config["http"]["addr"] == "10.77.61.1:443"
    assert set(config["http"]["tls"]) == {"certificate", "key"}
    assert "auth" not in config  # the hosts pull anonymously
