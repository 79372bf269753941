"""TTFT when a closed-loop benchmark keeps its requests in lockstep (issue #49).

A client that holds C requests in flight with fixed-length prompts and fixed output lengths
(LLMPerf, which launches C requests and collects all C before the next C; vLLM's and SGLang's
benchmark at --max-concurrency with identical ISL/OSL and no length range) starts every request of a
wave at the same moment: they all finish decoding in the same step, and the next C arrive together.
The engine then fills each step's token budget (vLLM's max_num_batched_tokens, SGLang's
chunked_prefill_size, TensorRT-LLM's max_num_tokens) with the wave's prompts in arrival order,
chunking a prompt across steps where the budget ends (vLLM's scheduler gives waiting requests the
tokens the budget has left; SGLang's PrefillAdder the same), with no decodes beside them (the
previous wave has finished); TensorRT-LLM without chunked prefill (its default unless a prompt
exceeds max_num_tokens) packs only whole prompts, a prompt that does not fit waiting for the next
step. Request i's first token comes with the step that holds its last prompt
token, so the wave's TTFTs are those steps' cumulative times and the median request's TTFT is the
median of them.

That replaces the steady state's queueing term (speed.serve: an M/D/1 wait, or aiconfigurator's
factor for TensorRT-LLM and SGLang, and the decode step in flight: trtkv.plan.in_flight), which
prices requests arriving at independent times: a client that draws lengths from a range, or Poisson
arrivals; a wave arrives when the previous one has finished, with no step in flight. What stays
is each engine's cost beyond the kernel tables as the steady state has it: vLLM's per-request
dispatch (its dispatch_ms_per_layer, once), and for TensorRT-LLM and SGLang aiconfigurator's
factor where nothing queues (a lone request's single prefill step: speed.queue_factor(1) = 1.9; its
growth with the steps of the batch is the queue the wave's steps price here).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from enum import Enum

from trtkv.plan.speed import (
    Kernels,
    KVCost,
    ModelShape,
    Serving,
    kernels_for,
    queue_factor,
    serve,
    step_time,
)
from trtkv.recipe import Recipe
from trtkv.recipe.backend_rules import SPEED_ENGINE, SPEED_ENGINES


class Arrival(str, Enum):
    """How the benchmark's requests reach the engine."""

    STAGGERED = "staggered"  # independent start times: a length range, or Poisson arrivals
    WAVES = "waves"  # C fixed-length requests started together, the next C when all finish


ARRIVAL_TEXT = {
    Arrival.STAGGERED: (
        "requests start at independent times (a client that draws lengths from a range, or "
        "Poisson arrivals): a request waits for the decode step in flight and the one the engine "
        "has already scheduled (1.5 steps: trtkv.plan.in_flight), and its prefill for the one "
        "ahead (an M/D/1 queue; aiconfigurator's queuing factor for TensorRT-LLM and SGLang)"
    ),
    Arrival.WAVES: (
        "C fixed-length requests start together and the next C when all finish (LLMPerf; vLLM's "
        "or SGLang's benchmark at fixed concurrency with one ISL/OSL): every wave's C prefills "
        "queue in the engine's token budget per step, and the median request's TTFT is its "
        "wave's prefill steps"
    ),
}


def wave_steps(
    isl: int, concurrency: int, budget_tokens: int, chunked: bool = True
) -> list[list[tuple[int, int, int]]]:
    """The prefill steps of one wave: each a list of (request, tokens, prefix) pieces, the
    budget filled with the C prompts in arrival order, a prompt chunked where the budget ends (or,
    not `chunked`, moved whole to the next step)."""
    budget = max(1, budget_tokens)
    steps: list[list[tuple[int, int, int]]] = [[]]
    room = budget
    for request in range(max(1, concurrency)):
        done = 0
        while done < isl:
            if room == 0 or (not chunked and done == 0 and room < min(isl, budget)):
                steps.append([])
                room = budget
            n = min(isl - done, room)
            steps[-1].append((request, n, done))
            done += n
            room -= n
    return steps


def wave_ttft_ms(
    k: Kernels,
    m: ModelShape,
    kv: KVCost,
    isl: int,
    concurrency: int,
    budget_tokens: int,
    chunked: bool = True,
) -> float:
    """The median request's TTFT in a wave: the cumulative time of the steps up to the one holding
    its last prompt token, with the engine's cost beyond the kernel tables (module docstring)."""
    first_token: dict[int, float] = {}
    clock = 0.0
    for pieces in wave_steps(isl, concurrency, budget_tokens, chunked):
        clock += step_time(k, m, kv, [], pieces=tuple((n, p) for _, n, p in pieces)).total_ms
        for request, n, prefix in pieces:
            if n + prefix == isl:
                first_token[request] = clock
    engine = SPEED_ENGINES[k.backend]
    factor = queue_factor(1) if engine.queued else 1.0
    dispatch = m.num_layers * engine.dispatch_ms_per_layer
    return statistics.median(first_token.values()) * factor + dispatch


def serve_at(
    k: Kernels,
    m: ModelShape,
    kv: KVCost,
    isl: int,
    osl: int,
    concurrency: int,
    budget_tokens: int,
    arrival: Arrival = Arrival.STAGGERED,
    chunked: bool = True,
) -> Serving:
    """speed.serve's steady state, its TTFT the wave's where the requests arrive in waves (the
    decode figures are the same: C sequences decode together either way)."""
    s = serve(k, m, kv, isl, osl, concurrency, budget_tokens)
    if arrival is Arrival.STAGGERED:
        return s
    return replace(s, ttft_ms=wave_ttft_ms(k, m, kv, isl, concurrency, budget_tokens, chunked))


def arrival_note(recipe: Recipe, m: ModelShape, kv: KVCost) -> str:
    """The estimate's statement of the arrival it prices (staggered), and the recipe's format's
    median TTFT where the same concurrency arrives in waves instead (TensorRT-LLM packs whole
    prompts unless the recipe turns chunked prefill on: Recipe.chunked_context)."""
    engine = SPEED_ENGINE[recipe.build.backend]
    k, b, budget = (
        kernels_for(recipe.hardware.gpu, engine),
        recipe.bench,
        recipe.build.max_num_tokens,
    )
    chunked = not SPEED_ENGINES[engine].whole_prompts or recipe.chunked_context
    waves = [
        f"{c}: {wave_ttft_ms(k, m, kv, b.input_tokens, c, budget, chunked):,.1f} ms"
        for c in sorted(set(b.concurrency))
        if c > 1
    ]
    whole = "" if chunked else " (whole prompts: no chunked prefill)"
    other = (
        f" Where {ARRIVAL_TEXT[Arrival.WAVES]}, at {budget:,} tokens per step{whole}, TTFT p50 of "
        f"{kv.fmt.value} KV at concurrency {', '.join(waves)}."
        if waves
        else ""
    )
    return f"arrival: staggered, {ARRIVAL_TEXT[Arrival.STAGGERED]}.{other}"
