"""`trtkv calibrate`: ModelOpt calibration of KV scales (+ FP8 weights), exported as TensorRT-LLM
and HF checkpoints."""

from __future__ import annotations

import argparse
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import add_verb, load
from trtkv.core.options import Flag, Options

EXAMPLES = """\
  $ trtkv calibrate smollm2_fp8kv
  $ trtkv calibrate smollm2_int8kv --force
  $ trtkv calibrate smollm2_fp8kv calibration.num_samples=32 calibration.seed=7
  $ trtkv calibrate llama70b_fp8kv --dry-run
writes engines/<recipe>/checkpoint/: config.json + rank*.safetensors (TensorRT-LLM), hf/ (FP8 KV), tokenizer/,
kv_scales.json, calibration_report.md, manifest.json. A second run with the same recipe and data says "up to date".
"""  # noqa: E501


class CalibrateOptions(Options):
    """`trtkv calibrate RECIPE [options]`: each field one flag (trtkv.core.options)."""

    force: Annotated[
        bool, Field(description="recalibrate even when the checkpoint is up to date"), Flag()
    ] = False
    dry_run: Annotated[
        bool,
        Field(
            description="print what would run (ModelOpt config, samples, export targets) and write "
            "nothing"
        ),
        Flag(),
    ] = False


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "calibrate", EXAMPLES, CalibrateOptions, run)


def run(args: argparse.Namespace) -> int:
    from trtkv.calibrate import calibrate, describe_calibration

    o = CalibrateOptions.from_args(args)
    recipe = load(args)
    if o.dry_run:
        from trtkv.checkpoints.models import is_hub_id, source_problem
        from trtkv.core.errors import StageError

        problem = source_problem(recipe)
        # a local folder that is not there: calibrate would fail
        if problem and not is_hub_id(recipe.model.source):
            raise StageError(problem + ".")
        print(
            "\n".join(describe_calibration(recipe) + ([f"  note: {problem}."] if problem else []))
        )
        return 0
    result = calibrate(recipe, force=o.force)
    print(f"checkpoint: {result.output}")
    return 0
