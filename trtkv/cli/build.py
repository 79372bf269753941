"""`trtkv build`: the engine of the recipe's backend from the calibrated checkpoint (trtkv.backends does the work)."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_recipe_args, load, subparser

EXAMPLES = """\
  $ trtkv build llama70b_fp8kv --dry-run          # every command, no GPU or TensorRT-LLM needed, writes nothing
  $ trtkv build llama8b_fp8kv_pytorch --dry-run   # extra_llm_api_options.yaml + trtllm-serve command
  $ trtkv build smollm2_fp8kv                     # on the CPU (after `trtkv calibrate smollm2_fp8kv`)
  $ trtkv build llama70b_int8kv build.max_batch_size=32 --force
  $ make engine RECIPE=smollm2_fp8kv              # calibrate + build
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "build", EXAMPLES)
    add_recipe_args(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print every command the stage would run (calibration included) and write nothing")
    p.add_argument("--force", action="store_true", help="rebuild even when engines/<recipe>/engine is up to date")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.build import stage as build

    recipe = load(args)
    if args.dry_run:
        print("\n".join(build.dry_run_lines(recipe)))
        return 0
    result = build.build(recipe, force=args.force)
    print(f"build {recipe.name}: {'up to date' if result.skipped else 'done'}: {result.output}")
    return 0
