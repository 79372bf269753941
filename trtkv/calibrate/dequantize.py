"""A quantized checkpoint's model in memory with its weights dequantized as stored, for KV-only
calibration (trtkv.calibrate.stored_kv): the engine runs these weights, so the K and V it caches
come from them, not from the 16-bit model they were made from.

Dequantized by ModelOpt's own quantized tensors (modelopt.torch.quantization.qtensor, ModelOpt
0.47), the code ModelOpt's export packs them with:
- FP8 E4M3 (`weight` F8_E4M3): FP8QTensor.dequantize with `weight_scale` (one float32 per tensor,
  ModelOpt FP8; [rows, 1] per output channel, compressed-tensors FP8 / FP8_PER_CHANNEL_PER_TOKEN)
  or, per 2-D block, `weight_scale` / `weight_scale_inv` with block_sizes (ModelOpt FP8_PB_WO,
  quant_method fp8 weight_block_size, compressed-tensors strategy block).
- NVFP4 (`weight` U8, two E2M1 per byte, `weight_scale` F8_E4M3 per 16, `weight_scale_2` F32):
  NVFP4QTensor.dequantize with scale, double_scale and block_sizes {-1: 16}.
Anything else packed (INT4 AWQ, GPTQ, MXFP4, compressed-tensors int4) is refused by
trtkv.calibrate.stored_kv before this runs; a packed tensor that reaches here anyway is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError

# the quantizers' own companions of a weight, dropped once it is dequantized (k/v scales: the
# checkpoint carries none where calibrate runs; activation scales: the engine's, not the model's)
SCALE_SUFFIXES = (
    ".weight_scale",
    ".weight_scale_2",
    ".weight_scale_inv",
    ".input_scale",
    ".weight_zero_point",
    ".k_scale",
    ".v_scale",
)


def load_dequantized(model_dir: Path, block: tuple[int, int] | None) -> tuple[Any, Any]:
    """The model (float32 on the CPU, the checkpoint's config without its quantization_config) and
    tokenizer, every quantized weight dequantized; `block` is the FP8 block shape where the
    checkpoint stores FP8 in 2-D blocks."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(str(model_dir))
    for part in (config, getattr(config, "text_config", None)):
        if part is not None and hasattr(part, "quantization_config"):
            delattr(part, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = dequantized_state_dict(model_dir, block)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [n for n in missing if n not in tied]
    if missing or unexpected:
        raise StageError(
            f"{model_dir}: the dequantized weights do not fit the model its config.json "
            f"describes (missing {missing[:5]}, unexpected {unexpected[:5]}). Next: check that "
            "the folder holds the whole checkpoint (every shard of model.safetensors.index.json)."
        )
    model.tie_weights()
    return model.eval(), AutoTokenizer.from_pretrained(str(model_dir))


def dequantized_state_dict(model_dir: Path, block: tuple[int, int] | None) -> dict[str, Any]:
    """Every tensor of the folder's safetensors files in float32, quantized weights dequantized
    (ModelOpt's FP8QTensor / NVFP4QTensor) and their scales dropped."""
    from safetensors.torch import load_file

    raw: dict[str, Any] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        raw.update(load_file(str(path)))
    out: dict[str, Any] = {}
    for name, tensor in raw.items():
        if name.endswith(SCALE_SUFFIXES):
            continue
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and _is_packed(tensor):
            out[name] = _dequantize(name, tensor, raw, prefix, block)
        elif tensor.is_floating_point():
            out[name] = tensor.float()
        else:
            raise StageError(
                f"{model_dir}: {name} is stored as {tensor.dtype} with no dequantizer trtkv "
                "uses (FP8 and NVFP4 weights only). Next: calibrate the 16-bit model, or serve "
                "this checkpoint with kv_cache fp8_cast (scale 1.0) or none."
            )
    return out


def _is_packed(tensor: Any) -> bool:
    import torch

    return tensor.dtype in (torch.float8_e4m3fn, torch.uint8)


def _dequantize(
    name: str, data: Any, raw: dict[str, Any], prefix: str, block: tuple[int, int] | None
) -> Any:
    import torch
    from modelopt.torch.quantization.qtensor import FP8QTensor, NVFP4QTensor

    scale = raw.get(f"{prefix}.weight_scale")
    if scale is None:
        scale = raw.get(f"{prefix}.weight_scale_inv")  # DeepSeek / Qwen FP8 blocks: a multiplier
    if scale is None:
        raise StageError(f"{name}: a quantized weight without its weight_scale")
    if data.dtype == torch.float8_e4m3fn:
        q = FP8QTensor(data.shape, torch.float32, data)
        if scale.numel() == 1 or tuple(scale.shape) == (data.shape[0], 1):
            return q.dequantize(dtype=torch.float32, scale=scale.float())
        if block is None or scale.dim() != 2:
            raise StageError(
                f"{name}: FP8 scale of shape {tuple(scale.shape)} for a {tuple(data.shape)} "
                "weight, and the config names no block size"
            )
        return q.dequantize(
            dtype=torch.float32, scale=scale.float(), block_sizes={0: block[0], 1: block[1]}
        )
    double = raw.get(f"{prefix}.weight_scale_2")
    if scale.dtype != torch.float8_e4m3fn or double is None:
        raise StageError(
            f"{name}: uint8 weights without NVFP4's F8_E4M3 weight_scale and weight_scale_2 "
            "(INT4 / MXFP4 packing is not dequantized here)"
        )
    cols = data.shape[-1] * 2
    per = cols // scale.shape[-1]
    q4 = NVFP4QTensor(torch.Size([*data.shape[:-1], cols]), torch.float32, data)
    return q4.dequantize(
        dtype=torch.float32, scale=scale, double_scale=double.float(), block_sizes={-1: per}
    )
