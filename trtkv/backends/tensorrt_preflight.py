"""The tensorrt backend's preflight: everything `trtllm-build` needs, checked before it starts
(TensorRT-LLM importable where trtkv.platform.trtllm finds it, its version within the engine path's
range and the recipe's release, enough visible GPUs, a complete checkpoint), reported as one
StageError listing every problem.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

from trtkv.backends.base import check_checkpoint
from trtkv.core.errors import StageError
from trtkv.platform import trtllm, versions
from trtkv.recipe import Recipe

TRTLLM_MIN, TRTLLM_MAX = (1, 0), (1, 3)  # trtllm-build engines: TensorRT-LLM >= 1.0 and < 1.3


def _parse_version(text: str) -> tuple[int, int] | None:
    match = re.match(r"^(\d+)\.(\d+)", text.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def tensorrt_llm_version(place: trtllm.TrtllmPlace, timeout_s: float = 900.0) -> dict[str, str]:
    """{"tensorrt_llm", "tensorrt"} versions where TensorRT-LLM runs (a subprocess: importing it is
    heavy)."""
    code = (
        "import sys, tensorrt_llm, tensorrt; sys.stdout.write('\\nTRTKV_VERSION=' + "
        "tensorrt_llm.__version__ + ' ' + tensorrt.__version__ + '\\n')"
    )
    cmd = place.python_command(["-c", code])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise StageError(
            f"`import tensorrt_llm` did not finish in {timeout_s:.0f} s ({place.why})."
        ) from exc
    except OSError as exc:
        raise StageError(f"could not start {cmd[0]} ({exc}); {place.why}.") from exc
    found = re.findall(r"TRTKV_VERSION=(\S+) (\S+)", proc.stdout)
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise StageError(f"tensorrt_llm is not importable ({place.why}: {last}).")
    return {"tensorrt_llm": found[-1][0], "tensorrt": found[-1][1]}


def visible_gpus() -> tuple[int, str]:
    """GPUs this process can see and how that was found: `nvidia-smi -L`, else
    torch.cuda.device_count()."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            proc = None
        if proc is not None and proc.returncode == 0:
            return sum(
                1 for line in proc.stdout.splitlines() if line.startswith("GPU ")
            ), "nvidia-smi -L"
    import torch

    return int(
        torch.cuda.device_count()
    ), f"{'nvidia-smi failed' if smi else 'no nvidia-smi'}; torch.cuda.device_count()"


def preflight_tensorrt(recipe: Recipe) -> dict[str, Any]:
    """Everything trtllm-build needs, checked before it starts; one StageError listing every
    problem."""
    problems: list[str] = []
    image = versions.image_for(recipe.build.tensorrt_llm_version)
    place = trtllm.where(image)
    found: dict[str, str] = {}
    if place.kind == "missing":
        problems.append(
            f"TensorRT-LLM is not available here: {place.why}. Next: {trtllm.install_hint(image)}; "
            "or use build.backend=reference on a machine without GPUs"
        )
    elif missing := trtllm.image_missing(place):
        problems.append(missing)
    else:
        try:
            found = tensorrt_llm_version(place)
        except StageError as exc:
            problems.append(f"{exc} Next: {trtllm.install_hint(image)}")
    if found:
        parsed = _parse_version(found["tensorrt_llm"])
        wanted = recipe.build.tensorrt_llm_version
        if parsed is None or not TRTLLM_MIN <= parsed < TRTLLM_MAX:
            problems.append(
                f"tensorrt_llm {found['tensorrt_llm']} ({place.why}); trtllm-build engines need >= "
                f"{'.'.join(map(str, TRTLLM_MIN))} and < {'.'.join(map(str, TRTLLM_MAX))} (1.3 "
                f"removed the TensorRT engine path). Next: use {image}, or build.backend=pytorch"
            )
        elif versions.release(found["tensorrt_llm"]) != versions.release(wanted):
            problems.append(
                f"tensorrt_llm {found['tensorrt_llm']} ({place.why}), but the recipe's "
                f"build.tensorrt_llm_version is {wanted} (image {image}): the engine would not "
                "load in the image trtkv serves it with. Next: set build.tensorrt_llm_version="
                f"{versions.release(found['tensorrt_llm'])} if the matrix has it, or build in "
                f"{image}"
            )
    gpus, how = visible_gpus()
    if gpus < recipe.world_size:
        problems.append(
            f"{gpus} GPU(s) visible ({how}), the recipe needs build.tp_size x pp_size = "
            f"{recipe.world_size}. Next: run on a machine with {recipe.world_size} GPU(s) or set "
            f"CUDA_VISIBLE_DEVICES"
        )
    ckpt, _cfg, ckpt_problems = check_checkpoint(recipe)
    problems += ckpt_problems
    if problems:
        raise StageError(f"build {recipe.name}: preflight found {StageError.listing(problems)}")
    return {
        "versions": {
            **found,
            "image": image if place.kind == "container" else None,
            "where": place.why,
        },
        "visible_gpus": gpus,
        "checkpoint": str(ckpt),
        "place": place,
    }
