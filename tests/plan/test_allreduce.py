"""The TP all-reduce at each engine's own kernel (trtkv.plan.allreduce, issue #49): aiconfigurator-core 0.12.0 prices a
TP layer's two all-reduces from the engine's custom_allreduce_perf.parquet (CUDA-graph rows), not NCCL's; trtkv's fit
of those tables (tools/aic_kernels.py) must give back their rows. The rows quoted here are read from
systems/data/h100_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet (vLLM_custom_graph, bfloat16) and
comm/trtllm/1.3.0rc20 (TRTLLM): on main's model (NCCL's 4-GPU floor, 9.75 us) the vLLM TP2 one-token all-reduce came
out 2.3x the row."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trtkv.plan.allreduce import allreduce_ms
from trtkv.plan.speed import kernels_for
from trtkv.platform.hardware import GPU

# (engine, GPUs, message elements, latency ms of the table's row)
ROWS = [
    ("vllm", 2, 2048, 0.004300),
    ("vllm", 2, 32768, 0.004515),
    ("vllm", 4, 2048, 0.004703),
    ("trtllm", 2, 2048, 0.002868),
    ("trtllm", 4, 4096, 0.003141),
]


@pytest.mark.parametrize(("engine", "gpus", "elements", "row_ms"), ROWS)
def test_the_engines_allreduce_gives_back_its_table_rows(engine: str, gpus: int, elements: int, row_ms: float) -> None:
    k = kernels_for(GPU.H100_80GB, engine)
    assert allreduce_ms(k, gpus, elements * 2) == pytest.approx(row_ms, rel=0.10)


def test_a_tp_size_without_rows_takes_the_next_larger_count_and_no_table_nccls() -> None:
    k = kernels_for(GPU.H100_80GB, "vllm")
    assert allreduce_ms(k, 1, 4096) == 0.0
    assert allreduce_ms(k, 3, 4096) > allreduce_ms(k, 2, 4096)  # TP3: the 4-GPU fit
    assert allreduce_ms(k, 16, 4096) >= allreduce_ms(k, 8, 4096)  # past the table: its largest count
    nccl = replace(k, ar_by_gpus={})
    assert allreduce_ms(nccl, 2, 4096) == pytest.approx(k.ar_floor_ms, rel=0.01)
