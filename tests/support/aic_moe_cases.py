"""aiconfigurator's estimates for mixture-of-experts models (tests/data/aiconfigurator/moe_cases.json): the models its
data covers that trtkv has a config for (gpt-oss-20b, gpt-oss-120b, Qwen3-30B-A3B, DeepSeek-V3), sent with the
recipe's parallelism in aiconfigurator's terms (trtkv.plan.aic.moe_parallelism), expert and attention-data parallel
layouts included (MOE_LAYOUT_SETS); recorded by `scripts/record_aiconfigurator.py --moe` and
compared with trtkv's own model by tests/plan/test_aic_moe_cases.py. No case was used to fit trtkv's model: each is
recorded with "used_to_fit": false."""

from __future__ import annotations

import functools
import json
from typing import Any

from tests.support import speed_cases as sc

MOE_CASES = sc.ROOT / "tests" / "data" / "aiconfigurator" / "moe_cases.json"
# (name, config, tp, weights, backends, GPUs): each model on a GPU whose memory holds it at that TP (gpt-oss-120b's
# 61 GiB of MXFP4 experts and 16-bit attention leave an 80 GB H100 little KV room: H200); Qwen3-30B-A3B also at TP2
# (moe_tp_size 2: every expert split over both GPUs, the recipe's TP without EP). One workload, one GPU each: the
# recording runs aiconfigurator once per (model, GPU, engine, workload), ~10 s of CPU each
MOE_CASE_SETS = [
    ("gpt_oss_20b", "tests/data/configs/gpt_oss_20b", 1, "none", sc.BACKENDS, ("H100-80GB",)),
    ("gpt_oss_120b", "tests/data/configs/gpt_oss_120b", 1, "none", sc.BACKENDS, ("H200-141GB",)),
    ("qwen3_30b_a3b", "tests/data/configs/qwen3_30b_a3b", 1, "none", sc.BACKENDS, ("H100-80GB",)),
    ("qwen3_30b_a3b", "tests/data/configs/qwen3_30b_a3b", 2, "none", ("vllm", "llmapi"), ("H100-80GB",)),
]
MOE_WORKLOADS = ((2048, 256),)
MOE_CONCURRENCY = (1, 16)
# The layouts users run MoE models in beyond TP (trtkv.recipe.parallel: tp counts the replica's GPUs, ep and attention_dp
# divide it), each sent as aiconfigurator's tp_size (one attention-DP rank's TP), attention_dp_size, moe_tp_size and
# moe_ep_size. A grid, not a pick: every model trtkv has a config for and aiconfigurator's data covers, on H100, H200 and
# B200 (DeepSeek-V3, 671 GB of FP8 weights, on H200 and B200), under the three engines, at expert parallelism with and
# without attention DP (gpt-oss-120b and Qwen3-30B-A3B: TP2 x EP2, DEP2, DEP4 as InferenceX runs gpt-oss on B200;
# DeepSeek-V3: TP8 x EP8, DEP8). What aiconfigurator 0.12.0 cannot answer is recorded as its error (SGLang's gpt-oss and
# Qwen3: no context-attention rows for their heads; out of memory in its account): (name, config, GPU, engine, tp, ep,
# attention_dp)
_LAYOUT_MODELS = (
    ("gpt_oss_120b", ("H100-80GB", "H200-141GB", "B200"), ((2, 2, 1), (2, 2, 2), (4, 4, 4))),
    ("qwen3_30b_a3b", ("H100-80GB", "H200-141GB", "B200"), ((2, 2, 1), (2, 2, 2), (4, 4, 4))),
    ("deepseek_v3", ("H200-141GB", "B200"), ((8, 8, 1), (8, 8, 8))),
)
MOE_LAYOUT_SETS = [
    (name, f"tests/data/configs/{name}", gpu, backend, tp, ep, adp)
    for name, gpus, layouts in _LAYOUT_MODELS
    for gpu in gpus
    for backend in ("llmapi", "vllm", "sglang")
    for tp, ep, adp in layouts
]
# a multiple of every attention_dp above: each rank has sequences at both levels
MOE_LAYOUT_CONCURRENCY = (8, 64)


def layout_name(tp: int, ep: int = 1, attention_dp: int = 1) -> str:
    """A case id's layout part: `tp2`, `tp2ep2`, `tp2ep2dp2` (TensorRT-LLM's DEP2)."""
    return f"tp{tp}" + (f"ep{ep}" if ep > 1 else "") + (f"dp{attention_dp}" if attention_dp > 1 else "")
# trtkv's model against these: the bounds (#49)
ITL_BOUND, TTFT_BOUND = 0.25, 0.30


def moe_cases() -> dict[str, Any]:
    return json.loads(MOE_CASES.read_text())


def _setup(case: dict[str, Any]) -> tuple[Any, ...]:
    return (case["model_config"], case["gpu"], case["backend"], case["isl"], case["osl"], case["tp"], case["ep"],
            case["attention_dp"], case["weights"])


@functools.lru_cache(maxsize=1)
def _own_rows() -> dict[tuple[Any, ...], Any]:
    """trtkv's own estimate rows for every recorded setup, by setup + (format, concurrency): one estimate per setup
    for both metrics (the grid's 100 setups take ~5 s)."""
    setups: dict[tuple[Any, ...], set[int]] = {}
    for case in moe_cases()["cases"]:
        setups.setdefault(_setup(case), set()).add(case["concurrency"])
    rows = {}
    for key, levels in setups.items():
        config, gpu, backend, isl, osl, tp, ep, adp, weights = key
        conc = sorted(levels)
        recipe = sc.recipe_for(config, gpu, backend, "bf16", isl, osl, conc, isl + max(conc), weights=weights, tp=tp,
                               ep=ep, attention_dp=adp)
        for (fmt, c), row in sc.own_rows(recipe).items():
            rows[key + (fmt, c)] = row
    return rows


def moe_comparisons(metric: str) -> list[sc.Comparison]:
    """trtkv's model (aiconfigurator not asked) against every recorded MoE row, for `metric` ("itl_ms" or "ttft_ms");
    the whole prompt in one step, as aiconfigurator schedules it (its ctx_tokens default = isl)."""
    rows = _own_rows()
    out = []
    for case in moe_cases()["cases"]:
        fmt = "bf16" if case["kv"] == "bfloat16" else case["kv"]
        row = rows[_setup(case) + (fmt, case["concurrency"])]
        out.append(sc.Comparison(case["id"], fmt, case["concurrency"], case["row"][metric], getattr(row, metric)))
    return out
