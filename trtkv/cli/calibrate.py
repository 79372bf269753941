"""`trtkv calibrate`: ModelOpt calibration of KV scales (+ FP8 weights), exported as TensorRT-LLM and HF checkpoints."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_recipe_args, load, subparser

EXAMPLES = """\
  $ trtkv calibrate smollm2_fp8kv
  $ trtkv calibrate smollm2_int8kv --force
  $ trtkv calibrate smollm2_fp8kv calibration.num_samples=32 calibration.seed=7
  $ trtkv calibrate llama70b_fp8kv --dry-run
writes engines/<recipe>/checkpoint/: config.json + rank*.safetensors (TensorRT-LLM), hf/ (FP8 KV), tokenizer/,
kv_scales.json, calibration_report.md, manifest.json. A second run with the same recipe and data says "up to date".
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "calibrate", EXAMPLES)
    add_recipe_args(p)
    p.add_argument("--force", action="store_true", help="recalibrate even when the checkpoint is up to date")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would run (ModelOpt config, samples, export targets) and write nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.calibrate import calibrate, describe_calibration

    recipe = load(args)
    if args.dry_run:
        from trtkv.checkpoints.models import is_hub_id, source_problem
        from trtkv.core.errors import StageError

        problem = source_problem(recipe)
        if problem and not is_hub_id(recipe.model.source):  # a local folder that is not there: calibrate would fail
            raise StageError(problem + ".")
        print("\n".join(describe_calibration(recipe) + ([f"  note: {problem}."] if problem else [])))
        return 0
    result = calibrate(recipe, force=args.force)
    print(f"checkpoint: {result.output}")
    return 0
