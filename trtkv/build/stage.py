"""The build stage: a TensorRT-LLM checkpoint in, `engines/<recipe>/engine/` out.

One stage contract (manifest, atomic output, up-to-date skip) for every backend; what the build does
is the backend's (trtkv.backends): `tensorrt` runs `trtllm-build` after a preflight, `llmapi` writes
the LLM API options and the `trtllm-serve` command, `reference` writes `runtime.json` for trtkv's
CPU runtime and checks that it decodes, `vllm` and `sglang` write their server's command lines for
the HF export.

The KV cache precision is never a `trtllm-build` flag: it is the checkpoint's
`quantization.kv_cache_quant_algo`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from trtkv.backends import BuildJob, for_recipe
from trtkv.contracts.stage import VERSIONED_TOOLS, StageResult, input_problem, run_stage
from trtkv.core.errors import StageError
from trtkv.recipe import Recipe
from trtkv.recipe.layout import checkpoint_dir, engine_dir

STAGE = "build"


def dry_run_lines(recipe: Recipe, calibrate_lines: Iterable[str]) -> list[str]:
    """Every command `make engine` would run for this recipe: calibrate's (`calibrate_lines`, the
    calibrate stage's own dry-run lines), then build's; nothing is touched."""
    ckpt, out = checkpoint_dir(recipe), engine_dir(recipe)
    backend = for_recipe(recipe)
    lines = [
        f"# dry run of `make engine RECIPE={recipe.name}` (trtkv calibrate + trtkv build): "
        "nothing is written",
        f"[calibrate] -> {ckpt}/",
        f"  $ trtkv calibrate {recipe.name}",
    ]
    lines += ["  " + line for line in calibrate_lines]
    lines += [
        f"[build] backend {recipe.build.backend.value} -> {out}/",
        f"  $ trtkv build {recipe.name}",
        "  " + backend.builder.kv_source_line(recipe),
    ]
    return lines + backend.builder.dry_run_lines(recipe, ckpt, out)


def build(
    recipe: Recipe, *, force: bool = False, log: Callable[[str], None] = print
) -> StageResult:
    """Run the build stage for the recipe's backend (skipped when up to date)."""
    backend = for_recipe(recipe)
    out = engine_dir(recipe)
    # another model's or KV format's checkpoint: refused
    made_for = input_problem(checkpoint_dir(recipe), recipe)
    if made_for is not None and "no valid" not in made_for:
        raise StageError(
            f"build {recipe.name}: {made_for}. Next: `trtkv calibrate {recipe.name}`"
            f"{' --force' if 'damaged' in made_for else ''}."
        )
    ckpt, info = backend.builder.prepare(recipe)
    log(
        f"build {recipe.name}: backend {recipe.build.backend.value}; "
        f"{backend.builder.kv_source_line(recipe)}"
    )

    def work(tmp: Any) -> dict[str, Any]:
        extra = backend.builder.build(BuildJob(recipe, ckpt, tmp, out, info, log))
        return {**extra, "preflight": {k: v for k, v in info.items() if k != "place"}}

    return run_stage(
        STAGE,
        recipe,
        out,
        work,
        sections=backend.builder.sections,
        input_dir=ckpt,
        force=force,
        log=log,
        versioned_tools=VERSIONED_TOOLS,
    )
