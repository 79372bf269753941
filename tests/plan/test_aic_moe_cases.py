"""trtkv's speed model against aiconfigurator's recorded mixture-of-experts estimates (tests/data/aiconfigurator/
moe_cases.json, `scripts/record_aiconfigurator.py --moe`): gpt-oss-20b, gpt-oss-120b, Qwen3-30B-A3B and DeepSeek-V3, 35
cases with tensor parallelism only and 219 with expert parallelism, with and without attention DP (MOE_LAYOUT_SETS, a
grid: TP2 x EP2 to DEP8 on H100, H200 and B200 under the three engines; added at ITL 209 and TTFT 213 of 219 within
the bounds, the rest listed in OUTSIDE with the reason). No case was used to fit the model (every case used_to_fit
false: the fit set is empty, all are held out); what the model takes
from aiconfigurator is its kernel tables (the fused MoE op's moe_perf.parquet fits, tools/aic_kernels.py) and, for
TensorRT-LLM and SGLang, its TTFT queuing factor read from its source (trtkv.plan.speed.queue_factor). The issue's
bounds (#49: ITL 25%, TTFT 30%) hold on every case but those listed in OUTSIDE with the reason found; the test fails if
a listed case comes back inside (then take it off the list) or another leaves the band. Shown on main's code before
this change (93fa6a3): ITL median |error| 22.7%, worst -61.9%; TTFT median 61.3%, worst -88.9%. With the prefill's fused
MoE op read from the engine table's own row for the model's expert shape and moe_tp/EP (trtkv.plan.moe_tables.shape_row_ms,
where one median efficiency per engine and dtype stood: 4aca474) the six TTFT misses came inside: TTFT median 17.0% ->
6.9%, worst +37.9% -> +19.3%, 35 of 35 within 30% (gpt-oss-120b SGLang c1 -36.2% -> -1.2%, vLLM c16 -31.6% -> -12.9%;
Qwen3-30B-A3B TP2 TensorRT-LLM c1 -32.4% -> -7.0%, SGLang c16 +37.9% -> +19.3%). With the decode step's fused MoE op read
from the same table's own balanced rows for the model's shape and moe_tp/EP at the experts the busiest rank reads
(trtkv.plan.moe_tables.decode_row_ms, where the per-dtype fit over every shape stood: 9fc1850) the two ITL misses came
inside: ITL median 7.6% -> 5.0%, worst -34.9% -> +23.9%, 35 of 35 within 25% (SGLang H100 c16: gpt-oss-20b -34.9% ->
-3.9%, its 32 MXFP4 experts' rows ~18 us an expert where the fit had ~7; Qwen3-30B-A3B +29.0% -> +23.9%, what is left
being uniform routing's 82 of 128 experts against the ~50 of aiconfigurator's power_law_1.2 row)."""

from __future__ import annotations

import statistics

import pytest

from tests.support import aic_moe_cases as mc
from tests.support import speed_cases as sc
from trtkv.plan import aic
from trtkv.plan.model import resolve_architecture

BOUND = {"itl_ms": mc.ITL_BOUND, "ttft_ms": mc.TTFT_BOUND}
# (metric, case) -> why trtkv's model is outside the band (none of the TP-only cases since the decode step's fused MoE op
# read its shape's own balanced rows, trtkv.plan.moe_tables.decode_row_ms).
# Qwen3-30B-A3B DEP2 at 4 sequences a rank (TensorRT-LLM on H100 and B200, SGLang on B200): aiconfigurator prices the
# all-to-all around the experts at 9.0 us (dispatch) and 9.4 us (combine) a layer on B200, 6.4 and 6.1 on H100 (its
# MoEDispatch op for the layout, aiconfigurator-core 0.12.0; 0.431 + 0.449 ms over 48 layers in its B200 TensorRT-LLM
# breakdown), where its own GB200 table of the kernel TensorRT-LLM runs there (comm/trtllm/1.3.0rc10/
# trtllm_alltoall_perf.parquet, NVLinkOneSided, moe_ep_size 2, 4 tokens) measures 15.1 and 17.1 us, and trtkv prices
# 15.4 us a call on B200, 9.8 on H100 (the system's NCCL floor, trtkv.plan.moe_step.routed_ms): 0.60 ms of the B200
# step's 1.5 ms gap. Priced at aiconfigurator's figure the B200 TensorRT-LLM case is +16%; the rest is uniform routing's
# experts (3.33 ms) against its power-law row (2.91 ms). At 64 sequences the experts dominate and the cases are inside
_A2A = "aiconfigurator's DEP2 all-to-all 18.4 us a layer on B200; its GB200 kernel table 32.2, trtkv 30.8"
# DeepSeek-V3 under vLLM on B200 (TP8 x EP8 and DEP8): aiconfigurator's decode step carries its vLLM 0.24.0 B200
# block-FP8 GEMM rows, which at small M run at ~100 GB/s (its GEMM op, fp8_block: n 4096 x k 7168 at 1 token 0.279 ms,
# at 8 tokens 0.174; n 7168 x k 2048 0.263 ms; SGLang 0.5.14's rows for the same GEMMs on the same GPU 0.013 and 0.008
# ms; vLLM's own H200 rows 0.056): the shared expert's two GEMMs alone are 0.54 ms a layer, 31 ms over 58 layers, its
# "moe_overlap" 21-33 ms a step (the routed experts' MoE op at 8 tokens is 0.226 ms a layer, as SGLang's 0.222). trtkv
# prices vLLM's B200 GEMMs from the same tables' reference shapes (tools/aic_kernels.py), which run at B200's bandwidth
_VLLM_GEMM = "aiconfigurator's vLLM B200 block-FP8 GEMM rows at small M: ~100 GB/s, 20x SGLang's for the same GEMMs"
# The same setups' TTFT, and Qwen3-30B-A3B TP2 x EP2 under vLLM on B200 at 64: aiconfigurator's vLLM TTFT is 2.9x its
# own prefill step at one request (58.1 against 19.7 ms for Qwen3-30B-A3B TP2 x EP2 on B200) and 5.0x at 64 (103.4
# against 20.7), its vLLM TTFT terms, which trtkv does not copy (docs/plan.md, TTFT terms); DeepSeek-V3's waits on its
# decode steps above besides
_VLLM_TTFT = "aiconfigurator's vLLM TTFT: 2.9-5.0x its own prefill step (its TTFT terms, not copied)"
OUTSIDE: dict[tuple[str, str], str] = {
    ("itl_ms", "qwen3_30b_a3b/tp2ep2dp2/H100-80GB/llmapi/2048x256/fp8/c8"): _A2A,
    ("itl_ms", "qwen3_30b_a3b/tp2ep2dp2/B200/llmapi/2048x256/bfloat16/c8"): _A2A,
    ("itl_ms", "qwen3_30b_a3b/tp2ep2dp2/B200/llmapi/2048x256/fp8/c8"): _A2A,
    ("itl_ms", "qwen3_30b_a3b/tp2ep2dp2/B200/sglang/2048x256/bfloat16/c8"): _A2A,
    **{("itl_ms", f"deepseek_v3/tp8ep8/B200/vllm/2048x256/{kv}/c{c}"): _VLLM_GEMM
       for kv in ("bfloat16", "fp8") for c in (8, 64)},
    **{("itl_ms", f"deepseek_v3/tp8ep8dp8/B200/vllm/2048x256/{kv}/c8"): _VLLM_GEMM for kv in ("bfloat16", "fp8")},
    **{("ttft_ms", f"deepseek_v3/tp8ep8/B200/vllm/2048x256/{kv}/c{c}"): _VLLM_TTFT
       for kv in ("bfloat16", "fp8") for c in (8, 64)},
    **{("ttft_ms", f"qwen3_30b_a3b/tp2ep2/B200/vllm/2048x256/{kv}/c64"): _VLLM_TTFT for kv in ("bfloat16", "fp8")},
}


def test_the_recorded_moe_cases_are_aiconfigurators_answers_with_their_parallelism() -> None:
    doc = mc.moe_cases()
    assert doc["aiconfigurator"] == aic.AIC_VERSION and doc["cases"]
    models = {c["id"].split("/")[0] for c in doc["cases"]}
    assert {"gpt_oss_20b", "gpt_oss_120b", "qwen3_30b_a3b", "deepseek_v3"} <= models, models
    for case in doc["cases"]:
        assert case["used_to_fit"] is False, case["id"]
        req = case["request"]
        assert req["tp"] * req["attention_dp"] == req["moe_tp"] * req["moe_ep"], case["id"]
        # the recipe's layout (build.tp_size counts the replica's GPUs, as TensorRT-LLM's tp_size does; with attention
        # DP each group of tp / attention_dp GPUs runs its own sequences; the experts spread over ep of the GPUs and
        # split over the rest) in aiconfigurator's terms, written out here rather than read from the adapter
        tp, ep, adp = case["tp"], case["ep"], case["attention_dp"]
        assert (req["tp"], req["attention_dp"], req["moe_tp"], req["moe_ep"]) == (tp // adp, adp, tp // ep, ep), case["id"]
    assert not any("moe_tp_size or moe_ep_size" in e["error"] for e in doc["errors"])
    # every layout of the grid is there at both levels and both KV dtypes, answered or with aiconfigurator's error:
    # nothing left out unsaid
    said = {c["id"] for c in doc["cases"]} | {e["id"] for e in doc["errors"]}
    isl, osl = mc.MOE_WORKLOADS[0]
    for name, _, gpu, backend, tp, ep, adp in mc.MOE_LAYOUT_SETS:
        for kv in ("bfloat16", "fp8"):
            for level in mc.MOE_LAYOUT_CONCURRENCY:
                case = f"{name}/{mc.layout_name(tp, ep, adp)}/{gpu}/{backend}/{isl}x{osl}/{kv}/c{level}"
                assert case in said, case
    answered = {(c["model_config"], c["gpu"], c["backend"], c["tp"], c["ep"], c["attention_dp"]) for c in doc["cases"]}
    assert len(answered & {s[1:] for s in mc.MOE_LAYOUT_SETS}) >= 40, len(answered)
    layouts = {(c["ep"] > 1, c["attention_dp"] > 1, c["backend"]) for c in doc["cases"]}
    assert {(True, True, "llmapi"), (True, True, "vllm"), (True, False, "llmapi"), (True, False, "vllm"),
            (True, False, "sglang")} <= layouts, layouts


@pytest.mark.parametrize("metric", ["itl_ms", "ttft_ms"])
def test_own_model_within_the_issues_bounds_on_moe(metric: str, capsys: pytest.CaptureFixture[str]) -> None:
    fit_ids = {c["id"] for c in mc.moe_cases()["cases"] if c["used_to_fit"]}
    rows = mc.moe_comparisons(metric)
    bound = BOUND[metric]
    with capsys.disabled():
        print(f"\n{'MoE case':<56} {'aiconfigurator ' + metric:>22} {'trtkv':>10} {'error':>8}  band")
        for c in rows:
            out = "outside: " + OUTSIDE[(metric, c.case)][:60] if (metric, c.case) in OUTSIDE else "within"
            print(f"{c.case:<56} {c.reference_ms:>22.2f} {c.trtkv_ms:>10.2f} {c.error:>+8.1%}  {out}")
        for name, part in (("fit", [c for c in rows if c.case in fit_ids]),
                           ("held out", [c for c in rows if c.case not in fit_ids])):
            if part:
                inside = sum(1 for c in part if abs(c.error) <= bound)
                print(f"{metric} {name}: {len(part)} cases, median |error| "
                      f"{statistics.median(abs(c.error) for c in part):.1%}, worst "
                      f"{max(part, key=lambda c: abs(c.error)).error:+.1%}, {inside} within {bound:.0%}")
            else:
                print(f"{metric} {name}: no case (none used to fit)")
    for c in rows:
        if (metric, c.case) in OUTSIDE:
            assert abs(c.error) > bound, f"{c.case} is now within the band: take it off OUTSIDE"
        else:
            assert abs(c.error) <= bound, c
    assert {case for m, case in OUTSIDE if m == metric} <= {c.case for c in rows}


def test_the_adapter_sends_today_what_was_recorded() -> None:
    """Each recorded answer is aiconfigurator's to the request trtkv's adapter (trtkv.plan.aic.request) builds from the
    case's recipe now: the parallelism, quantization and lengths it sends."""
    sent = {}
    for case in mc.moe_cases()["cases"]:
        key = (case["model_config"], case["gpu"], case["backend"], case["tp"], case["ep"], case["attention_dp"])
        sent.setdefault(key, (case, case["request"]))
    for (config, gpu, backend, tp, ep, adp), (case, recorded) in sent.items():
        recipe = sc.recipe_for(config, gpu, backend, "bf16", case["isl"], case["osl"], [case["concurrency"]],
                               case["isl"] + 16, weights=case["weights"], tp=tp, ep=ep, attention_dp=adp)
        now = aic.request(recipe, resolve_architecture(recipe), ["fp8"], [case["concurrency"]], config)
        assert {k: v for k, v in now.items() if k != "cases"} == recorded, case["id"]
