"""The tensor-parallel all-reduce of one step (issue #49): each engine's own all-reduce kernel as
aiconfigurator-core 0.12.0 measured it, per GPU count.

The engines do not all-reduce through NCCL at the sizes a decode step sends: vLLM and SGLang run
their custom all-reduce (captured in CUDA graphs), TensorRT-LLM its own kernel; aiconfigurator
prices a TP layer's two all-reduces (attention out, MoE or MLP out) from those tables
(comm/<engine>/<version>/custom_allreduce_perf.parquet). tools/aic_kernels.py fits each table per
GPU count into `custom_allreduce.by_gpus` of trtkv/data/speed_efficiencies.json: t = floor + 2 (n -
1) / n x bytes / (intra-node bandwidth x bus efficiency). A TP size the table has no rows for takes
the next larger count it has (else its largest); an engine without a table, the system's NCCL
all-reduce over 4 GPUs (Kernels.ar_floor_ms, ar_bus_eff).
"""

from __future__ import annotations

from typing import Any, Protocol


class LinkKernels(Protocol):
    """What the all-reduce reads of speed.Kernels (typed by shape: speed imports this module)."""

    @property
    def link_bw(self) -> float: ...
    @property
    def ar_floor_ms(self) -> float: ...
    @property
    def ar_bus_eff(self) -> float: ...
    @property
    def ar_by_gpus(self) -> dict[int, tuple[float, float]]: ...


def by_gpus(tables: dict[str, Any]) -> dict[int, tuple[float, float]]:
    """An engine's fitted all-reduce, GPU count -> (floor ms, bus efficiency), from its entry in
    speed_efficiencies.json (empty: no table)."""
    fits = (tables.get("custom_allreduce") or {}).get("by_gpus") or {}
    return {
        int(n): (float(f["floor_ms"]), min(1.0, float(f["bus_efficiency"])))
        for n, f in fits.items()
    }


def allreduce_ms(k: LinkKernels, gpus: int, message_bytes: float) -> float:
    """One all-reduce of `message_bytes` over `gpus` GPUs."""
    if gpus <= 1:
        return 0.0
    floor, eff = k.ar_floor_ms, k.ar_bus_eff
    if k.ar_by_gpus:
        larger = [n for n in k.ar_by_gpus if n >= gpus]
        floor, eff = k.ar_by_gpus[min(larger) if larger else max(k.ar_by_gpus)]
    return floor + 2 * (gpus - 1) / gpus * message_bytes / (k.link_bw * eff) * 1e3
