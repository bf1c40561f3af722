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


def test_a_filler_layer_is_a_tar_of_random_bytes_gzipped(tmp_path) -> None:
    import gzip
    import hashlib
    import io
    import tarfile
    from pathlib import Path

    layer = registry.filler_layer(1 << 20, tmp_path)
    blob = Path(layer["file"]).read_bytes()
    tar = gzip.decompress(blob)
    # The OCI image spec: the digest names the gzipped blob, the diff_id the tar it unpacks to.
    assert layer["digest"] == "sha256:" + hashlib.sha256(blob).hexdigest()
    assert layer["diff_id"] == "sha256:" + hashlib.sha256(tar).hexdigest()
    assert layer["size"] == len(blob) > 1 << 20  # random bytes do not shrink
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        assert [(m.name, m.size) for m in archive.getmembers()] == [("opt/simlab-filler", 1 << 20)]


def test_the_registry_is_slowed_on_its_own_port_and_put_back() -> None:
    # tc-htb(8): the root's default 0 sends what no filter classifies out unshaped; the
    # registry's source port into class 1:4 at the rate.
    slowed = registry.throttle_commands("sl81", 32)
    assert slowed[0] == ["tc", "qdisc", "replace", "dev", "sl81", "root", "handle", "1:", "htb"]
    assert slowed[1][5:] == ["parent", "1:", "classid", "1:4", "htb", "rate", "32mbit", "ceil",
                             "32mbit"]  # fmt: skip
    assert slowed[2][-6:] == ["ip", "sport", "443", "0xffff", "flowid", "1:4"]
    assert registry.throttle_commands("sl81", None) == [
        ["tc", "qdisc", "del", "dev", "sl81", "root"]
    ]
