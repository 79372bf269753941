"""One version matrix: NGC Triton TensorRT-LLM image tag -> Triton -> TensorRT-LLM -> TensorRT (data
file with its source: trtkv/data/trtllm_versions.json). An engine loads only where the TensorRT-LLM
and TensorRT that built it run it, so build records the versions it used and repo/serve pick the
image from them (or refuse a mismatch). Light: json only (recipe validation imports it).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError

DATA = Path(__file__).resolve().parents[1] / "data" / "trtllm_versions.json"
REGISTRY_PATH = "nvcr.io/nvidia/tritonserver"
IMAGE_SUFFIX = "-trtllm-python-py3"
# a user's own image; checked against the matrix when its tag is in it
IMAGE_ENV = "TRTKV_TRITON_IMAGE"
DEFAULT_TRTLLM = "1.2.1"  # the newest TensorRT-LLM with the engine path


@dataclass(frozen=True)
class Row:
    tag: str
    triton: str | None  # null in the data where no source confirmed it
    tensorrt_llm: str
    tensorrt: str
    cuda: str

    @property
    def image(self) -> str:
        return f"{REGISTRY_PATH}:{self.tag}{IMAGE_SUFFIX}"


@lru_cache(maxsize=1)
def matrix() -> dict[str, Any]:
    return json.loads(DATA.read_text())


def rows() -> list[Row]:
    return [Row(**row) for row in matrix()["rows"]]


def release(version: str) -> str:
    """'1.0.3.2510' -> '1.0.3'; '1.2.1' -> '1.2.1'; '1.2.0rc8' -> '1.2.0rc8' (NGC build suffixes
    dropped)."""
    match = re.match(r"^(\d+\.\d+\.\d+(?:rc\d+)?)", version.strip())
    return match.group(1) if match else version.strip()


def supported_trtllm() -> list[str]:
    """The TensorRT-LLM releases the matrix has an image for, oldest first."""
    out: list[str] = []
    for row in rows():
        if release(row.tensorrt_llm) not in out:
            out.append(release(row.tensorrt_llm))
    return out


def row_for_trtllm(version: str) -> Row:
    """The newest image that ships this TensorRT-LLM release; StageError naming the supported ones
    otherwise."""
    matching = [row for row in rows() if release(row.tensorrt_llm) == release(version)]
    if not matching:
        raise StageError(
            f"TensorRT-LLM {version}: no Triton image in trtkv's version matrix ships it "
            f"(supported: {', '.join(supported_trtllm())}; the engine path ends at 1.2.x). Next: "
            f"build with one of these (build.tensorrt_llm_version), or set {IMAGE_ENV} to an image "
            "you built yourself."
        )
    return matching[-1]


def row_for_tag(tag: str) -> Row | None:
    return next((row for row in rows() if row.tag == tag), None)


def image_tag(image: str) -> str | None:
    """'nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3' -> '26.07' (None for other images)."""
    match = re.search(r"tritonserver:(\d\d\.\d\d)" + re.escape(IMAGE_SUFFIX) + r"$", image)
    return match.group(1) if match else None


def image_for(trtllm_version: str) -> str:
    """The image to run an engine built by `trtllm_version` (or TRTKV_TRITON_IMAGE, checked when it
    is an NGC tag)."""
    wanted = row_for_trtllm(trtllm_version)
    override = os.environ.get(IMAGE_ENV)
    if not override:
        return wanted.image
    tag = image_tag(override)
    row = row_for_tag(tag) if tag else None
    if tag and row is None:
        raise StageError(
            f"{IMAGE_ENV}={override}: tag {tag} is not in trtkv's version matrix (tags "
            f"{', '.join(r.tag for r in rows())}), so trtkv cannot tell which TensorRT-LLM it "
            "ships; before 25.09 the images ship TensorRT-LLM 0.x, which cannot run trtkv's "
            f"engines. Next: unset it (trtkv then uses {wanted.image})."
        )
    if row is not None and release(row.tensorrt_llm) != release(trtllm_version):
        raise StageError(
            f"{IMAGE_ENV}={override} ships TensorRT-LLM {row.tensorrt_llm} (TensorRT "
            f"{row.tensorrt}), but the engine needs TensorRT-LLM {trtllm_version}: an engine loads "
            f"only under the TensorRT-LLM/TensorRT that built it. Next: unset {IMAGE_ENV} (trtkv "
            f"then uses {wanted.image}), or rebuild the engine in {override}."
        )
    return override


def check_engine_versions(built: dict[str, Any], image: str) -> list[str]:
    """Problems running an engine whose build manifest says `built` (tensorrt_llm/tensorrt) in
    `image`."""
    trtllm = built.get("tensorrt_llm")
    if not trtllm:
        return []
    tag = image_tag(image)
    row = row_for_tag(tag) if tag else None
    if row is None:
        return []
    out = []
    if release(row.tensorrt_llm) != release(trtllm):
        out.append(
            f"the engine was built by TensorRT-LLM {trtllm}, {image} ships {row.tensorrt_llm}"
        )
    if built.get("tensorrt") and release(built["tensorrt"]) != release(row.tensorrt):
        out.append(
            f"the engine was built by TensorRT {built['tensorrt']}, {image} ships {row.tensorrt}"
        )
    return out


def table_markdown() -> str:
    """The matrix as a Markdown table (docs/where-it-runs.md, the repository README)."""
    lines = ["| image tag | TensorRT-LLM | TensorRT | CUDA |", "|---|---|---|---|"]
    for row in rows():
        lines.append(
            f"| `{row.tag}{IMAGE_SUFFIX}` | {row.tensorrt_llm} | {row.tensorrt} | {row.cuda} |"
        )
    return "\n".join(lines)
