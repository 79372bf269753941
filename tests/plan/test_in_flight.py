"""The step in flight a staggered request waits behind (trtkv.plan.in_flight): the engines' default loops take new
requests between steps with the next step already scheduled, so the wait is the rest of the step in flight (half on
average) plus one step; nothing is in flight for a lone request, and requests started together (waves) find none.
Shown failing on main's code (d49efc5): its serve() TTFT did not move when the overlap was taken away."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support import speed_cases as sc
from trtkv.kvcache.formats import KVFormat
from trtkv.plan import in_flight
from trtkv.plan.estimate import kv_cost, model_shape
from trtkv.plan.model import resolve_architecture
from trtkv.plan.speed import kernels_for, serve
from trtkv.plan.waves import Arrival, serve_at
from trtkv.recipe.backend_rules import SPEED_ENGINE, SPEED_ENGINES


@pytest.fixture(scope="module", params=["vllm", "llmapi", "sglang"])
def setup(request: pytest.FixtureRequest) -> tuple:
    recipe = sc.recipe_for(sc.MODELS["llama3_1_8b"], "H100-80GB", request.param, "bf16", 1024, 256, [16], 8192)
    arch = resolve_architecture(recipe)
    k = kernels_for(recipe.hardware.gpu, SPEED_ENGINE[recipe.build.backend])
    return k, model_shape(arch, recipe), kv_cost(arch, recipe, KVFormat.BF16, ())


def no_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine's loop taken as not overlapping its scheduling with the step in flight."""
    monkeypatch.setattr(in_flight, "SPEED_ENGINES", {n: replace(e, overlap=False) for n, e in SPEED_ENGINES.items()})


def test_every_engine_overlaps_by_default_and_a_lone_request_waits_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(SPEED_ENGINES[name].overlap for name in SPEED_ENGINE.values())
    assert in_flight.in_flight_steps("vllm", 1) == 0.0
    assert in_flight.in_flight_steps("vllm", 2) == 1.5
    no_overlap(monkeypatch)
    assert in_flight.in_flight_steps("vllm", 8) == 0.5


def test_a_staggered_request_waits_one_decode_step_more_under_the_overlap(setup: tuple,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    k, m, kv = setup
    overlapped = serve(k, m, kv, 1024, 256, 16, 8192)
    alone = serve(k, m, kv, 1024, 256, 1, 8192)
    no_overlap(monkeypatch)
    plain = serve(k, m, kv, 1024, 256, 16, 8192)
    step = overlapped.decode_step.total_ms
    assert overlapped.ttft_ms - plain.ttft_ms == pytest.approx(step, rel=1e-9)
    # the rest of the step in flight is there without the overlap too: half a step over the prefill and its queue
    monkeypatch.setattr(in_flight, "in_flight_steps", lambda engine, c: 0.0)
    assert plain.ttft_ms - serve(k, m, kv, 1024, 256, 16, 8192).ttft_ms == pytest.approx(step / 2, rel=1e-9)
    monkeypatch.undo()
    assert serve(k, m, kv, 1024, 256, 1, 8192).ttft_ms == alone.ttft_ms
    # requests started together find no step in flight: the waves' TTFT is their prefill steps only
    waves = serve_at(k, m, kv, 1024, 256, 16, 8192, Arrival.WAVES).ttft_ms
    no_overlap(monkeypatch)
    assert serve_at(k, m, kv, 1024, 256, 16, 8192, Arrival.WAVES).ttft_ms == waves


def test_one_output_token_leaves_no_decode_step_in_flight(setup: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    # a first-token workload: the others are prefilling, not decoding (their wait is the prefill queue's)
    k, m, kv = setup
    first = serve(k, m, kv, 1024, 1, 16, 8192).ttft_ms
    monkeypatch.setattr(in_flight, "in_flight_steps", lambda engine, c: 0.0)
    assert serve(k, m, kv, 1024, 1, 16, 8192).ttft_ms == first
