"""TTFT of requests that arrive in waves (trtkv.plan.waves): the wave's prompts packed into the engine's token budget
per step in arrival order, the median request's first token at the step that holds its last prompt token."""

from __future__ import annotations

from tests.support.speed_cases import recipe_for
from trtkv.kvcache.formats import KVFormat
from trtkv.plan import speed
from trtkv.plan.estimate import estimate, kv_cost, model_shape
from trtkv.plan.model import resolve_architecture
from trtkv.plan.planner import plan
from trtkv.plan.waves import Arrival, serve_at, wave_steps, wave_ttft_ms
from trtkv.recipe.backend_rules import SPEED_ENGINE, SPEED_ENGINES


def _parts(backend: str, isl: int, budget: int):
    recipe = recipe_for("tests/data/configs/llama3_1_8b", "H100-80GB", backend, "bf16", isl, 64, [1, 8], budget)
    arch = resolve_architecture(recipe)
    k = speed.kernels_for(recipe.hardware.gpu, SPEED_ENGINE[recipe.build.backend])
    return k, model_shape(arch, recipe), kv_cost(arch, recipe, KVFormat.BF16, ())


def test_the_budget_is_filled_in_arrival_order_chunking_or_whole() -> None:
    # vLLM's scheduler hands the budget's remainder to the next waiting prompt: 10 x 2,042 over 8,192 tokens a step
    steps = wave_steps(2042, 10, 8192)
    assert [sum(n for _, n, _ in s) for s in steps] == [8192, 8192, 4036]
    assert steps[1][0] == (4, 2018, 24)  # request 4's prompt goes on where step 0 cut it
    # TensorRT-LLM without chunked prefill: whole prompts, 5 of 1,600 tokens fit 8,192, the other 3 wait a step
    whole = wave_steps(1600, 8, 8192, chunked=False)
    assert [[r for r, _, _ in s] for s in whole] == [[0, 1, 2, 3, 4], [5, 6, 7]]
    # a prompt longer than the budget is chunked even so
    assert [sum(n for _, n, _ in s) for s in wave_steps(10000, 1, 4096, chunked=False)] == [4096, 4096, 1808]


def test_one_request_is_the_same_either_way_and_a_wave_queues() -> None:
    for backend in ("vllm", "llmapi", "sglang"):
        k, m, kv = _parts(backend, 2048, 8192)
        alone = speed.serve(k, m, kv, 2048, 64, 1, 8192).ttft_ms
        assert abs(wave_ttft_ms(k, m, kv, 2048, 1, 8192) - alone) < 1e-6 * alone, backend
        # 8 x 2,048 tokens fill two 8,192-token steps of 4 prompts each: of the 8 first tokens 4 come after one step
        # and 4 after two, so the median (the mean of the 4th and 5th) is 1.5 steps, well above a lone request
        step = speed.step_time(k, m, kv, [], pieces=((2048, 0),) * 4).total_ms
        wave = serve_at(k, m, kv, 2048, 64, 8, 8192, Arrival.WAVES)
        engine = SPEED_ENGINES[k.backend]
        factor = speed.queue_factor(1) if engine.queued else 1.0
        dispatch = m.num_layers * engine.dispatch_ms_per_layer
        assert abs(wave.ttft_ms - (1.5 * step * factor + dispatch)) < 1e-6 * wave.ttft_ms, backend
        assert wave.ttft_ms > 2.5 * alone
        # the decode figures are the steady state's: C sequences decode together either way
        assert wave.itl_ms == serve_at(k, m, kv, 2048, 64, 8, 8192).itl_ms


def test_packed_prompts_attend_within_their_own_request() -> None:
    # four 2,048-token prompts in one step cost the GEMMs of 8,192 tokens but four causal 2,048 attentions, not one of
    # 8,192 (a quarter of the attention FLOPs)
    k, m, kv = _parts("vllm", 2048, 8192)
    packed = speed.step_time(k, m, kv, [], pieces=((2048, 0),) * 4)
    one = speed.step_time(k, m, kv, [], 8192, 0)
    assert packed.gemm_ms == one.gemm_ms
    assert abs(packed.attention_ms - one.attention_ms / 4) < 1e-9 * one.attention_ms


def test_the_estimate_states_the_arrival_it_prices_and_the_waves_figure() -> None:
    recipe = recipe_for("tests/data/configs/llama3_1_8b", "H100-80GB", "vllm", "bf16", 2048, 64, [1, 8], 8192)
    est = estimate(recipe, plan(recipe), use_aiconfigurator=False)
    assert est.workload["arrival"] == Arrival.STAGGERED.value
    note = next(n for n in est.notes if n.startswith("arrival: staggered"))
    k, m, kv = _parts("vllm", 2048, 8192)
    assert f"concurrency 8: {wave_ttft_ms(k, m, kv, 2048, 8, 8192):,.1f} ms" in note
    assert "concurrency 1:" not in note  # a lone request is the same either way
