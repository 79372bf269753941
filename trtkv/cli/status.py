"""`trtkv status`: is the recipe's server serving (alive, ready, and answering a real one-token
inference)?"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import RECIPE_HELP, add_verb, load
from trtkv.core.errors import TrtkvError
from trtkv.core.options import Flag, Options

EXAMPLES = """\
  $ trtkv status smollm2_fp8kv              # healthy (exit 0), degraded or down (1), no server recorded (2);
                                            # "unsupervised": nothing restarts it (`trtkv serve R --attach`)
  $ trtkv status smollm2_fp8kv --json
  $ trtkv status smollm2_fp8kv --canaries 4 # more one-token inferences (e.g. one per model instance)
  $ trtkv status --url http://my-llm.trtkv:8000   # any deployed Triton or OpenAI-compatible endpoint:
                                            # health, its model list, one canary (--canaries 0: none)
"""  # noqa: E501


# each canary is a real engine step competing with the served traffic
MAX_CANARIES = 64


class StatusOptions(Options):
    """`trtkv status RECIPE [options]`: each field one flag (trtkv.core.options)."""

    canaries: Annotated[
        int | None,
        Field(
            ge=0,
            le=MAX_CANARIES,
            description="one-token inferences to send (default: the recipe's "
            f"triton.instance_count; 0: none, alive and ready only; at most {MAX_CANARIES})",
        ),
        Flag(),
    ] = None
    url: Annotated[
        str | None,
        Field(
            description="check this deployed endpoint instead of a recipe's local server: Triton "
            "or any OpenAI-compatible server over http (health, model list, one canary unless "
            "--canaries 0; every request bounded in time and bytes; $TRTKV_API_KEY sent when set)"
        ),
        Flag(metavar="URL"),
    ] = None
    timeout: Annotated[
        float,
        Field(gt=0, le=600, description="--url: seconds each request may take (default 30)"),
        Flag(metavar="S"),
    ] = 30.0
    as_json: Annotated[
        bool, Field(description="print the checks as JSON"), Flag(names=("--json",))
    ] = False


def add_parser(sub: argparse._SubParsersAction) -> None:
    recipe_help = RECIPE_HELP + " (not with --url)"
    add_verb(sub, "status", EXAMPLES, StatusOptions, run, recipe=recipe_help, optional=True)


def run(args: argparse.Namespace) -> int:
    from trtkv.contracts.artifacts import ServerRecord
    from trtkv.recipe.layout import serve_dir
    from trtkv.serving import health, supervisor_state

    o = StatusOptions.from_args(args)
    if o.url is not None or args.recipe is None:
        return _endpoint(args, o)
    recipe = load(args)
    sup = supervisor_state.alive(recipe)
    # the server is being replaced: say so, no probes
    if sup is not None and sup.state == "restarting":
        result = health.Health("restarting", ServerRecord.load(serve_dir(recipe)))
    else:
        # 0 means none (not the default): `is None`, never `or`
        count = recipe.triton.instance_count if o.canaries is None else o.canaries
        result = health.check(recipe, canaries=count)
    server = result.server
    pool_check = None
    if result.checks.get("ready"):  # planned against served: the pool the running engine reports
        from trtkv.plan import figures
        from trtkv.serving import pool

        pool_check = pool.compare(recipe, server, figures(recipe))
        result.checks["kv_pool"] = pool_check
    events = supervisor_state.read_events(recipe, last=5)
    # a supervisor that was killed: its server runs on, unsupervised
    lost = supervisor_state.orphaned(recipe)
    unsupervised = server is not None and sup is None and bool(result.checks.get("alive"))
    if o.as_json:
        print(
            json.dumps(
                {
                    "state": result.state,
                    "server": server.model_dump() if server else None,
                    "checks": result.checks,
                    "supervisor": sup.model_dump() if sup else None,
                    "supervised": sup is not None,
                    "unsupervised": unsupervised,
                    "lost_supervisor": lost.model_dump() if lost else None,
                    "events": events,
                },
                indent=2,
            )
        )
        return result.exit_code
    if server is None:
        print(f"{recipe.name}: no server recorded (start one: `trtkv serve {recipe.name}`)")
        return result.exit_code
    print(
        f"{recipe.name}: {result.state}{', unsupervised' if unsupervised else ''} (pid "
        f"{server.pid}, {server.http_url}, log {server.log})"
    )
    print(
        f"  process alive: {result.checks.get('alive')}; ready endpoint: "
        f"{result.checks.get('ready')}"
    )
    if result.checks.get("seen"):
        print(f"  recorded pid: {result.checks['seen']}")
    for i, probe in enumerate(result.checks.get("canaries", []), 1):
        print(
            f"  canary {i}: {'ok' if probe['ok'] else 'FAILED'} in {probe['seconds']:.2f} s "
            f"({probe['detail']})"
        )
    if pool_check is not None:
        from trtkv.serving.pool import describe

        print(f"  {describe(pool_check)}")
    attach = shlex.join(["trtkv", "serve", args.recipe, *args.overrides, "--attach"])
    if sup is None and lost is not None:
        print(
            f"  supervisor: unsupervised: its supervisor (pid {lost.pid}) is gone (killed?), "
            f"nothing restarts this server. Next: `{attach}` (or `trtkv stop {recipe.name}`)"
        )
    elif sup is None:
        print(
            f"  supervisor: none, unsupervised (nothing restarts this server; `{attach}` attaches "
            "one)"
        )
    else:
        print(
            f"  supervisor: pid {sup.pid}, {sup.state}, {sup.restarts} restart(s) in the last "
            f"{sup.window_s:g} s (at most {sup.max_restarts})"
        )
    for e in events:
        detail = ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "event"))
        print(f"  {e['time']} {e['event']}{': ' + detail if detail else ''}")
    return result.exit_code


def _endpoint(args: argparse.Namespace, o: StatusOptions) -> int:
    """`--url`: the deployed endpoint's health, models and canaries (trtkv.serving.endpoint)."""
    if o.url is None or args.recipe is not None:
        raise TrtkvError(
            "trtkv status: name a recipe (its local server) or --url URL (a deployed endpoint), "
            "one of them. Next: e.g. `trtkv status smollm2_fp8kv` or `trtkv status --url "
            "http://127.0.0.1:8000`."
        )
    from trtkv.serving import endpoint

    result = endpoint.check_endpoint(o.url, 1 if o.canaries is None else o.canaries, o.timeout)
    if o.as_json:
        print(
            json.dumps(
                {
                    "url": result.url,
                    "kind": result.kind,
                    "state": result.state,
                    "checks": result.checks,
                },
                indent=2,
            )
        )
    else:
        print("\n".join(endpoint.describe(result)))
    return result.exit_code
