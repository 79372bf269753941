"""ModelOpt's unified HF checkpoint (what `trtkv calibrate` writes to checkpoint/hf/, and what
TensorRT-LLM's LLM API and vLLM load) as a float32 LlamaForCausalLM or Gemma3ForCausalLM
(trtkv.runtime.gemma3) plus its KV-cache scales.

Read as TensorRT-LLM's PyTorch backend reads it: `hf_quant_config.json` says the weight and KV
formats (`quantization.quant_algo`, `quantization.kv_cache_quant_algo`); an FP8 weight is `weight`
(float8_e4m3fn) times its per-tensor `weight_scale`; the KV cache scales are
`self_attn.k_proj.k_scale` and `self_attn.v_proj.v_scale` (amax/448). TensorRT-LLM's PyTorch backend
runs an FP8 KV cache with scale 1.0 and reads these scales only for an NVFP4 one
(`_torch/modules/linear.py` @00bbf71e, `attention_backend/trtllm.py` @00bede19); vLLM applies them,
K and V apart. `input_scale` (FP8 activations) is not applied: GEMMs run in float32.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.core.errors import StageError
from trtkv.core.files import json_object

if TYPE_CHECKING:
    import torch

QUANT_CONFIG = "hf_quant_config.json"
# hf_quant_config.json kv_cache_quant_algo values the reference LLM API engine runs (its KV format:
# trtkv.runtime.engine, FP8 as fp8_scale1, TensorRT-LLM's unit scale)
KV_ALGOS = ("FP8", None)
WEIGHT_ALGOS = ("FP8", None)
KV_SCALE_NAMES = ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale")
IGNORED_SUFFIXES = (".input_scale",)  # FP8 activation scales: the runtime computes in float32
# applied to their weight, or read as KV scales
SCALE_SUFFIXES = (".weight_scale", ".k_scale", ".v_scale")


def _read_json(path: Path) -> dict[str, Any]:
    return json_object(path, "`trtkv calibrate RECIPE --force` writes the HF export")


def quant_config(hf_dir: Path) -> tuple[str | None, str | None]:
    """(quant_algo, kv_cache_quant_algo) of an HF export; (None, None) without hf_quant_config.json
    (unquantized)."""
    path = hf_dir / QUANT_CONFIG
    if not path.is_file():
        return None, None
    quant = _read_json(path).get("quantization")
    if not isinstance(quant, dict):
        raise StageError(
            f'{path}: no "quantization" object (ModelOpt writes quant_algo and '
            "kv_cache_quant_algo)."
        )
    return quant.get("quant_algo"), quant.get("kv_cache_quant_algo")


def load_tensors(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise StageError(f"{hf_dir}: no *.safetensors. Next: `trtkv calibrate RECIPE --force`.")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        tensors.update(load_file(str(path)))
    return tensors


ARCHITECTURES = ("LlamaForCausalLM", "Gemma3ForCausalLM")


def hf_model_config(hf_dir: Path) -> Any:
    """The model's float32 config from config.json: a LlamaConfig or a Gemma3TextConfig (the
    architectures the reference engine runs); refuses the others."""
    from transformers import LlamaConfig

    from trtkv.runtime import gemma3

    raw = _read_json(hf_dir / "config.json")
    archs = raw.get("architectures") or ["LlamaForCausalLM"]
    if archs == [gemma3.ARCHITECTURE]:
        return gemma3.gemma3_config(raw, hf_dir / "config.json")
    if archs != ["LlamaForCausalLM"]:
        raise StageError(
            f"{hf_dir / 'config.json'}: architectures {archs}; the reference engine runs "
            f"{' or '.join(ARCHITECTURES)}. Next: serve this model with another backend (vllm, "
            "llmapi)."
        )
    data = {
        k: v for k, v in raw.items() if k not in ("quantization_config", "torch_dtype", "dtype")
    }
    return LlamaConfig(**data, dtype="float32")


def build_hf_model(config: Any, state_dict: dict[str, torch.Tensor]) -> Any:
    """The float32 transformers model of `config` holding exactly `state_dict`."""
    from trtkv.runtime import gemma3
    from trtkv.runtime.checkpoint import build_model

    return (
        gemma3.build_gemma3(config, state_dict)
        if gemma3.is_gemma3(config)
        else build_model(config, state_dict)
    )


def dequantized_state_dict(
    tensors: dict[str, torch.Tensor], weight_algo: str | None, where: Path
) -> dict[str, torch.Tensor]:
    """float32 weights named as LlamaForCausalLM names them; FP8 weights times their
    weight_scale."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(IGNORED_SUFFIXES + SCALE_SUFFIXES):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            if weight_algo != "FP8":
                raise StageError(
                    f"{where}: {name} is float8_e4m3fn but hf_quant_config.json quant_algo is "
                    f"{weight_algo!r}."
                )
            scale = tensors.get(name[: -len("weight")] + "weight_scale")
            if scale is None:
                raise StageError(f"{where}: {name} is FP8 without its weight_scale.")
            out[name] = tensor.float() * scale.float().reshape(-1, *([1] * (tensor.dim() - 1)))
        elif tensor.dtype in (torch.int8, torch.uint8):
            raise StageError(
                f"{where}: {name} is {tensor.dtype}; the reference engine dequantizes FP8 weights "
                "only."
            )
        else:
            out[name] = tensor.float()
    return out


def kv_scales(
    tensors: dict[str, torch.Tensor], num_layers: int, where: Path
) -> tuple[list[float], list[float]]:
    """Per-layer (k_scale, v_scale) of the export; a StageError naming the first missing or unusable
    one."""
    k, v = [], []
    for i in range(num_layers):
        pair = []
        for suffix in KV_SCALE_NAMES:
            name = f"model.layers.{i}.{suffix}"
            if name not in tensors:
                raise StageError(
                    f"{where}: the KV cache is quantized but {name} is missing. Next: `trtkv "
                    "calibrate RECIPE --force`."
                )
            value = float(tensors[name].float().reshape(-1)[0])
            if not (math.isfinite(value) and value > 0):
                raise StageError(f"{where}: {name} = {value}; a KV scale must be finite and > 0.")
            pair.append(value)
        k.append(pair[0])
        v.append(pair[1])
    return k, v
