"""Write a compressed-tensors checkpoint with the compressed-tensors library's own writer, run in vLLM's side venv
(which ships compressed-tensors; llm-compressor is not installed in any venv here and pins transformers outside
.venv's range). Imports no trtkv.

usage: python ct_writer.py SOURCE_DIR OUT_DIR PRESET LAYERS [GROUP]
  PRESET: a compressed-tensors preset scheme (FP8_DYNAMIC, W4A16, ...), applied to every Linear but lm_head, with
  an FP8 per-tensor kv_cache_scheme; GROUP replaces a group scheme's group_size (W4A16's 128 does not divide
  SmolLM2's 576 columns).

As llm-compressor's oneshot does for these presets without a dataset: apply_quantization_config, the weights'
scales and zero points from their min/max (compressed_tensors calculate_qparams: per channel, or per group of
group_size), the KV scales from the k_proj / v_proj outputs' absolute maximum over one forward (before RoPE: the
fixture is for recognising and pricing the format, not for accuracy), then ModelCompressor.compress_model,
save_pretrained and update_config.
"""

from __future__ import annotations

import sys

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, apply_quantization_config
from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXT = "The quick brown fox jumps over the lazy dog. A checkpoint arrives quantized, and is priced as stored."
FP8_MAX = 448.0


def _weight_qparams(module: torch.nn.Module) -> None:
    args = module.quantization_scheme.weights
    w = module.weight.detach().float()
    if args.strategy == "group":
        grouped = w.reshape(w.shape[0], -1, args.group_size)
        lo, hi = grouped.amin(dim=-1), grouped.amax(dim=-1)
    else:  # channel
        lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    scale, zero = calculate_qparams(lo, hi, args)
    module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype).reshape(module.weight_scale.shape))
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))


def main(source: str, out: str, preset: str, layers: int, group: int | None) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(source, num_hidden_layers=layers, dtype=torch.bfloat16).eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    amax: dict[str, float] = {}
    hooks = [m.register_forward_hook(lambda _m, _i, o, n=n: amax.__setitem__(n, max(amax.get(n, 0.0),
                                                                                   float(o.abs().max()))))
             for n, m in model.named_modules() if n.endswith(("k_proj", "v_proj"))]
    with torch.no_grad():
        model(**tokenizer(TEXT, return_tensors="pt"))
    for h in hooks:
        h.remove()
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if group and scheme.weights is not None and scheme.weights.group_size:
        scheme.weights.group_size = group
    config = QuantizationConfig(config_groups={"group_0": scheme},
                                ignore=["lm_head"],
                                kv_cache_scheme=QuantizationArgs(num_bits=8, type="float", strategy="tensor",
                                                                 dynamic=False, symmetric=True))
    apply_quantization_config(model, config)
    for name, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is not None and scheme.weights is not None and hasattr(module, "weight_scale"):
            _weight_qparams(module)
        for kind in "kv":
            if hasattr(module, f"{kind}_scale") and f"{name}.{kind}_proj" in amax:
                getattr(module, f"{kind}_scale").data.fill_(amax[f"{name}.{kind}_proj"] / FP8_MAX)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else None)
