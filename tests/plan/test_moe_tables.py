"""The prefill's fused MoE op read from the engine table's own row for the model's expert shape and moe_tp/EP
(trtkv.plan.moe_tables, trtkv.plan.moe_tables.shape_row_ms; issue #49), and a GPU without tables of its own priced at its
own peaks. The rows quoted are aiconfigurator-core 0.12.0's h200_sxm/moe/sglang/0.5.14/moe_perf.parquet, moe_dtype
w4a16_mxfp4, hidden 2880, inter 2880, topk 4, 128 experts (gpt-oss-120b), power_law_1.01, the minimum over its kernel
rows. Shown failing on 4aca474, which priced every shape of a dtype at one median compute efficiency: gpt-oss-120b's
2,048-token prefill layer on SGLang/H200 at 1.84 ms against the row's 3.03 ms, and H20's fused MoE op at H100's peak.
The decode step's fused MoE op read from the same table's own balanced rows (trtkv/data/moe_decode_rows.json,
trtkv.plan.moe_tables.decode_row_ms), quoted from aiconfigurator-core 0.12.0's h100_sxm/moe/sglang/0.5.14/moe_perf.parquet,
w4a16_mxfp4, hidden 2880, inter 2880, topk 4, 32 experts (gpt-oss-20b), balanced, moe_tp 1, EP 1. Shown failing on
9fc1850, which priced every shape's decode at the per-dtype fit: gpt-oss-20b's layer at 16 tokens on SGLang/H100 at 0.269
ms where its rows read 0.51 ms at the 28.2 experts uniform routing reaches (aiconfigurator's own answer: 0.568 ms, its
power_law_1.2 row)."""

from __future__ import annotations

import pytest

from tests.support import speed_cases as sc
from trtkv.plan import moe_step, moe_tables, speed
from trtkv.plan.estimate import model_shape
from trtkv.plan.model import resolve_architecture
from trtkv.plan.moe_tables import MOE_DECODE_ROWS, load_moe_rows
from trtkv.platform.hardware import GPU

# (moe_tp/ep) -> latency ms at 1,024 / 2,048 / 4,096 tokens, read from the parquet named above
ROWS = {"1/1": (2.522, 3.029, 4.28), "2/1": (1.298, 1.548, 2.162), "1/8": (0.4798, 0.6385, 1.012)}
# gpt-oss-20b's balanced rows at 1, 2, 4 and 8 tokens (4, 8, 16 and 32 of its 32 experts read), ms
DECODE_ROWS = (0.09147, 0.156, 0.2971, 0.5772)


def gpt_oss(tp: int = 1, ep: int = 1, model: str = "gpt_oss_120b", gpu: str = "H200-141GB") -> moe_step.MoEShape:
    recipe = sc.recipe_for(f"tests/data/configs/{model}", gpu, "sglang", "bf16", 2048, 256, [1], 2064, tp=tp)
    shape = model_shape(resolve_architecture(recipe), recipe, ep, 1)
    assert shape.moe is not None
    return shape.moe


def test_rows_file_keeps_the_tables_own_rows() -> None:
    doc = load_moe_rows()
    assert doc["aiconfigurator_core"] == speed.load_data()["aiconfigurator_core"]
    assert doc["routing"] == "power_law_1.01" and doc["tokens"][:3] == [1024, 2048, 4096]
    table = doc["tables"]["h200_sxm/sglang"]
    assert table["version"] == "0.5.14"
    for par, want in ROWS.items():
        assert table["w4a16_mxfp4"]["2880/2880/4/128"][par][:3] == pytest.approx(want, rel=1e-3)


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1)])
def test_a_prefill_reads_its_shapes_own_row(tp: int, ep: int) -> None:
    k = speed.kernels_for(GPU.H200_141GB, "sglang")
    moe = gpt_oss(tp, ep)
    low, mid, high = ROWS[f"{moe.moe_tp}/{moe.ep}"]
    assert moe_tables.shape_row_ms(k, moe, moe.table, 2048) == pytest.approx(mid, rel=1e-3)
    # linear between rows; below the first row, that row's time per token
    assert moe_tables.shape_row_ms(k, moe, moe.table, 3072) == pytest.approx((mid + high) / 2, rel=1e-3)
    assert moe_tables.shape_row_ms(k, moe, moe.table, 512) == pytest.approx(low / 2, rel=1e-3)
    gemm, _ = moe_step.routed_ms(k, moe, 2048)
    assert gemm == pytest.approx(moe.layers * mid, rel=1e-3)  # compute-bound: the row, its fixed cost inside
    # a shape the table lacks (another expert count): no row, the per-dtype fit prices it
    other = moe_step.MoEShape(moe.layers, 64, moe.top_k, moe.expert_params, moe.bytes_per_param, moe.dtype, moe.hidden,
                              table=moe.table)
    assert moe_tables.shape_row_ms(k, other, other.table, 2048) is None


def test_a_gpu_without_tables_gets_no_rows_and_its_own_peaks() -> None:
    h100, h20 = speed.kernels_for(GPU.H100_80GB, "sglang"), speed.kernels_for(GPU.H20, "sglang")
    assert h100.moe_rows and not h20.moe_rows  # H100's rows are H100's times
    # H20's dense peaks (148 BF16, 296 FP8 TFLOPS) reach the fused MoE op's fits too, at H100's efficiencies
    assert h20.moe_tables["fp8_block"]["peak_flops"] == pytest.approx(296e12)
    assert h20.moe_tables["bfloat16"]["peak_flops"] == pytest.approx(148e12)
    assert h20.moe_tables["fp8_block"]["compute_efficiency"] == h100.moe_tables["fp8_block"]["compute_efficiency"]


def test_a_decode_step_reads_its_shapes_own_balanced_rows() -> None:
    doc = load_moe_rows(MOE_DECODE_ROWS)
    assert doc["aiconfigurator_core"] == speed.load_data()["aiconfigurator_core"]
    assert doc["routing"] == "balanced" and doc["tokens"][:4] == [1, 2, 4, 8]
    table = doc["tables"]["h100_sxm/sglang"]
    assert table["version"] == "0.5.14"
    assert table["w4a16_mxfp4"]["2880/2880/4/32"]["1/1"] == pytest.approx(DECODE_ROWS, rel=1e-3)
    k = speed.kernels_for(GPU.H100_80GB, "sglang")
    moe = gpt_oss(model="gpt_oss_20b", gpu="H100-80GB")
    # linear in the experts read between rows (4, 8, 16, 32), the first row's time below them
    assert moe_tables.decode_row_ms(k, moe, moe.table, 24) == pytest.approx(sum(DECODE_ROWS[2:]) / 2, rel=1e-3)
    assert moe_tables.decode_row_ms(k, moe, moe.table, 2) == pytest.approx(DECODE_ROWS[0], rel=1e-3)
    # 16 tokens under uniform routing read 32 (1 - (28/32)^16) = 28.2 experts a layer: the rows there, not the fit's
    seen = moe_step.distinct_experts(32, 4, 16)
    want = DECODE_ROWS[2] + (seen - 16) / 16 * (DECODE_ROWS[3] - DECODE_ROWS[2])
    gemm, _ = moe_step.routed_ms(k, moe, 16)
    assert gemm == pytest.approx(moe.layers * want, rel=1e-3)
    assert 0.50 < want < 0.52  # the fit over every MXFP4 shape of the table gave 0.269
    # a GPU without tables of its own reads none of H100's rows
    h20 = speed.kernels_for(GPU.H20, "sglang")
    assert not h20.moe_decode_rows and moe_tables.decode_row_ms(h20, moe, moe.table, 24) is None
