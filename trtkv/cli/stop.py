"""`trtkv stop`: stop the recipe's supervisor (or forget a killed one's record), then the server
`trtkv serve` started: every process of its recorded session, whether or not its main process still
runs (trtkv.core.sessions)."""

from __future__ import annotations

import argparse
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import add_verb, load
from trtkv.core.options import Flag, Options

EXAMPLES = """\
  $ trtkv stop smollm2_fp8kv
  $ trtkv stop smollm2_fp8kv --timeout 60     # wait longer before SIGKILL
"""


class StopOptions(Options):
    """`trtkv stop RECIPE [options]`: each field one flag (trtkv.core.options)."""

    timeout: Annotated[
        float, Field(description="seconds to wait after SIGTERM (default 30)"), Flag()
    ] = 30.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "stop", EXAMPLES, StopOptions, run)


def run(args: argparse.Namespace) -> int:
    from trtkv.serving import supervisor_state, teardown

    o = StopOptions.from_args(args)
    recipe = load(args)
    # first, or it would restart the server it sees go away
    supervisor_state.stop(recipe, timeout_s=o.timeout)
    teardown.stop(recipe, timeout_s=o.timeout)
    return 0
