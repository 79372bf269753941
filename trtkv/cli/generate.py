"""`trtkv generate`: greedy text from the recipe's built engine, no server (a smoke test of the
engine itself)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import add_verb, load
from trtkv.core.options import Flag, Options
from trtkv.recipe import Backend
from trtkv.serving.generate import DEFAULT_MAX_TOKENS

EXAMPLES = """\
  $ trtkv generate smollm2_fp8kv --prompt "The capital of France is"
  $ trtkv generate smollm2_fp8kv --prompt "Once upon a time" --max-tokens 32
  $ trtkv generate smollm2_fp8kv --prompt "The capital of France is" --checkpoint /tmp/edited_checkpoint
  $ trtkv generate llama8b_fp8kv --prompt "Hello" --dry-run    # the TensorRT-LLM runner command (GPU machine)
"""  # noqa: E501


class GenerateOptions(Options):
    """`trtkv generate RECIPE --prompt TEXT [options]`: each field one flag (trtkv.core.options)."""

    prompt: Annotated[
        str, Field(description="text to continue (sent without a chat template)"), Flag()
    ]
    max_tokens: Annotated[
        int, Field(description="tokens to generate (default %(default)s)"), Flag()
    ] = DEFAULT_MAX_TOKENS
    checkpoint: Annotated[
        Path | None,
        Field(
            description=f"backend {Backend.REFERENCE.value}: run this TensorRT-LLM checkpoint "
            "folder instead of the recipe's"
        ),
        Flag(),
    ] = None
    dry_run: Annotated[bool, Field(description="print what would run and exit"), Flag()] = False


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "generate", EXAMPLES, GenerateOptions, run)


def run(args: argparse.Namespace) -> int:
    from trtkv.serving import generate

    o = GenerateOptions.from_args(args)
    recipe = load(args)
    if o.dry_run:
        print("\n".join(generate.describe(recipe, o.prompt, o.max_tokens, o.checkpoint)))
        return 0
    print(generate.generate(recipe, o.prompt, o.max_tokens, checkpoint=o.checkpoint))
    return 0
