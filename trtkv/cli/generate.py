"""`trtkv generate`: greedy text from the recipe's built engine, no server (a smoke test of the engine itself)."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtkv.cli.common import add_recipe_args, load, subparser

EXAMPLES = """\
  $ trtkv generate smollm2_fp8kv --prompt "The capital of France is"
  $ trtkv generate smollm2_fp8kv --prompt "Once upon a time" --max-tokens 32
  $ trtkv generate smollm2_fp8kv --prompt "The capital of France is" --checkpoint /tmp/edited_checkpoint
  $ trtkv generate llama8b_fp8kv --prompt "Hello" --dry-run    # the TensorRT-LLM runner command (GPU machine)
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from trtkv.recipe import Backend

    p = subparser(sub, "generate", EXAMPLES)
    add_recipe_args(p)
    p.add_argument("--prompt", required=True, help="text to continue (sent without a chat template)")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help=f"backend {Backend.REFERENCE.value}: run this TensorRT-LLM checkpoint folder instead of the "
                        "recipe's")
    p.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.serving import generate

    recipe = load(args)
    if args.dry_run:
        print("\n".join(generate.describe(recipe, args.prompt, args.max_tokens, args.checkpoint)))
        return 0
    print(generate.generate(recipe, args.prompt, args.max_tokens, checkpoint=args.checkpoint))
    return 0
