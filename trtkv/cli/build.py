"""`trtkv build`: the engine of the recipe's backend from the calibrated checkpoint (trtkv.backends
does the work)."""

from __future__ import annotations

import argparse
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import add_verb, load
from trtkv.core.options import Flag, Options

EXAMPLES = """\
  $ trtkv build llama70b_fp8kv --dry-run          # every command, no GPU or TensorRT-LLM needed, writes nothing
  $ trtkv build llama8b_fp8kv_pytorch --dry-run   # extra_llm_api_options.yaml + trtllm-serve command
  $ trtkv build smollm2_fp8kv                     # on the CPU (after `trtkv calibrate smollm2_fp8kv`)
  $ trtkv build llama70b_int8kv build.max_batch_size=32 --force
  $ make engine RECIPE=smollm2_fp8kv              # calibrate + build
"""  # noqa: E501


class BuildOptions(Options):
    """`trtkv build RECIPE [options]`: each field one flag (trtkv.core.options)."""

    dry_run: Annotated[
        bool,
        Field(
            description="print every command the stage would run (calibration included) and write "
            "nothing"
        ),
        Flag(),
    ] = False
    force: Annotated[
        bool, Field(description="rebuild even when engines/<recipe>/engine is up to date"), Flag()
    ] = False


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "build", EXAMPLES, BuildOptions, run)


def run(args: argparse.Namespace) -> int:
    from trtkv.build import stage as build

    o = BuildOptions.from_args(args)
    recipe = load(args)
    if o.dry_run:
        # light at import time: ModelOpt and torch load lazily
        from trtkv.calibrate import describe_calibration

        print("\n".join(build.dry_run_lines(recipe, describe_calibration(recipe))))
        return 0
    result = build.build(recipe, force=o.force)
    print(f"build {recipe.name}: {'up to date' if result.skipped else 'done'}: {result.output}")
    return 0
