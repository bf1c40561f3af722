"""The image table and each release's lists (spark/vllm_release.py, spark/data/)."""

from __future__ import annotations

import json

import pytest

from spark.vllm_release import (
    DATA,
    DEFAULT_IMAGE,
    IMAGES,
    KINDS,
    image_has_ray,
    image_release,
    known_versions,
    nccl_deadlock_warning,
    newer,
    release,
)

SHARED_RELEASES = ["0.19.0", "0.20.1", "0.31.0", "0.33.0"]


def test_every_release_of_the_data_has_all_three_lists_and_parses() -> None:
    assert known_versions() == SHARED_RELEASES
    for version in SHARED_RELEASES:
        vllm = release(version)
        for kind in KINDS:
            assert (
                json.loads((DATA / f"vllm-{version}-{kind}.json").read_text())["vllm_version"]
                == version
            ), kind
        # What every lane renders is an option of every release; what the deploy sets, read.
        assert {"--max-model-len", "--gpu-memory-utilization", "--api-key", "--port"} <= set(
            vllm.options
        )
        assert vllm.reads("VLLM_HOST_IP") and vllm.reads("VLLM_API_KEY")
        assert set(vllm.values) <= set(vllm.options), "a typed option the parser lacks"
        # Every lane key that names a vLLM choice has one in every release.
        assert vllm.options["--kv-cache-dtype"]["choices"]
        assert vllm.options["--tool-call-parser"]["choices"]


def test_every_image_in_the_table_names_a_release_with_data_and_a_source() -> None:
    for image, row in IMAGES.items():
        assert row.vllm in known_versions(), image
        assert row.source.strip(), image
    assert image_release(DEFAULT_IMAGE, None).version == "0.19.0"


def test_nvfp4_can_be_kept_on_marlin_in_every_release() -> None:
    # Up to 0.20.1 by the variable, from 0.31.0 by --linear-backend (vllm-option-changes.md).
    for version in SHARED_RELEASES:
        vllm = release(version)
        by_variable = vllm.reads("VLLM_NVFP4_GEMM_BACKEND")
        by_option = "marlin" in vllm.options.get("--linear-backend", {}).get("choices", [])
        assert by_variable != by_option, version
    assert release("0.20.1").reads("VLLM_NVFP4_GEMM_BACKEND")
    assert not release("0.31.0").reads("VLLM_NVFP4_GEMM_BACKEND")


def test_ray_is_in_2604_only() -> None:
    assert image_has_ray("nvcr.io/nvidia/vllm:26.04-py3") is True
    assert image_has_ray("nvcr.io/nvidia/vllm:26.05-py3") is False
    assert image_has_ray("nvcr.io/nvidia/vllm:26.10-py3@sha256:" + 64 * "b") is False
    assert image_has_ray("registry.local/vllm:mine") is None


@pytest.mark.parametrize(
    ("image", "version", "expected"),
    [
        ("registry.local/team/vllm:mine", None, "image: the vLLM release of registry.local/"
                                                "team/vllm:mine is not known here"),
        ("registry.local/team/vllm:mine", "0.17.1", "vllm_version: '0.17.1' has no option"
                                                    " list here; one of: 0.19.0, 0.20.1,"),
        ("nvcr.io/nvidia/vllm:26.04-py3", "0.31.0", "vllm_version: '0.31.0', but"
                                                    " nvcr.io/nvidia/vllm:26.04-py3 carries"
                                                    " vLLM 0.19.0"),
    ],
)  # fmt: skip
def test_an_unknown_release_says_which_key_to_set(
    image: str, version: str | None, expected: str
) -> None:
    with pytest.raises(ValueError, match="^" + expected.replace("(", r"\(")):
        image_release(image, version)


def test_a_lane_may_name_the_release_the_table_has() -> None:
    assert image_release("nvcr.io/nvidia/vllm:26.10-py3", "0.31.0").version == "0.31.0"
    assert image_release("registry.local/team/vllm:mine", "0.33.0").version == "0.33.0"


def test_versions_compare_as_numbers() -> None:
    assert newer("0.31.0", "0.20.1") and newer("0.20.1", "0.19.0")
    assert not newer("0.19.0", "0.19.0") and not newer("0.9.0", "0.19.0")


def test_no_image_of_the_table_has_a_known_nccl_so_none_is_warned_of() -> None:
    # No CUDA DL release note of 26.04, 26.05 or 26.10 was found (only 26.03's: NCCL 2.29.7).
    assert {tag: (row.nccl, row.nccl_source) for tag, row in IMAGES.items()} == {
        tag: (None, "unknown: no CUDA DL release note of this month found")
        for tag in (
            "nvcr.io/nvidia/vllm:26.04-py3",
            "nvcr.io/nvidia/vllm:26.05-py3",
            "nvcr.io/nvidia/vllm:26.10-py3",
        )
    }
    assert [nccl_deadlock_warning(tag) for tag in IMAGES] == [None, None, None]
    assert nccl_deadlock_warning("registry.local/vllm:mine") is None  # not in the table
