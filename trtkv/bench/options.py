"""What `trtkv bench` takes besides the recipe: each field is one flag of the verb (trtkv.cli.bench
derives them, trtkv.core.options), and library callers (tests, benchmarks/) build the same model
with keywords. Light: no client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from trtkv.contracts.interface import INTERFACES
from trtkv.core.options import Flag, Options
from trtkv.recipe.enums import BenchTask, Protocol

_OPENAI = Protocol.OPENAI.value
_MODELS = ", ".join(f"{i.model} for the {i.layout} layout" for i in INTERFACES.values())


class BenchOptions(Options):
    """`trtkv bench RECIPE [options]`; the workload itself is the recipe's bench section (overrides:
    bench.KEY=V)."""

    url: Annotated[
        str | None,
        Field(
            description="HOST:PORT of the server (its gRPC port, or its HTTP port with --protocol "
            f"http or {_OPENAI})"
        ),
        Flag(),
    ] = None
    protocol: Annotated[
        Protocol | None,
        Field(
            description="Triton's gRPC streaming (default: the recipe's bench.protocol), Triton's "
            "HTTP generate_stream (SSE), or the streaming /v1/completions of any OpenAI-compatible "
            "server (vLLM, trtllm-serve, Triton's OpenAI frontend; --url HOST:PORT of its HTTP "
            "port)"
        ),
        Flag(),
    ] = None
    endpoint_type: Annotated[
        Literal["completions", "chat"],
        Field(
            description=f"with --protocol {_OPENAI}: /v1/completions (default) or "
            "/v1/chat/completions"
        ),
        Flag(),
    ] = "completions"
    model: Annotated[
        str | None,
        Field(
            description="model name on the server (default: the one the server lists with "
            f"--protocol {_OPENAI}; else {_MODELS})"
        ),
        Flag(),
    ] = None  # None: as the description says
    slos: Annotated[
        list[str],
        Field(
            description="an SLO on top of the recipe's bench.thresholds, e.g. "
            "time_to_first_token.p99<=500, quiz.accuracy>=0.3, request_errors.failed<=0 "
            "(repeatable)"
        ),
        Flag(names=("--slo",), metavar="METRIC.STAT<=VALUE", repeat=True),
    ] = []
    goodput: Annotated[
        str | None,
        Field(
            description="AIPerf's goodput: requests within every threshold per second, e.g. "
            "'time_to_first_token:500 inter_token_latency:100' (ms); in results.json and the "
            "AIPerf exports (aiperf/<level>/)"
        ),
        Flag(metavar="'TAG:VALUE ...'"),
    ] = None
    allow_failures: Annotated[
        bool,
        Field(
            description="do not fail the bench because requests failed (by default any failed "
            "request is an SLO breach: request_errors.failed<=0, exit 1)"
        ),
        Flag(),
    ] = False
    tasks: Annotated[
        list[BenchTask] | None,
        Field(
            description=f"accuracy tasks, comma separated ({','.join(t.value for t in BenchTask)}) "
            "or `none` (default: the recipe's bench.tasks)"
        ),
        Flag(sep=",", empty="none"),
    ] = None
    sweep_input: Annotated[
        list[int] | None,
        Field(
            description="run the latency levels at each of these input lengths (tokens) and fit "
            "ITL and TTFT against context (default: the recipe's bench.sweep_input_tokens); `trtkv "
            "compare` then reports where one KV format's ITL drops below another's"
        ),
        Flag(sep=",", metavar="L1,L2,..."),
    ] = None
    latency: Annotated[
        bool,
        Field(description="skip the latency sweep (accuracy tasks only)"),
        Flag(names=("--no-latency",)),
    ] = True
    workers: Annotated[
        int | None,
        Field(
            ge=1,
            description="client processes for the latency sweep (default auto: one, unless a "
            "level's warm-up shows one process would use more than half a core, then the streams "
            "are sharded over processes)",
        ),
        Flag(metavar="N|auto", none="auto"),
    ] = None  # None: auto (trtkv.bench.load.levels)
    golden_prompts: Annotated[
        int,
        Field(ge=1, description="prompts in the golden-agreement task (default %(default)s)"),
        Flag(),
    ] = 8
    output: Annotated[
        Path | None, Field(description="results folder (default: engines/<recipe>/bench)"), Flag()
    ] = None
    progress: Annotated[
        bool, Field(description="no progress bar"), Flag(names=("--no-progress",))
    ] = True
