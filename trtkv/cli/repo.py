"""`trtkv repo`: write the Triton model repository triton_repo/<recipe>/ in the layout of the
recipe's backend."""

from __future__ import annotations

import argparse
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import add_verb, load
from trtkv.core.options import Flag, Options

EXAMPLES = """\
  $ trtkv repo smollm2_fp8kv                  # CPU: trtkv's runtime as the model, tokenizer copied in
  $ trtkv repo llama70b_fp8kv                 # GPU: Triton's tensorrtllm backend, TP4 (works without the engine)
  $ trtkv repo smollm2_fp8kv_llmapi           # the LLM API's one-model layout
  $ trtkv repo smollm2_fp8kv triton.instance_count=1 --force
  $ trtkv repo --check triton_repo/smollm2_fp8kv   # validate an existing repository
"""  # noqa: E501


def examples() -> str:
    """The examples, then which backend writes which layout (read from the backends)."""
    from trtkv.cli.registry import layout_lines

    return EXAMPLES + "\n" + "\n".join(layout_lines()) + "\n"


class RepoOptions(Options):
    """`trtkv repo RECIPE [options]`: each field one flag (trtkv.core.options)."""

    force: Annotated[
        bool, Field(description="regenerate even when the repository is up to date"), Flag()
    ] = False
    check: Annotated[
        bool,
        Field(
            description="only validate: RECIPE is then a repository folder (every "
            "<model>/config.pbtxt, and how the models fit together)"
        ),
        Flag(),
    ] = False


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "repo", examples(), RepoOptions, run)


def run(args: argparse.Namespace) -> int:
    o = RepoOptions.from_args(args)
    if o.check:
        from pathlib import Path

        from trtkv.repo import validate_repo

        models = validate_repo(Path(args.recipe))
        print(f"repo: {args.recipe}: {len(models)} models valid ({', '.join(sorted(models))})")
        return 0
    from trtkv.repo import generate_repo

    recipe = load(args)
    result = generate_repo(recipe, force=o.force)
    print(f"repo: {result.output}/README.md has the deploy commands")
    return 0
