"""The `trtkv plan` outputs docs/plan.md quotes, made by running the commands (in process) so the page cannot go
stale: scripts/update_docs.py fills them, tests/test_docs.py checks them.

Each example is what a user on a machine without the weights sees: the local HF cache is not consulted (the recipe's
model fields or the config.json named are what is planned), and the `Note:` lines, which name this checkout's paths,
are left out. The long tables a page does not discuss are cut at a line that says so.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the sections of `trtkv plan`'s table each example leaves out (their first line starts with the key)
CUT_DECODE = "Decode step lower bound"
CUT_PREFIX = "Prefix cache:"
CUT_ADVICE = "Advice"


@contextlib.contextmanager
def _no_hub_cache() -> Iterator[None]:
    from trtkv.checkpoints import models

    saved = models._hub_cache_snapshot
    models._hub_cache_snapshot = lambda _repo_id: None
    try:
        yield
    finally:
        models._hub_cache_snapshot = saved


def _trtkv(*argv: str) -> str:
    from trtkv.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _no_hub_cache():
        code = main(list(argv))
    if code != 0:
        raise RuntimeError(f"trtkv {' '.join(argv)} exited {code}: {err.getvalue()}")
    return out.getvalue()


def _cut(text: str, leave_out: tuple[str, ...]) -> str:
    """The output without `Note:` lines and without the blank-line-separated sections starting with `leave_out`."""
    kept = []
    for block in text.strip().split("\n\n"):
        if block.startswith(leave_out):
            if kept and kept[-1] != "...":
                kept.append("...")
            continue
        lines, note = [], False
        for line in block.splitlines():  # a note and the lines it wraps onto (indented)
            note = line.startswith("Note: ") or (note and line.startswith("  "))
            if not note:
                lines.append(line)
        if lines:
            kept.append("\n".join(lines))
    return "\n\n".join(kept).replace("\n\n...\n\n", "\n...\n")


def _block(commands: list[str], output: str) -> str:
    return "```\n" + "".join(f"$ {c}\n" for c in commands) + output.rstrip() + "\n```"


def llama70b() -> str:
    """The packaged recipe llama70b_fp8kv (4 x H100, the engine path): the one-screen answer, then `--full`."""
    return (_block(["trtkv plan llama70b_fp8kv"], _trtkv("plan", "llama70b_fp8kv")) + "\n\n"
            + _block(["trtkv plan llama70b_fp8kv --full"],
                     _cut(_trtkv("plan", "llama70b_fp8kv", "--full"), (CUT_DECODE, CUT_PREFIX, CUT_ADVICE))))


def _init_then_plan(name: str, config: str, options: tuple[str, ...], leave_out: tuple[str, ...]) -> str:
    with tempfile.TemporaryDirectory(prefix="trtkv-docs-") as tmp:
        recipe = Path(tmp) / f"{name}.yaml"
        before = Path.cwd()
        os.chdir(ROOT)  # the plan names the config.json as the user typed it: relative to the checkout
        try:
            _trtkv("init", name, "--model", config, "--output", str(recipe), *options)
            output = _trtkv("plan", str(recipe), "--full")
        finally:
            os.chdir(before)
    shown = " ".join(f'"{o}"' if " " in o else o for o in options)
    output = output.replace(f"{ROOT}/", "")  # the config.json as the user named it, relative to the checkout
    return _block([f"trtkv init {name} --model {config}{' ' + shown if shown else ''}", f"trtkv plan {name} --full"],
                  _cut(output, leave_out))


def gemma3_27b() -> str:
    """`trtkv init` from Gemma 3 27B's config.json (a sliding-window hybrid) on the default GPU."""
    return _init_then_plan("gemma3_27b_fp8kv", "tests/data/configs/gemma3_27b", (), (CUT_DECODE, CUT_PREFIX))


def qwen3_next() -> str:
    """`trtkv init` from Qwen3-Next-80B-A3B's config.json (linear attention + full layers) on one H200 with vLLM, FP8
    weights asked for."""
    return _init_then_plan("qwen3_next_fp8kv", "tests/data/configs/qwen3_next_80b_a3b",
                           ("--gpu", "NVIDIA H200", "--backend", "vllm", "--weights", "fp8"),
                           (CUT_DECODE, CUT_PREFIX))
