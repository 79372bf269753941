"""Where TensorRT-LLM runs: one answer for build, its preflight and `trtkv generate`.

TensorRT-LLM 1.x pins its own torch, transformers and ModelOpt (`torch<=2.9`,
`transformers==4.57.1`, `nvidia-modelopt~=0.37`), which cannot share trtkv's venv (ModelOpt 0.47,
transformers 5). So trtkv never imports it; it runs TensorRT-LLM's tools in their own interpreter,
chosen in this order:

1. `TRTKV_TRTLLM_PYTHON=/path/to/python`: an interpreter with tensorrt_llm installed (a venv or
   conda env of its own); `trtllm-build` then runs as `python -m tensorrt_llm.commands.build` (the
   console script's module).
2. this interpreter, if it happens to import tensorrt_llm (inside the NVIDIA container with trtkv
   installed there);
3. `docker run` of the Triton TensorRT-LLM image of the version matrix (trtkv.platform.versions),
   with the project folder mounted at the same path, when docker is on PATH.

Nothing here is executed on a machine without TensorRT-LLM or docker: `where()` then says so and how
to fix it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trtkv.core import paths
from trtkv.core.errors import StageError

PYTHON_ENV = "TRTKV_TRTLLM_PYTHON"
# console script -> module run with `python -m` (TensorRT-LLM 1.x setup.py entry points)
TOOL_MODULES = {"trtllm-build": "tensorrt_llm.commands.build"}


@dataclass(frozen=True)
class TrtllmPlace:
    """How to start a TensorRT-LLM process: `prefix + [python | tool, ...]`."""

    kind: str  # "python-env" | "this-python" | "container" | "missing"
    python: str  # the interpreter inside that place
    prefix: tuple[str, ...] = ()  # e.g. docker run ... IMAGE
    image: str | None = None
    why: str = ""

    def python_command(self, args: list[str]) -> list[str]:
        return [*self.prefix, self.python, *args]

    def tool_command(self, tool: str, args: list[str]) -> list[str]:
        """A console script such as trtllm-build (as `python -m module` outside the container)."""
        if self.kind == "container":
            return [*self.prefix, tool, *args]
        return [*self.prefix, self.python, "-m", TOOL_MODULES[tool], *args]


def docker_prefix(image: str, gpus: str = "all", workdir: Path | None = None) -> tuple[str, ...]:
    """`docker run` of `image` as the calling user (the engines it writes stay the user's), with the
    project and the engines folder mounted at the same paths."""
    root = paths.project_root().resolve()
    cmd = [
        "docker",
        "run",
        "--rm",
        "--gpus",
        gpus,
        "--ipc=host",
        "--shm-size=2g",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        "stack=67108864",
        "--user",
        f"{os.getuid()}:{os.getgid()}",
        "-e",
        "HOME=/tmp",
        "-v",
        f"{root}:{root}",
    ]
    out = paths.engines_dir().resolve()
    if not out.is_relative_to(root):
        cmd += ["-v", f"{out}:{out}"]
    cmd += ["-w", str(workdir or root), image]
    return tuple(cmd)


def image_missing(place: TrtllmPlace) -> str | None:
    """For a container place: a problem when the image is not on this machine yet (a 14-16 GB pull
    would otherwise happen silently inside the preflight's timeout); None when it is there or no
    container is used."""
    if place.kind != "container" or place.image is None:
        return None
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", place.image],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode == 0:
        return None
    said = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return (
        f"image {place.image} is not on this machine ({said}). Next: `docker pull {place.image}` "
        "(14-16 GB), then rerun"
    )


def where(image: str) -> TrtllmPlace:
    """The first place from the module docstring that exists on this machine (kind "missing" when
    none)."""
    env = os.environ.get(PYTHON_ENV)
    if env:
        if not Path(env).is_file():
            raise StageError(
                f"{PYTHON_ENV}={env}: no such interpreter. Next: point it at the python of an "
                "environment with TensorRT-LLM (<= 1.2 for engines), or unset it to use the "
                f"container {image}."
            )
        return TrtllmPlace("python-env", env, why=f"{PYTHON_ENV}={env}")
    if importlib.util.find_spec("tensorrt_llm") is not None:
        return TrtllmPlace(
            "this-python", sys.executable, why=f"tensorrt_llm is importable by {sys.executable}"
        )
    if shutil.which("docker"):
        return TrtllmPlace(
            "container", "python3", docker_prefix(image), image, why=f"docker run {image}"
        )
    return TrtllmPlace(
        "missing",
        "python3",
        docker_prefix(image),
        image,
        why=f"no {PYTHON_ENV}, tensorrt_llm is not importable by {sys.executable} and docker is "
        "not on PATH",
    )


def install_hint(image: str) -> str:
    return (
        f"run on a GPU machine with docker (trtkv then uses the container {image}), or set "
        f"{PYTHON_ENV} to the python of an environment where TensorRT-LLM is installed (its own "
        "venv: its pins clash with trtkv's)"
    )
