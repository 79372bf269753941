"""aiconfigurator's estimates for mixture-of-experts models (tests/data/aiconfigurator/moe_cases.json): the models its
data covers that trtkv has a config for (gpt-oss-20b, gpt-oss-120b, Qwen3-30B-A3B), sent with the recipe's parallelism
in aiconfigurator's terms (trtkv.plan.aic.moe_parallelism); recorded by `scripts/record_aiconfigurator.py --moe` and
compared with trtkv's own model by tests/plan/test_aic_moe_cases.py. No case was used to fit trtkv's model: each is
recorded with "used_to_fit": false."""

from __future__ import annotations

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
# trtkv's model against these: the bounds (#49)
ITL_BOUND, TTFT_BOUND = 0.25, 0.30


def moe_cases() -> dict[str, Any]:
    return json.loads(MOE_CASES.read_text())


def moe_comparisons(metric: str) -> list[sc.Comparison]:
    """trtkv's model (aiconfigurator not asked) against every recorded MoE row, for `metric` ("itl_ms" or "ttft_ms");
    the whole prompt in one step, as aiconfigurator schedules it (its ctx_tokens default = isl)."""
    cases = moe_cases()["cases"]
    setups: dict[tuple[Any, ...], set[int]] = {}
    for case in cases:
        key = (case["model_config"], case["gpu"], case["backend"], case["isl"], case["osl"], case["tp"],
               case["weights"])
        setups.setdefault(key, set()).add(case["concurrency"])
    rows = {}
    for (config, gpu, backend, isl, osl, tp, weights), levels in setups.items():
        conc = sorted(levels)
        recipe = sc.recipe_for(config, gpu, backend, "bf16", isl, osl, conc, isl + max(conc), weights=weights, tp=tp)
        for (fmt, c), row in sc.own_rows(recipe).items():
            rows[(config, gpu, backend, isl, osl, tp, weights, fmt, c)] = row
    out = []
    for case in cases:
        fmt = "bf16" if case["kv"] == "bfloat16" else case["kv"]
        row = rows[(case["model_config"], case["gpu"], case["backend"], case["isl"], case["osl"], case["tp"],
                    case["weights"], fmt, case["concurrency"])]
        out.append(sc.Comparison(case["id"], fmt, case["concurrency"], case["row"][metric], getattr(row, metric)))
    return out
