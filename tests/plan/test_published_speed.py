"""trtkv's step model held to published serving measurements of MoE deployments (tests/data/published_speed/, one file
per source, at most two measurements each and two files per publisher, every setup fully known: engine and version,
GPU, TP/EP/attention DP, ISL/OSL, concurrency, KV dtype). None was used to set a parameter of the model. The band is the
issue's (#49): ITL or TPOT within 25%, TTFT within 30%. A figure the model misses stays listed in OUTSIDE_BAND with the
reason found, and the test fails if it comes back inside (then move it out of the list) or if any other figure leaves
the band. Shown failing on main's code (42c69aa), which read every expert each step: ITL/TPOT 1.2-3.7x the
measurements, TTFT up to 20x. The two benchmarks whose fixed-length requests start together (arrival "waves":
trtkv.plan.waves) were -74.8% (vLLM, Qwen3-30B-A3B c10) and -78.6% (LLMPerf, DeepSeek-R1 c8) TTFT under the
steady-state queue on d2b3715, listed misses then; priced by their waves' prefill steps they are inside. Two staggered
TTFTs came inside when a new request was charged for the step in flight (trtkv.plan.in_flight: 1.5 decode steps under the
engines' default overlapped scheduling): vLLM gpt-oss-120b TP2 c64 on H100 -33.1% -> -5.0%, SGLang DeepSeek-V3 TP8 c8
on H20 -32.4% -> -19.3% (shown on main's code, d49efc5, which printed the former). TensorRT-LLM's attention-DP
balancing (trtkv.plan.adp_balance: enable_balance's hold, run as its counters run) brought DEP2/DEP4 on B200 from
-70.9% / -81.6% to +12.7% / +5.5%. Pricing an EP step at its busiest rank (trtkv.plan.moe_step.rank_load) brought
TensorRT-LLM's DeepSeek-R1 at EP8 from -14.3% / -15.7% TPOT (the mean rank's share, on main's 4aca474) to -6.2% /
-3.7% (-2.6% with the prefill's rows below). The prefill's fused MoE op read from the engine table's own row for the
model's expert shape (trtkv.plan.moe_tables.shape_row_ms) and H20's fused-MoE fit at H20's own peaks moved TTFTs
(on 4aca474 -> after): H20 -18.2% -> +1.2%, DeepSeek-R1 H200 EP8 c1/c8 -18.4%/-1.8% -> +6.3%/+7.1%,
vLLM gpt-oss-120b H100 TP2 c4/c64 +5.8%/-2.9% -> +29.3%/+18.7%
(its moe_tp 2 rows at 1,024 tokens, power-law load: 0.73 ms a layer, 1.5x balanced). MLA's down-projections and the
routers held whole on every TP rank (trtkv.plan.layer_ops.replicated_parameters; divided by TP on 9fc1850) moved
DeepSeek's figures: R1 EP8 TPOT -6.2%/-2.6% -> -4.3%/-1.0%, TTFT +6.3%/+7.1% -> +11.9%/+14.5%; V3 on H20 ITL -39.5% ->
-38.1%, TTFT +1.2% -> +12.7%. The decode step's fused MoE op read from the same tables' own balanced rows for the shape
and moe_tp/EP (trtkv.plan.moe_tables.decode_row_ms, where the per-dtype fit over every shape stood; on 9fc1850 -> after,
without the line above) moved every decode figure away from its measurement, each staying in its band: DeepSeek-R1 EP8
c1/c8 TPOT -6.2%/-2.6% -> -21.0%/-11.1% (its EP8 rows' fixed cost ~30 us a layer where the fit's, from EP1 rows over 256
local experts, is 59), vLLM gpt-oss-120b TP2 c64 ITL/TPOT +1.5%/-3.2% -> +13.5%/+6.6% (POWER_LAW_CLOSER), c4 -0.5%/-0.8%
-> -2.3%/-2.5%, Qwen3-30B-A3B c10 +0.6% -> +6.9%, gpt-oss DEP4 +19.4% -> +22.2% (DEP2, listed, +51.0% -> +53.3%). Both
together: DeepSeek-R1 EP8 TPOT -19.0% / -9.6%, V3 on H20 ITL -38.1%, gpt-oss DEP2 / DEP4 +53.3% / +22.2%."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from tests.support import speed_cases as sc
from trtkv.plan import moe_step, speed

BAND = {"itl_p50_ms": 0.25, "tpot_p50_ms": 0.25, "ttft_p50_ms": 0.30}
# (measurement, figure) -> why the model is outside the band. Not tuned away: each is a cost the kernel model does not
# price, said in docs/plan.md.
OUTSIDE_BAND = {
    # DEP2 -> DEP4 halves a rank's expert bytes under any routing, yet the run's TPOT drops 6% (5.33 -> 5.00 ms; the model
    # 8.18 -> 6.11; 8.05 -> 5.97 before the decode rows). The model's DEP2 step then, 7.83 ms + 0.22 ms of prefill folded
    # into TPOT: routed experts 4.72 ms (36 layers x 131 us: the busiest of 2 EP ranks reads 57.1 of its 64 MXFP4 experts,
    # 27.2 GB, 3.40 ms at 8 TB/s, plus the fused op's 17.5 us a layer and 0.33 us an expert), all-to-all 1.13 ms (72 calls
    # at 15.7 us), dense GEMMs 1.01 ms (3.1 GB of 16-bit attention and LM head, 0.47 ms, and 109 calls' fixed costs),
    # attention 0.52 ms, elementwise 0.45 ms. The engine's own kernel tables floor the step above the run: the fused MoE
    # op at gpt-oss's shape, moe_ep 2, 64 tokens (aiconfigurator-core 0.12.0 b200_sxm TensorRT-LLM 1.3.0rc20, MXFP4 x
    # MXFP8) takes 0.119 ms a layer under its power law and 0.149 ms balanced (4.3 / 5.4 ms a step); NVLinkOneSided
    # dispatch + combine at EP2 with 32 tokens a rank 33.1 us a layer (its gb200 TensorRT-LLM 1.2.0rc6 table; trtkv's 31.5
    # us is within 2 us, and priced from the table DEP4 stays inside, ~+21%); the 3.1 GB of dense weights >= 0.39 ms: >=
    # 6.0 ms a step against the 5.33 measured, where at DEP4 the same floors (4.35 ms) sit below its 5.00. Attention-DP
    # ranks are even (32 sequences each; the busiest EP rank's 57.1 experts against the mean 55.6); no speculative
    # decoding (InferenceX 645b97aa4). So the run reads fewer experts than the power law (its routing on random prompts)
    # or its 1.2.0rc2 kernels beat the tables; no term trtkv can cite. aiconfigurator's own step model (0.12.0, MXFP4 x
    # MXFP8 rows, 922/922 tokens) gives TPOT 7.03 ms at DEP2 (+32%) and 5.43 at DEP4 (+8.6%), and 8.58 ms (+27%) at the
    # same run's DEP2 with 128 in flight (6.74 ms measured, not held; trtkv 9.01, +34%); the same run's TP-only rows (not
    # held) are +18% to +28% (TP2-TP8 at concurrency 4-32), TP1 c128 -0.2%.
    # InferenceX measured the same setup again on 2026-01-07 (aiconfigurator-core 0.12.0 systems/silicon_sample.csv,
    # `..._c64_tp2_ep2_1994`, same image): 5.66 ms, the model +44.5% (scripts/silicon_samples.py; docs/plan.md).
    ("b200_dep2_1k1k_c64", "tpot_p50_ms"): "below the engine's own kernel tables: MoE >= 4.3 + all-to-all 1.2 + dense "
                                           "0.4 ms > 5.33 measured; uniform +53%, power law +38%",
    # aiconfigurator-core 0.12.0 ships no H20 system YAML or kernel tables (only a node selector in aiconfigurator's
    # generator/facts/hardware.yaml): H100's kernel efficiencies at H20's own bandwidth and peaks (148 BF16 / 296 FP8
    # TFLOPS). The model's step, 12.2 ms (the median ITL is the step without a prefill): routed experts 6.56 ms (58 layers
    # x 113 us: 57.4 of 256 experts' TP8 slices, 316 MB, 81 us at 4.0 TB/s, plus the fused op's 26 us), dense GEMMs 3.27
    # ms (3.1 GB with MLA's down-projection and the routers whole on every rank, 0.88 ms, and 486 calls x 4.9 us),
    # elementwise 1.13 ms (366 kernels x 3 us), attention 0.69 ms (0.09 ms of latent KV), all-reduce 0.57 ms (122 x 4.6
    # us). SGLang 0.4.8's decode layer (models/deepseek_v2.py: FA3, block-FP8 linears each behind a per-token-group
    # quantization kernel, the shared expert fused into the triton MoE by default) launches ~28 kernels where the model
    # prices ~18: 7 memory-bound kernels more (5 activation quantizations, kv_a_layernorm, top-k), 2 GEMMs fewer, +0.5 ms a
    # step. Pricing every dense GEMM at 64 rows (Hopper's wgmma tile; 1.7x its weight read at H20's FP8 peak) adds 1.3 to
    # 2.5 ms depending on the lane and on whether fixed costs add to compute; the rest (~5 ms, ~3 us a kernel over H100's)
    # is per-kernel time on 78 SMs that nothing trtkv reads has measured
    ("h20_tp8_1k512_c8", "itl_p50_ms"): "no H20 kernel tables: kernel counts explain +0.5 of the 7.5 ms a step it "
                                        "lacks; 64-row GEMM padding 1.3-2.5 ms, the rest per-kernel time on 78 SMs",
    # Qwen's own H20 runs (a second publisher, batch 1, SGLang 0.4.6.post1) miss the same way, and more for the larger
    # model: one token's step reads 6.08 GB (Qwen3-30B-A3B's active BF16 weights) or 64.0 GB (Qwen3-32B) in 7.29 / 48.29
    # ms, 0.83 / 1.32 TB/s with every fixed cost in the step, where the model runs H100's GEMM-memory efficiencies
    # (0.89 of peak on SGLang) at H20's 4.0 TB/s. Measured per SM, H20 moves about what H100 moves (DeepGEMM's grouped
    # FP8 GEMM on DeepSeek's expert shape: 1,862 GB/s on H20's 78 SMs, 2,836 on H100's 132; deepseek-ai/DeepGEMM #116,
    # sgl-project/DeepGEMM #11, deepseek-ai/DeepGEMM #192): pricing H100's bytes per SM on 78 SMs would bring these to
    # -13% / -18% and DeepSeek-V3 to -8%, but H200's own tables move 1.5x H100's bytes per SM on the same 132 SMs
    # (4.44 against 2.97 TB/s), so no per-SM law trtkv can cite holds across its Hopper tables (docs/plan.md)
    ("h20_qwen3_30b_a3b_1in2048_c1", "tpot_p50_ms"): "no H20 kernel tables: batch-1 decode at ~0.8 TB/s effective "
                                                     "against the 4.0 TB/s x H100 efficiency priced",
    ("h20_qwen3_32b_1in2048_c1", "tpot_p50_ms"): "no H20 kernel tables: batch-1 decode at ~1.3 TB/s effective against "
                                                 "the 4.0 TB/s x H100 efficiency priced",
}

# (measurement, figure) without EP where aiconfigurator's power-law load lands closer than uniform routing, and why
POWER_LAW_CLOSER = {
    # 64 tokens a step at moe_tp 2: uniform routing reads 111 of gpt-oss-120b's 128 experts, which the shape's own
    # balanced rows (vLLM 0.24.0 on H100, trtkv.plan.moe_tables.decode_row_ms) price at 0.342 ms a layer (+13.5%), the
    # power law's 88 at 0.278 ms (-3.8%); the same run's TPOT, its prefill steps included, stays closer under uniform
    # (+6.6% against -7.5%). Closer under uniform too (+1.5% against -12.4%) while decode read the per-dtype fit
    ("h100_tp2_1k1k_c64", "itl_p50_ms"): "median ITL at 64 tokens a step: uniform reads 111 of 128 experts, the power "
                                         "law 88; its TPOT stays closer under uniform",
}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return sc.step_model_comparisons()


def test_the_set_covers_moe_expert_parallel_and_attention_dp(rows: list[dict]) -> None:
    measurements = {(r["source"], r["measurement"]): r for r in rows}
    per_source = Counter(source for source, _ in measurements)
    assert max(per_source.values()) <= 2 and len(per_source) >= 5
    # at most two files per publisher (a project's blog, PRs and issues are one publisher)
    per_publisher = Counter(doc["source"]["publisher"] for doc in sc.published())
    assert max(per_publisher.values()) <= 2 and len(per_publisher) >= 4, per_publisher
    moe = [r for r in measurements.values() if r["moe"]]
    assert len(moe) >= 8
    assert sum(1 for r in moe if r["ep"] > 1 or r["attention_dp"] > 1) >= 2
    # with the vLLM FP8 KV blog's dense measurements (test_speed_estimate.py): at least 8 in all
    assert len(measurements) + len({r["measurement"] for r in sc.published_comparisons()}) >= 8
    for doc in sc.published():
        if any("ep" in m for m in doc["measurements"]):
            assert doc["source"]["url"] and doc["quoted"] and doc["setup"]["engine_version"], doc["file"]
            for m in doc["measurements"]:
                for key in ("gpu", "tp", "ep", "attention_dp", "input_tokens", "output_tokens", "concurrency",
                            "max_num_batched_tokens", "arrival"):
                    assert m[key], (doc["file"], m["id"], key)
            # how its client sends requests, from the client's source (trtkv.plan.waves)
            assert doc["source"]["arrival_note"], doc["file"]


def test_step_model_within_the_band_of_published_measurements(rows: list[dict],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(f"\n{'source':<42} {'measurement':<20} {'kv':<5} {'figure':<12} {'measured':>9} {'trtkv':>9} "
              f"{'error':>7}  band")
        for r in rows:
            out = "outside: " + OUTSIDE_BAND[(r["measurement"], r["figure"])] if (
                r["measurement"], r["figure"]) in OUTSIDE_BAND else "within"
            print(f"{r['source'].split('/')[-1]:<42} {r['measurement']:<20} {r['format']:<5} {r['figure']:<12} "
                  f"{r['measured']:>9.2f} {r['estimate']:>9.2f} {r['error']:>+7.1%}  {out}")
    for r in rows:
        key = (r["measurement"], r["figure"])
        if key in OUTSIDE_BAND:
            assert abs(r["error"]) > BAND[r["figure"]], f"{key} is now within the band: remove it from OUTSIDE_BAND"
        else:
            assert abs(r["error"]) <= BAND[r["figure"]], r
    assert set(OUTSIDE_BAND) <= {(r["measurement"], r["figure"]) for r in rows}
    # the list of misses cannot grow to cover the decode figures: at least 6 stay inside and more than half (6 of 10
    # with the model at 93fa6a3; three of the four outside are DeepSeek's MLA at TP8 under two engines, one term)
    itl = [r for r in rows if r["figure"] != "ttft_p50_ms"]
    inside = sum(1 for r in itl if (r["measurement"], r["figure"]) not in OUTSIDE_BAND)
    assert inside >= 6 and 2 * inside > len(itl)


def test_uniform_routing_is_what_the_measurements_without_ep_bear_out(rows: list[dict], monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The routing assumption (trtkv.plan.moe_step): uniform routing, the default, against aiconfigurator's power-law
    expert load (alpha 1.2, its default for gpt-oss and Qwen3-MoE) on every decode figure. Without EP (one rank reads
    what the whole batch routes to, so only the skew differs) uniform is closer on each but those listed in
    POWER_LAW_CLOSER, and on most; with EP the busiest rank's load enters too, and the two split."""
    real = speed.routed_ms
    monkeypatch.setattr(speed, "routed_ms", lambda k, moe, tokens: real(k, replace(moe, routing=moe_step.POWER_LAW),
                                                                        tokens))
    skewed = {(r["measurement"], r["figure"]): r for r in sc.step_model_comparisons()}
    decode = [r for r in rows if r["moe"] and r["figure"] != "ttft_p50_ms"]
    with capsys.disabled():
        print(f"\n{'measurement':<22} {'figure':<12} {'EP':>3} {'uniform':>8} {'power law 1.2':>14}")
        for r in decode:
            print(f"{r['measurement']:<22} {r['figure']:<12} {r['ep']:>3} {r['error']:>+8.1%} "
                  f"{skewed[(r['measurement'], r['figure'])]['error']:>+14.1%}")
    solo = [r for r in decode if r["ep"] == 1 and r["attention_dp"] == 1]
    assert len(solo) >= 4
    for r in solo:
        key = (r["measurement"], r["figure"])
        if abs(r["error"] - skewed[key]["error"]) < 1e-9:
            continue  # one token a step reads its own top-k experts under either routing
        uniform_closer = abs(r["error"]) < abs(skewed[key]["error"])
        assert uniform_closer != (key in POWER_LAW_CLOSER), (r, "listed" if key in POWER_LAW_CLOSER else "not listed")
    assert set(POWER_LAW_CLOSER) <= {(r["measurement"], r["figure"]) for r in solo}
    assert 2 * len(POWER_LAW_CLOSER) < len(solo)  # the default stands on most of them
