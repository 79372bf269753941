"""The cases trtkv's speed model is checked on: recorded aiconfigurator estimates (tests/data/aiconfigurator/) and
published measurements (tests/data/published_speed/); shared by the tests, scripts/record_aiconfigurator.py and
scripts/speed_tables.py (docs/plan.md's tables)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtkv.kvcache.formats import KVFormat
from trtkv.plan.adp_balance import AdpBalance, with_balance_hold
from trtkv.plan.estimate import estimate, kv_cost, model_shape
from trtkv.plan.model import resolve_architecture
from trtkv.plan.moe_step import rank_concurrency
from trtkv.plan.planner import plan
from trtkv.plan.speed import kernels_for
from trtkv.plan.waves import Arrival, serve_at
from trtkv.recipe import Recipe, load_recipe
from trtkv.recipe.backend_rules import SPEED_ENGINE

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "tests" / "data" / "recipes" / "speed_case.yaml"
AIC_CASES = ROOT / "tests" / "data" / "aiconfigurator" / "cases.json"
PUBLISHED = sorted((ROOT / "tests" / "data" / "published_speed").glob("*.json"))
KV_RECIPE = {"bfloat16": "none", "fp8": "fp8", "bf16": "none"}
# The end-to-end cases compared with aiconfigurator; none was used to derive the model: tools/aic_kernels.py reads
# kernel rows only (square GEMMs, a 70B-class attention layer at TP4, NCCL all-reduce over 4 GPUs).
MODELS = {"llama3_1_8b": "tests/data/configs/llama3_1_8b", "qwen3_8b": "tests/data/configs/qwen3_8b"}
GPUS = {"H100-80GB": "h100_sxm", "H200-141GB": "h200_sxm", "B200": "b200_sxm"}
BACKENDS = ("vllm", "llmapi", "sglang")
# (name, config, tp, weights, backends): 8B-class models at TP1 with 16-bit weights; Llama-3.1-70B at TP2 with FP8
# weights (the all-reduce and the FP8 GEMM lane; TP4, whose layer is the reference shape, is left out)
CASE_SETS = [(name, cfg, 1, "none", BACKENDS) for name, cfg in MODELS.items()] + [
    ("llama3_1_70b", "tests/data/configs/llama3_1_70b", 2, "fp8", ("vllm", "llmapi"))]
WORKLOADS = ((2048, 256), (16384, 512))
CONCURRENCY = (1, 16)


def recipe_for(model_config: str, gpu: str, backend: str, kv: str, isl: int, osl: int, concurrency: list[int],
               budget: int, weights: str = "none", tp: int = 1, moe_activations: str = "auto", ep: int = 1,
               attention_dp: int = 1) -> Recipe:
    """A recipe for one case, from the shipped llama8b recipe with the case's fields overridden. The estimate prices
    every KV format the engine serves whatever the recipe's own, so the cases pass kv "bf16" and pick the format's row:
    an FP8 KV cache over 16-bit weights is what the published vLLM runs measured (--kv-cache-dtype fp8), but not a
    recipe trtkv builds for vLLM (ModelOpt's export without a weight quant_algo: recipe.backend_rules.vllm_problems).
    `tp` counts the replica's GPUs (build.tp_size); `ep` and `attention_dp` divide it (trtkv.recipe.parallel)."""
    return load_recipe(BASE, [
        f"model.source={ROOT / model_config}", f"build.backend={backend}", f"quantization.weights={weights}",
        f"quantization.kv_cache={KV_RECIPE.get(kv, kv)}", f"hardware.gpu={gpu}", f"hardware.count={tp}",
        f"build.tp_size={tp}", f"bench.input_tokens={isl}", f"bench.output_tokens={osl}",
        f"bench.concurrency={list(concurrency)}", f"build.max_num_tokens={budget}",
        f"build.max_input_len={max(isl, 32768)}", f"build.max_seq_len={max(isl + osl, 65536)}",
        f"build.moe_activations={moe_activations}", f"build.ep_size={ep}", f"build.attention_dp_size={attention_dp}"])


def own_rows(recipe: Recipe) -> dict[tuple[str, int], Any]:
    """trtkv's own model for every (format, concurrency) of the recipe (aiconfigurator not asked)."""
    est = estimate(recipe, plan(recipe), use_aiconfigurator=False)
    return {(r.format, r.concurrency): r for r in est.rows}


@dataclass(frozen=True)
class Comparison:
    case: str
    kv: str
    concurrency: int
    reference_ms: float
    trtkv_ms: float

    @property
    def error(self) -> float:
        return self.trtkv_ms / self.reference_ms - 1


def aic_cases() -> dict[str, Any]:
    return json.loads(AIC_CASES.read_text())


def aic_comparisons(metric: str = "itl_ms") -> list[Comparison]:
    """trtkv's model against every recorded aiconfigurator row (ITL by default); aiconfigurator schedules the whole
    prompt in one step (its ctx_tokens default = isl), so trtkv's model gets the same budget. One estimate per setup
    answers both KV formats and both concurrency levels."""
    cases = aic_cases()["cases"]
    setups: dict[tuple, list[int]] = {}
    for case in cases:
        key = (case["model_config"], case["gpu"], case["backend"], case["isl"], case["osl"], case.get("tp", 1),
               case.get("weights", "none"))
        setups.setdefault(key, []).append(case["concurrency"])
    rows = {}
    for (config, gpu, backend, isl, osl, tp, weights), levels in setups.items():
        conc = sorted(set(levels))
        recipe = recipe_for(config, gpu, backend, "bf16", isl, osl, conc, isl + max(conc), weights=weights, tp=tp)
        for (fmt, c), row in own_rows(recipe).items():
            rows[(config, gpu, backend, isl, osl, tp, weights, fmt, c)] = row
    out = []
    for case in cases:
        fmt = "bf16" if case["kv"] == "bfloat16" else case["kv"]
        row = rows[(case["model_config"], case["gpu"], case["backend"], case["isl"], case["osl"], case.get("tp", 1),
                    case.get("weights", "none"), fmt, case["concurrency"])]
        out.append(Comparison(case["id"], fmt, case["concurrency"], case["row"][metric], getattr(row, metric)))
    return out


def published() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) | {"file": str(p.relative_to(ROOT))} for p in PUBLISHED]


def itl_fit(setup: dict[str, Any], m: dict[str, Any], fmt: str, lengths: tuple[int, int] = (1024, 65536)) -> tuple[
        float, float]:
    """(slope ms/token, intercept ms) of trtkv's concurrency-1 ITL between two input lengths, as the source fitted."""
    itl = []
    for n in lengths:
        recipe = recipe_for(setup["model_config"], m["gpu"], setup["backend"], "bf16", n, m["output_tokens"], [1],
                            m["max_num_batched_tokens"], weights=setup["weights"], tp=setup["tp"])
        itl.append(own_rows(recipe)[(fmt, 1)].itl_p50_ms)
    slope = (itl[1] - itl[0]) / (lengths[1] - lengths[0])
    return slope, itl[0] - slope * lengths[0]


def published_comparisons() -> list[dict[str, Any]]:
    """One row per published figure: source, measurement, format, figure, measured, trtkv's estimate, error."""
    rows = []
    for doc in published():
        setup = doc["setup"]
        for m in doc["measurements"]:
            if "ep" in m:  # a step-model case at its own parallelism: step_model_comparisons
                continue
            fits = {}
            for fmt, measured in m["formats"].items():
                if m["kind"] == "serving":
                    recipe = recipe_for(setup["model_config"], m["gpu"], setup["backend"], "bf16", m["input_tokens"],
                                        m["output_tokens"], [m["concurrency"]], m["max_num_batched_tokens"],
                                        weights=setup["weights"], tp=setup["tp"])
                    r = own_rows(recipe)[(fmt, m["concurrency"])]
                    got = {"ttft_p50_ms": r.ttft_ms, "itl_p50_ms": r.itl_p50_ms, "output_tokens_per_s": r.output_tokens_per_s}
                else:
                    slope, intercept = itl_fit(setup, m, fmt)
                    fits[fmt] = (slope, intercept)
                    got = {"slope_ms_per_token": slope, "intercept_ms": intercept}
                rows += [{"source": doc["file"], "measurement": m["id"], "format": fmt, "figure": k, "measured": v,
                          "estimate": got[k], "error": got[k] / v - 1} for k, v in measured.items()]
            if "break_even_tokens" in m and len(fits) == 2:
                (s16, b16), (s8, b8) = fits["bf16"], fits["fp8"]
                est = (b8 - b16) / (s16 - s8) if s16 > s8 else float("inf")
                rows.append({"source": doc["file"], "measurement": m["id"], "format": "fp8 vs bf16",
                             "figure": "break_even_tokens", "measured": m["break_even_tokens"], "estimate": est,
                             "error": est / m["break_even_tokens"] - 1})
    return rows


def step_model_figures(setup: dict[str, Any], m: dict[str, Any], fmt: str) -> dict[str, float]:
    """trtkv's step model for one published serving measurement at its parallelism (tp: attention's TP inside one DP
    group, ep, attention_dp: trtkv.plan.moe_step) and at the mean lengths its client drew (a range ratio r draws
    uniformly in [r x len, len]), its requests arriving as its client sends them (m["arrival"]: trtkv.plan.waves), held
where the server balances attention DP (setup["attention_dp_balance"]: trtkv.plan.adp_balance)."""
    ratio = m.get("range_ratio", 1.0)
    isl, osl = (round(n * (1 + ratio) / 2) for n in (m["input_tokens"], m["output_tokens"]))
    budget = m["max_num_batched_tokens"]
    # a measurement may name its own model (one source's runs of two models)
    recipe = recipe_for(m.get("model_config", setup["model_config"]), m["gpu"], setup["backend"], "bf16", isl, osl,
                        [m["concurrency"]], budget,
                        weights=setup["weights"], tp=m["tp"], moe_activations=setup.get("moe_activations", "auto"))
    arch = resolve_architecture(recipe)
    k = kernels_for(recipe.hardware.gpu, SPEED_ENGINE[recipe.build.backend])
    shape = model_shape(arch, recipe, m["ep"], m["attention_dp"])
    per_rank = rank_concurrency(m["concurrency"], m["attention_dp"])
    s = serve_at(k, shape, kv_cost(arch, recipe, KVFormat(fmt), ()), isl, osl, per_rank, budget,
                 Arrival(m["arrival"]), m.get("chunked_prefill", True))
    balance = setup.get("attention_dp_balance")  # TensorRT-LLM's enable_balance: trtkv.plan.adp_balance
    if balance:
        s = with_balance_hold(s, m["attention_dp"], per_rank, osl,
                              AdpBalance(balance["timeout_iters"], balance["batching_wait_iters"]))
    return {"ttft_p50_ms": s.ttft_ms, "itl_p50_ms": s.itl_p50_ms, "tpot_p50_ms": s.itl_ms,
            "moe": float(shape.moe is not None)}


def step_model_comparisons() -> list[dict[str, Any]]:
    """One row per figure of every published measurement that states its EP and attention DP (the step model's cases:
    MoE and dense), trtkv's estimate beside it."""
    rows = []
    for doc in published():
        setup = doc["setup"]
        for m in doc["measurements"]:
            if "ep" not in m:
                continue
            for fmt, measured in m["formats"].items():
                got = step_model_figures(setup, m, fmt)
                rows += [{"source": doc["file"], "measurement": m["id"], "format": fmt, "figure": k, "measured": v,
                          "estimate": got[k], "error": got[k] / v - 1, "ep": m["ep"],
                          "attention_dp": m["attention_dp"], "moe": bool(got["moe"])} for k, v in measured.items()]
    return rows
