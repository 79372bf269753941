"""Notes `plan --estimate` adds beside its rows: what trtkv's own rows rest on for a GPU without
aiconfigurator kernel tables (whose efficiencies, whose peaks, where extrapolated), and what the
other activation an engine runs MXFP4 experts with would price."""

from __future__ import annotations

from collections.abc import Callable

from trtkv.plan.estimate_model import EstimateRow
from trtkv.plan.model import Architecture
from trtkv.plan.moe_step import MXFP4_TABLE, moe_shape
from trtkv.plan.speed import AIC_SYSTEM, kernels_for, load_data
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import Recipe, moe_activation_choices


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


def activation_note(
    recipe: Recipe,
    arch: Architecture,
    rows: list[EstimateRow],
    price: Callable[[Recipe], list[EstimateRow]],
) -> list[str]:
    """What the other activation the engine runs MXFP4 experts with here would price
    (build.moe_activations): `price` gives trtkv's rows for a recipe, `rows` the recipe's own."""
    par = recipe.parallelism
    moe = moe_shape(arch, recipe, par.attention_tp, par.ep, par.attention_dp)
    other = [a for a in moe_activation_choices(recipe) if moe and a != moe.activations]
    if moe is None or moe.table != MXFP4_TABLE or not other:
        return []
    build = recipe.build.model_copy(update={"moe_activations": other[0]})
    alt = price(recipe.model_copy(update={"build": build}))
    change = [
        f"{o.itl_ms:.2f} -> {a.itl_ms:.2f} ms ({a.itl_ms / o.itl_ms - 1:+.0%}) at concurrency "
        f"{o.concurrency}"
        for o, a in zip(rows, alt, strict=True)
        if o.itl_ms and a.itl_ms != o.itl_ms
    ]
    if not change:
        return []  # the GPU's tables have no rows for the other activation
    return [
        f"build.moe_activations {other[0]} (trtkv's model on both sides, {rows[0].format} KV): "
        f"ITL {', '.join(change)}; its accuracy is not measured here."
    ]
