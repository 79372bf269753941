"""The version matrix (trtkv/data/trtllm_versions.json): image per TensorRT-LLM release, refusals, recipe field."""

from __future__ import annotations

import json

import pytest

from trtkv.core.errors import RecipeError, StageError
from trtkv.platform import versions
from trtkv.recipe import load_recipe


def test_the_matrix_names_its_source_and_covers_the_engine_path() -> None:
    data = json.loads(versions.DATA.read_text())
    assert "compatibility.md" in data["source"] and "0f963c9a" in data["source"]
    assert versions.supported_trtllm() == ["1.0.0", "1.0.3", "1.1.0", "1.2.0", "1.2.1"]
    parsed = [tuple(int(x) for x in versions.release(r.tensorrt_llm).split(".")[:2]) for r in versions.rows()]
    assert all((1, 0) <= v < (1, 3) for v in parsed)  # the engine path: TensorRT-LLM 1.0 to 1.2.x


@pytest.mark.parametrize("release, tag, tensorrt", [("1.2.1", "26.07", "10.14.1.48"), ("1.2.0", "26.03", "10.14.1.48"),
                                                   ("1.1.0", "26.02", "10.13.3.9"), ("1.0.0", "25.10", "10.11.0.33"),
                                                   ("1.0.3.2510", "25.11", "10.13.3.9")])
def test_newest_image_per_release(release: str, tag: str, tensorrt: str) -> None:
    row = versions.row_for_trtllm(release)
    assert (row.tag, row.tensorrt) == (tag, tensorrt)
    assert row.image == f"nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3"


def test_unknown_release_and_mismatched_image_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StageError, match=r"1.3.0.*supported: 1.0.0, 1.0.3, 1.1.0, 1.2.0, 1.2.1"):
        versions.row_for_trtllm("1.3.0")
    monkeypatch.setenv(versions.IMAGE_ENV, "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3")
    with pytest.raises(StageError, match="ships TensorRT-LLM 1.1.0"):
        versions.image_for("1.2.1")
    assert versions.image_for("1.1.0").endswith(":25.12-trtllm-python-py3")  # the user's image when it matches
    monkeypatch.setenv(versions.IMAGE_ENV, "nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3")
    with pytest.raises(StageError, match="25.08 is not in trtkv's version matrix"):
        versions.image_for("1.2.1")  # an NGC tag the matrix does not know (this one ships TensorRT-LLM 0.21)
    monkeypatch.setenv(versions.IMAGE_ENV, "own-triton-trtllm:1")
    assert versions.image_for("1.2.1") == "own-triton-trtllm:1"  # not in the matrix: the user's call
    built = {"tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48"}
    assert versions.check_engine_versions(built, versions.row_for_trtllm("1.2.1").image) == []
    assert len(versions.check_engine_versions(built, versions.row_for_trtllm("1.1.0").image)) == 2


def test_recipe_field_lists_the_allowed_releases() -> None:
    assert load_recipe("llama8b_fp8kv").build.tensorrt_llm_version == "1.2.1"
    with pytest.raises(RecipeError, match=r"build.tensorrt_llm_version.*'1.3.0'.*Allowed: 1.0.0, 1.0.3, 1.1.0"):
        load_recipe("llama8b_fp8kv", ["build.tensorrt_llm_version=1.3.0"])
