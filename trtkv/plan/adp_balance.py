"""TensorRT-LLM's attention-DP balancing: the steps a new context request is held (issue #49).

With `enable_attention_dp` and `attention_dp_config.enable_balance` (off by default; trtkv's own
recipes never set it, the published InferenceMAX DEP runs do), TensorRT-LLM's PyTorch executor
filters each step's scheduled context requests through `_balance_adp_requests`
(tensorrt_llm/_torch/pyexecutor/py_executor.py, in the 1.x PyExecutor; the same logic later moved
into the scheduler module as `balance_adp_requests`). Every rank all-gathers its counts of
scheduled context and generation requests, and with all ranks decoding:

- if every rank has a context request (and a free slot): the waiting counter is reset and the
  context requests are held while the batching counter counts `batching_wait_iters` steps
  (default 10), then released;
- otherwise: every rank's context requests are held and the waiting counter counts up, releasing
  them when it reaches `timeout_iters` (default 50; `AttentionDpConfig` in llmapi/llm_args.py).

The waiting counter runs whenever some rank lacks a context request, including when none has one,
so its phase when a request arrives is set by the releases before it. The counters are global (the
all-gather gives every rank the same view), so the hold depends on when the other ranks' requests
arrive: this module runs the two counters as the source does, step by step, over a stream of
arrivals, and returns the median hold. Arrivals per rank are independent, one per step with the
probability of that rank's completion rate (attention DP routes a new request to the rank with the
fewest active ones, which under a closed-loop client is the rank whose request just finished: C/N
requests a rank, each living about OSL steps; `_fetch_new_requests` at NVIDIA/TensorRT-LLM@9521caf
fills each rank up to the expected number of active requests); the run is seeded, so the figure is
reproducible.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace

from trtkv.plan.speed import Serving


@dataclass(frozen=True)
class AdpBalance:
    """attention_dp_config's balancing fields, at TensorRT-LLM's defaults."""

    timeout_iters: int = 50
    batching_wait_iters: int = 10


def hold_steps(
    ranks: int,
    arrivals_per_step: float,
    balance: AdpBalance = AdpBalance(),
    steps: int = 100_000,
    seed: int = 0,
) -> list[int]:
    """The steps each context request is held, over `steps` steps of the two counters (module
    docstring) with every rank decoding; no hold without attention DP (one rank)."""
    if ranks <= 1:
        return [0]
    rng = random.Random(seed)
    p = min(1.0, max(0.0, arrivals_per_step))
    pending: list[list[int]] = [[] for _ in range(ranks)]
    waiting = batching = 0
    held: list[int] = []
    for step in range(steps):
        for queue in pending:
            if rng.random() < p:
                queue.append(step)
        release = False
        if all(pending):  # every rank has a context request
            waiting = 0
            if batching < balance.batching_wait_iters:
                batching += 1
            else:
                batching, release = 0, True
        else:
            waiting += 1
            if waiting >= balance.timeout_iters:
                waiting, release = 0, True
        if release:
            for queue in pending:
                held += [step - arrived for arrived in queue]
                queue.clear()
    return held or [balance.timeout_iters]


def with_balance_hold(
    s: Serving, ranks: int, rank_concurrency: int, osl: int, balance: AdpBalance = AdpBalance()
) -> Serving:
    """`s` with its TTFT raised by the median hold, in decode steps of its batch: a rank's
    requests finish (and are replaced) at rank_concurrency per request lifetime, TTFT plus
    osl - 1 steps."""
    step = s.decode_step.total_ms
    life_steps = max(1.0, s.ttft_ms / step + max(0, osl - 1)) if step else float(osl)
    hold = statistics.median(hold_steps(ranks, rank_concurrency / life_steps, balance))
    return replace(s, ttft_ms=s.ttft_ms + hold * step)
