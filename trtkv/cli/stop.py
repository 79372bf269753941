"""`trtkv stop`: stop the recipe's supervisor (or forget a killed one's record), then the server `trtkv serve` started:
every process of its recorded session, whether or not its main process still runs (trtkv.core.sessions)."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_recipe_args, load, subparser

EXAMPLES = """\
  $ trtkv stop smollm2_fp8kv
  $ trtkv stop smollm2_fp8kv --timeout 60     # wait longer before SIGKILL
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "stop", EXAMPLES)
    add_recipe_args(p)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait after SIGTERM (default 30)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.serving import serve, supervise

    recipe = load(args)
    supervise.stop(recipe, timeout_s=args.timeout)  # first, or it would restart the server it sees go away
    serve.stop(recipe, timeout_s=args.timeout)
    return 0
