"""Which GPUs of trtkv's table (trtkv.platform.hardware) have a capability (FP8, FP4, NVFP4 KV, an
architecture, a compute capability), one GPU per compute capability standing for the rest, and the
table as docs/plan.md shows it."""

from __future__ import annotations

from trtkv.platform.hardware import GPU, GPU_SPECS


def gpus_where(test: str) -> list[str]:
    """GPUs with a capability: `fp8`, `fp4` or `nvfp4_kv` (the table's properties), in table
    order."""
    return [
        g.value
        for g, s in GPU_SPECS.items()
        if getattr(s, {"fp8": "has_fp8", "fp4": "has_fp4"}.get(test, test))
    ]


# One GPU per compute capability, the datacenter part where there is one: every rule trtkv applies
# to a GPU reads its compute capability only (not its memory), so these answer "which GPUs serve X"
# for the whole table.
ONE_PER_SM: tuple[GPU, ...] = (
    GPU.A100_80GB,
    GPU.A10,
    GPU.L40S,
    GPU.H100_80GB,
    GPU.B200,
    GPU.B300,
    GPU.RTX_PRO_6000,
    GPU.GB10,
)


def same_sm(gpu: GPU) -> list[str]:
    """Every GPU of the table with `gpu`'s compute capability (`H100-80GB` -> H100-80GB, H100-PCIE,
    ...)."""
    return [g.value for g, s in GPU_SPECS.items() if s.sm == GPU_SPECS[gpu].sm]


def table_markdown() -> str:
    """docs/plan.md's GPU table (scripts/update_docs.py keeps it in step with GPU_SPECS)."""
    rows = [
        "| `hardware.gpu` | nvidia-smi name | `nvidia.com/gpu.product` | SM | arch | memory GiB | "
        "from | GB/s | FP8 | FP4 | NVFP4 KV | sources: memory; bandwidth |",
        "|" + "---|" * 12,
    ]
    yes = {True: "yes", False: "no"}
    for gpu, s in GPU_SPECS.items():
        rows.append(
            f"| `{gpu.value}` | {' / '.join(s.smi_names)} | `{s.gfd_product}` | "
            f"{s.compute_capability} | {s.arch} | {s.memory_gib:g} | {s.memory_basis} | "
            f"{s.hbm_bandwidth_gbps:g} | {yes[s.has_fp8]} | {yes[s.has_fp4]} | {yes[s.nvfp4_kv]} | "
            f"{s.memory_source}; {s.bandwidth_source} |"
        )
    return "\n".join(rows)
