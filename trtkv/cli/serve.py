"""`trtkv serve`: start the server of the recipe's backend (tritonserver, vLLM or trtllm-serve; on
the CPU or in the GPU container), wait until it is ready, and start its supervisor (or only a
supervisor, --attach)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Annotated

from pydantic import Field

from trtkv.backends import TRTLLM_SERVE_OPTIONS_FLAG
from trtkv.cli.common import add_verb, load
from trtkv.core.errors import StageError
from trtkv.core.options import Flag, Options
from trtkv.recipe import Backend

EXAMPLES = """\
  $ trtkv serve smollm2_fp8kv                         # CPU: bundled tritonserver, returns once ready
  $ trtkv serve smollm2_fp8kv triton.http_port=9000 triton.grpc_port=9001 triton.metrics_port=9002
  $ trtkv serve smollm2_fp8kv --attach                # a new supervisor for the running server (its own was killed)
  $ trtkv serve llama70b_fp8kv --dry-run              # print the docker / mpirun commands
  $ trtkv serve smollm2_fp8kv_vllm --dry-run          # vLLM's OpenAI server on the HF export
  $ trtkv serve llama70b_fp8kv_llmapi --trtllm-serve --dry-run   # TensorRT-LLM's OpenAI-compatible server
  $ trtkv stop smollm2_fp8kv
"""  # noqa: E501


class ServeOptions(Options):
    """`trtkv serve RECIPE [options]`: each field one flag (trtkv.core.options)."""

    dry_run: Annotated[bool, Field(description="print the server command(s) and exit"), Flag()] = (
        False
    )
    trtllm_serve: Annotated[
        bool,
        Field(
            description="serve with trtllm-serve (OpenAI-compatible, /v1/completions) instead of "
            f"Triton: build.backend {Backend.LLMAPI.value} on GPUs, in the container; passes the "
            f"build's llm_api_options.yaml as {TRTLLM_SERVE_OPTIONS_FLAG} (no supervisor)"
        ),
        Flag(),
    ] = False
    timeout: Annotated[
        float | None,
        Field(
            description="seconds to wait for readiness (default: recipe triton.startup_timeout_s)"
        ),
        Flag(),
    ] = None
    no_supervise: Annotated[
        bool,
        Field(
            description="no supervisor: nothing probes the server or restarts it when an instance "
            "dies"
        ),
        Flag(),
    ] = False
    attach: Annotated[
        bool,
        Field(
            description="start only a supervisor, for the recipe's running server (when its own "
            "supervisor was killed)"
        ),
        Flag(),
    ] = False


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "serve", EXAMPLES, ServeOptions, run)


def attach_or_refuse(recipe, args: argparse.Namespace, o: ServeOptions) -> bool:  # noqa: ANN001 - Recipe
    """The recipe's server runs without a supervisor: attach one when asked (--attach, or yes at the
    prompt), else refuse with the command. False when the server is not running unsupervised (start
    as usual)."""
    from trtkv.serving import serve, supervise, supervisor_state, teardown

    info = serve.read_server(recipe)
    if (
        info is None
        or not teardown.running(info)
        or supervisor_state.alive(recipe) is not None
        or o.no_supervise
    ):
        return False
    command = shlex.join(["trtkv", "serve", args.recipe, *args.overrides, "--attach"])
    if not o.attach:
        if not sys.stdin.isatty():
            raise StageError(
                f"the server for {recipe.name} is running (pid {info.pid}, {info.http_url}) with "
                f"no supervisor: nothing restarts it when it fails. Next: `{command}` attaches "
                f"one, or `trtkv stop {recipe.name}` stops it."
            )
        answer = input(
            f"serve: {recipe.name} is running (pid {info.pid}) unsupervised. Attach a supervisor? "
            "[y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            print(f"serve: not attached; later: `{command}`")
            return True
    print(f"serve: attaching a supervisor to the running {recipe.name} server (pid {info.pid})")
    supervise.spawn(recipe, [args.recipe, *args.overrides])
    return True


def run(args: argparse.Namespace) -> int:
    from trtkv.serving import serve, supervise, supervisor_state, teardown

    o = ServeOptions.from_args(args)
    recipe = load(args)
    if not o.dry_run and attach_or_refuse(recipe, args, o):
        return 0
    if o.attach:
        sup = supervisor_state.alive(recipe)
        raise StageError(
            f"--attach adds a supervisor to a running, unsupervised server; {recipe.name} has "
            + (f"one already (supervisor pid {sup.pid})" if sup else "no running server")
            + f". Next: `trtkv status {recipe.name}`, or `trtkv serve {recipe.name}` to start it."
        )
    info = serve.start(recipe, dry_run=o.dry_run, timeout_s=o.timeout, trtllm_serve=o.trtllm_serve)
    if info is not None and not o.no_supervise and not o.trtllm_serve:
        try:
            supervise.spawn(recipe, [args.recipe, *args.overrides])
        except BaseException:
            teardown.stop(recipe)  # no half-started state: the server goes with its supervisor
            raise
    return 0
