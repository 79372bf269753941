"""`trtkv scales`: audit a checkpoint's KV-cache scales, say what each engine will do with them."""

from __future__ import annotations

import argparse
import json
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import add_verb
from trtkv.core.options import Flag, Options

EXAMPLES = """\
  $ trtkv scales ~/models/Qwen3-30B-A3B-FP8   # a local HF or TensorRT-LLM checkpoint folder
  $ trtkv scales smollm2_fp8kv                # a recipe: engines/<recipe>/checkpoint/ (and hf/)
  $ trtkv scales engines/my_recipe/checkpoint --engine tensorrt_llm_engine --json
  $ trtkv scales smollm2_fp8kv --calibrate    # + what each engine's scales clip on shipped text
exit: 0 no failing finding; 1 a failing finding (docs/kv-scales.md); 2 the target cannot be read
"""


class ScalesOptions(Options):
    """`trtkv scales TARGET [options]`: each field one flag (trtkv.core.options)."""

    target: Annotated[
        str,
        Field(description="a checkpoint folder, or a recipe name / .yaml path"),
        Flag(names=("target",)),
    ]
    engine: Annotated[
        list[str],
        Field(
            description="engines to audit against, comma-separated (default: every engine of "
            "trtkv/data/kv_scale_loaders.json)"
        ),
        Flag(sep=",", metavar="E[,E]"),
    ] = []
    as_json: Annotated[
        bool, Field(description="print the audit as JSON"), Flag(names=("--json",))
    ] = False
    calibrate: Annotated[
        bool,
        Field(
            description="also run the model on the shipped calibration text and report the share "
            "of K and V values each engine's scales clip per layer (needs the unquantized model: "
            "a recipe's, or --model)"
        ),
        Flag(),
    ] = False
    model: Annotated[
        str | None,
        Field(description="--calibrate: the unquantized HF model folder (default: the recipe's)"),
        Flag(metavar="DIR"),
    ] = None
    clip_threshold: Annotated[
        float,
        Field(
            gt=0,
            lt=1,
            description="--calibrate: fail a layer whose clipped share of K or V "
            "values exceeds this (default 0.001: 0.1%%)",
        ),
        Flag(metavar="SHARE"),
    ] = 0.001


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "scales", EXAMPLES, ScalesOptions, run, recipe=None)


def run(args: argparse.Namespace) -> int:
    from trtkv.calibrate import audit_target
    from trtkv.engines.kv_scale_text import render_audit

    o = ScalesOptions.from_args(args)
    audits = audit_target(
        o.target,
        args.overrides,
        o.engine or None,
        calibrate=o.calibrate,
        model=o.model,
        threshold=o.clip_threshold,
    )
    if o.as_json:
        print(json.dumps([a.to_dict() for a in audits], indent=1, default=str))
    else:
        print("\n\n".join(render_audit(a) for a in audits))
    return max(a.exit_code for a in audits)
