"""`trtkv repo`: write the Triton model repository triton_repo/<recipe>/ in the layout of the recipe's backend."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_recipe_args, load, subparser

EXAMPLES = """\
  $ trtkv repo smollm2_fp8kv                  # CPU: trtkv's runtime as the model, tokenizer copied in
  $ trtkv repo llama70b_fp8kv                 # GPU: Triton's tensorrtllm backend, TP4 (works without the engine)
  $ trtkv repo smollm2_fp8kv_llmapi           # the LLM API's one-model layout
  $ trtkv repo smollm2_fp8kv triton.instance_count=1 --force
  $ trtkv repo --check triton_repo/smollm2_fp8kv   # validate an existing repository
"""


def examples() -> str:
    """The examples, then which backend writes which layout (read from the backends)."""
    from trtkv.cli.registry import layout_lines

    return EXAMPLES + "\n" + "\n".join(layout_lines()) + "\n"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "repo", examples())
    add_recipe_args(p)
    p.add_argument("--force", action="store_true", help="regenerate even when the repository is up to date")
    p.add_argument("--check", action="store_true",
                   help="only validate: RECIPE is then a repository folder (every <model>/config.pbtxt, and how the "
                        "models fit together)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.check:
        from pathlib import Path

        from trtkv.repo import validate_repo

        models = validate_repo(Path(args.recipe))
        print(f"repo: {args.recipe}: {len(models)} models valid ({', '.join(sorted(models))})")
        return 0
    from trtkv.repo import generate_repo

    recipe = load(args)
    result = generate_repo(recipe, force=args.force)
    print(f"repo: {result.output}/README.md has the deploy commands")
    return 0
