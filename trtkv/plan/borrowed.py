"""What trtkv's own speed rows rest on for a GPU without aiconfigurator kernel tables: whose
efficiencies (trtkv.plan.speed.reference_system), whose peaks, and where they are extrapolated."""

from __future__ import annotations

from trtkv.plan.estimate_model import EstimateRow
from trtkv.plan.speed import AIC_SYSTEM, kernels_for, load_data
from trtkv.platform.hardware import GPU, GPU_SPECS


def gpu_notes(gpu: GPU, engine: str, rows: list[EstimateRow]) -> list[str]:
    """What trtkv's own rows on a GPU without aiconfigurator tables rest on (whose efficiencies,
    whose peaks)."""
    if gpu in AIC_SYSTEM or not any(r.source.startswith("trtkv model") for r in rows):
        return []
    k = kernels_for(gpu, engine)
    own, lender = GPU_SPECS[gpu].hbm_bandwidth_gbps, load_data()["systems"][k.system]["gpu"]
    beyond = (
        f" Those efficiencies were measured at {float(lender['mem_bw']) / 1e9:g} GB/s; at "
        f"{gpu.value}'s higher bandwidth the model assumes its kernels reach the same share, "
        "which published runs of a GPU so placed do not bear out (H20 on H100's tables: "
        "docs/plan.md, 'H20 at batch 1'): its decode figures are likely optimistic."
        if own * 1e9 > float(lender["mem_bw"])
        else ""
    )
    return [
        f"{gpu.value} has no aiconfigurator kernel tables: trtkv's model borrows {k.system}'s "
        f"{k.versions} efficiencies (the tables of its compute capability, else of its "
        f"architecture) at {gpu.value}'s own bandwidth ({own:g} GB/s); {k.peaks}.{beyond}"
    ]
