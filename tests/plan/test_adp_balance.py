"""TensorRT-LLM's attention-DP balancing hold (trtkv.plan.adp_balance), against what its counters do in
`_balance_adp_requests`: no hold without attention DP; a request released at the latest when the waiting counter
reaches timeout_iters; batching_wait_iters steps once every rank has one; the median reproducible. Shown failing on
main's code (d49efc5): no such module, and test_published_speed's DEP2/DEP4 TTFT at -81% / -87% there."""

from __future__ import annotations

import statistics

import pytest

from trtkv.plan.adp_balance import AdpBalance, hold_steps


def test_no_attention_dp_no_hold() -> None:
    assert hold_steps(1, 0.5) == [0]


def test_a_lone_ranks_request_waits_for_the_timeout_at_most() -> None:
    # requests on the four ranks, rarely: the timeout releases them within timeout_iters steps of arriving, unless every
    # rank has one first (the waiting counter resets and the batching wait starts: at most batching_wait_iters more)
    held = hold_steps(4, 0.005, AdpBalance(timeout_iters=50, batching_wait_iters=10))
    assert len(held) > 1_000 and max(held) <= 50 + 10 and sum(h > 50 for h in held) < len(held) / 50
    # the waiting counter runs with no request anywhere, so an arrival finds it at any phase: half a timeout on average
    assert 22 <= statistics.mean(held) <= 27


def test_every_rank_busy_means_the_batching_wait() -> None:
    # a context request on every rank every step: the first of a batch waits batching_wait_iters steps, and those that
    # arrive meanwhile go with it (the release takes every scheduled context request)
    held = hold_steps(2, 1.0, AdpBalance(timeout_iters=50, batching_wait_iters=10), steps=2_000)
    assert max(held) == 10 and min(held) == 0 and statistics.median(held) == 5


@pytest.mark.parametrize("ranks, rate", [(2, 32 / 928), (4, 16 / 928)])
def test_the_median_hold_does_not_hang_on_the_seed(ranks: int, rate: float) -> None:
    medians = {statistics.median(hold_steps(ranks, rate, seed=seed)) for seed in range(3)}
    assert max(medians) - min(medians) <= 1, medians
