"""ModelOpt: the quantization config, the calibration pass, the per-layer scales it measured, and
the TensorRT-LLM and HF exports (with the RoPE keys ModelOpt 0.47 drops under transformers 5)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.calibrate.common import (
    ATTN_HEAD_NOTE,
    NO_KV_NOTE,
    LayerScales,
    engine_format_note,
    kv_quantizer_entries,
    modelopt_kv_preset,
)
from trtkv.calibrate.describe import quantizes
from trtkv.core.errors import StageError
from trtkv.kvcache import scales as kv_scales
from trtkv.recipe import KVCacheQuant, Recipe, WeightQuant, layout
from trtkv.recipe.enums import kv_algo

if TYPE_CHECKING:
    import torch


# ---------------------------------------------------------------------------------------------
# ModelOpt


def build_quant_cfg(recipe: Recipe) -> tuple[dict[str, Any] | None, list[str]]:
    """The ModelOpt config (a list of quant_cfg entries) for the recipe's weights and KV cache;
    None: nothing to do."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.utils.core_utils import update_quant_cfg_with_kv_cache_quant

    kv_note = engine_format_note(recipe.quantization.kv_cache) or NO_KV_NOTE
    if not quantizes(recipe):
        return None, [
            "weights none and no calibrated KV cache: mtq.quantize was not called; the checkpoints "
            f"are a plain export in {recipe.model.dtype.value}.",
            kv_note,
        ]
    notes = []
    base: dict[str, Any]
    if recipe.quantization.weights is WeightQuant.FP8:
        base = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    else:
        base = {"quant_cfg": None, "algorithm": "max"}
    # none or an engine format: FP8_DEFAULT_CFG has no KV entries
    if not kv_algo(recipe.quantization.kv_cache):
        return json.loads(json.dumps(base, default=list)), [kv_note]
    kv = recipe.quantization.kv_cache
    preset = modelopt_kv_preset(kv)
    if preset:
        from modelopt.recipe.presets import KV_QUANT_CFG_CHOICES

        # ModelOpt's presets; nvfp4: E2M1 (num_bits [2, 1]) with dynamic E4M3 scales per 16 (its
        # forward needs CUDA)
        kv_entries = copy.deepcopy(KV_QUANT_CFG_CHOICES[preset]["quant_cfg"])
        if kv is KVCacheQuant.FP8_ATTN_HEAD:
            notes.append(ATTN_HEAD_NOTE)
    else:
        kv_entries = copy.deepcopy(kv_quantizer_entries(kv))
        notes.append(
            f"{kv.value.upper()} KV: ModelOpt 0.47 has no {kv.value.upper()} KV preset; used the "
            f"entry {kv_entries[0]} (per tensor)."
        )
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the whole config
        cfg = update_quant_cfg_with_kv_cache_quant(base, kv_entries)
    return json.loads(json.dumps(cfg, default=list)), notes


def quantize(
    model: Any, quant_cfg: dict[str, Any] | None, batches: list[torch.Tensor], recipe: Recipe
) -> list[LayerScales]:
    """mtq.quantize with a forward loop over the batches (progress bar); per-layer K/V amax and
    channel ranges.

    kv_cache none: the weights are calibrated (if any) and no KV scales are returned.
    """
    if quant_cfg is None:
        return []
    import modelopt.torch.quantization as mtq
    import torch
    from tqdm import tqdm

    kv = recipe.quantization.kv_cache

    device = next(model.parameters()).device
    channel_amax: dict[str, torch.Tensor] = {}

    def forward_loop(m: Any) -> None:
        hooks = [
            mod.register_forward_hook(_channel_hook(name, channel_amax))
            for name, mod in m.named_modules()
            if kv_algo(kv) and name.endswith(("k_bmm_quantizer", "v_bmm_quantizer"))
        ]
        try:
            with torch.no_grad():
                for batch in tqdm(batches, desc=f"calibrate {recipe.name}", unit="batch"):
                    # no [B, T, vocab] logits
                    m(input_ids=batch.to(device), use_cache=False, logits_to_keep=1)
        finally:
            for hook in hooks:
                hook.remove()

    mtq.quantize(model, quant_cfg, forward_loop)
    return _layer_scales(model, channel_amax, kv) if kv_algo(kv) else []


def _channel_hook(name: str, store: dict[str, Any]) -> Callable[..., None]:
    """Record the per-(head, channel) |max| of the tensor entering a KV quantizer ([batch, heads,
    seq, head_dim])."""

    def hook(_module: Any, inputs: tuple[Any, ...], _output: Any) -> None:
        x = inputs[0].detach().float().abs()
        amax = (
            x.amax(dim=(0, 2)) if x.dim() == 4 else x.reshape(-1, x.shape[-1]).amax(dim=0)[None]
        ).cpu()
        store[name] = amax if name not in store else store[name].maximum(amax)

    return hook


def _layer_scales(model: Any, channel_amax: dict[str, Any], kv: KVCacheQuant) -> list[LayerScales]:
    """Per-layer amax from the calibrated k/v_bmm_quantizers, with both scale conventions."""
    found: dict[int, dict[str, Any]] = {}
    for name, module in model.named_modules():
        match = re.search(r"layers\.(\d+)\..*([kv])_bmm_quantizer$", name)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = (module, name)
    if not found:
        raise StageError(
            "ModelOpt inserted no k/v_bmm_quantizer: this model's attention is not supported by "
            "its KV cache quantization. Next: use a model of "
            "trtkv.calibrate.common.CALIBRATED_ARCHITECTURES."
        )
    algo = kv_algo(kv)
    if algo is None:  # callers pass calibrated formats only
        raise StageError(f"KV cache {kv.value} has no calibrated scales to read.")
    out = []
    for index in sorted(found):
        parts = found[index]
        k_amax, v_amax = (_amax(parts[s][0], parts[s][1]) for s in ("k", "v"))
        scales = kv_scales.layer_scales(k_amax, v_amax, algo)
        k_channels = channel_amax.get(parts["k"][1])
        out.append(
            LayerScales(
                layer=index,
                k_amax=k_amax,
                v_amax=v_amax,
                **scales,
                k_channel_amax=_to_list(k_channels),
                v_channel_amax=_to_list(channel_amax.get(parts["v"][1])),
                head_dim=int(k_channels.shape[-1]) if k_channels is not None else 1,
            )
        )
    return out


def _amax(quantizer: Any, name: str) -> float:
    amax = getattr(quantizer, "amax", None)
    if amax is None or amax.numel() != 1:
        raise StageError(
            f"ModelOpt quantizer {name} has no per-tensor amax after calibration ({amax!r}). Next: "
            "check that the calibration forward reaches every attention layer."
        )
    value = kv_scales.f32(float(amax.float().item()))
    if not value > 0:
        raise StageError(
            f"ModelOpt quantizer {name}: amax = {value}; calibration saw no non-zero K/V."
        )
    return value


def _to_list(tensor: Any) -> list[float]:
    return [] if tensor is None else [float(v) for v in tensor.flatten().tolist()]


@contextlib.contextmanager
def _captured_warnings(notes: list[str], what: str) -> Any:
    """Turn the exporters' warnings into report notes (they name real limitations, e.g. tensorrt_llm
    absent)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    seen = set()
    for w in caught:
        text = _explain(" ".join(str(w.message).split()))
        if text and text not in seen:
            seen.add(text)
            notes.append(f"{what}: {text[:400]}")


def _explain(text: str) -> str:
    """Known exporter messages, said in terms of what happened (empty: noise)."""
    if "copy construct from a tensor" in text:
        return ""
    if "No module named 'tensorrt_llm'" in text:
        return (
            "tensorrt_llm is not installed, so ModelOpt wrote config.json by its manual path (no "
            "tensorrt_llm PretrainedConfig round trip); trtkv's validation checked the fields the "
            "build reads."
        )
    if "Enable lm_head quantization" in text:
        return (
            f"ModelOpt says '{text}' -- lm_head stays unquantized here: it is in "
            "quantization.exclude_modules and stored in the model dtype."
        )
    return text


def export_trtllm(model: Any, out: Path, recipe: Recipe) -> list[str]:
    """export_tensorrt_llm_checkpoint with the recipe's tp/pp (N >= 1: N = 0 crashes with
    ZeroDivisionError)."""
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    notes: list[str] = []
    # ModelOpt reads it (None -> TypeError)
    if getattr(model.config, "architectures", None) is None:
        model.config.architectures = [type(model).__name__]
    dtype = getattr(torch, recipe.model.dtype.value)
    with _captured_warnings(notes, "export_tensorrt_llm_checkpoint"):
        export_tensorrt_llm_checkpoint(
            model,
            recipe.model.architecture,
            dtype,
            str(out),
            inference_tensor_parallel=recipe.build.tp_size,
            inference_pipeline_parallel=recipe.build.pp_size,
        )
    _sort_exclude_modules(out / "config.json")
    return notes


def write_rope(ckpt: Path, source: dict[str, Any]) -> None:
    """Write the model's RoPE where TensorRT-LLM 1.x and transformers 4.x read it (ModelOpt 0.47
    under transformers 5 writes neither: rotary_base/rotary_scaling in config.json,
    rope_theta/rope_scaling in hf/). Gemma 3 (one RoPE per layer type) gets transformers 4.x's
    rope_theta / rope_local_base_freq / rope_scaling."""
    from trtkv.checkpoints import rope
    from trtkv.checkpoints.hf_export import HF_ARCHITECTURES, gemma3_legacy_rope

    config_path = ckpt / "config.json"
    if config_path.is_file():  # absent for an HF-export-only architecture
        config_path.write_text(
            json.dumps(
                rope.complete_trtllm_config(json.loads(config_path.read_text()), source), indent=4
            )
            + "\n"
        )
    hf_path = ckpt / layout.HF / "config.json"
    if hf_path.is_file():
        hf = json.loads(hf_path.read_text())
        if hf.get("architectures") == [HF_ARCHITECTURES["gemma3"]]:
            hf = {**hf, **gemma3_legacy_rope(source)}
        else:
            hf = rope.complete_hf_config(hf, source)
        hf_path.write_text(json.dumps(hf, indent=2) + "\n")


def _sort_exclude_modules(config_path: Path) -> None:
    """ModelOpt writes exclude_modules from a set; sort it so config.json is reproducible."""
    config = json.loads(config_path.read_text())
    quant = config.get("quantization") or {}
    if isinstance(quant.get("exclude_modules"), list):
        quant["exclude_modules"] = sorted(quant["exclude_modules"])
        config_path.write_text(json.dumps(config, indent=4) + "\n")


def export_hf(model: Any, tokenizer: Any, out: Path, recipe: Recipe) -> list[str]:
    """export_hf_checkpoint into hf/ for FP8 or no KV (ModelOpt 0.47 asserts on INT8 KV: skipped
    with a note)."""
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    from trtkv.checkpoints.tokenizer_files import save_tokenizer

    if recipe.quantization.kv_cache is KVCacheQuant.INT8:
        return [
            "hf/ not written: ModelOpt 0.47's export_hf_checkpoint asserts on an INT8 KV cache "
            "('Invalid KV cache quantization format'), and vLLM / TensorRT-LLM's PyTorch backend "
            "have no INT8 KV cache either. The TensorRT-LLM checkpoint (config.json + "
            "rank*.safetensors) carries the INT8 scales."
        ]
    notes: list[str] = []
    hf_dir = out / layout.HF
    dtype = getattr(torch, recipe.model.dtype.value)
    with _captured_warnings(notes, "export_hf_checkpoint"):
        export_hf_checkpoint(model, dtype=dtype, export_dir=str(hf_dir))
    _cast_hf_weights(hf_dir, recipe.model.dtype.value)
    # loadable by transformers 4.57 (TensorRT-LLM's LLM API) and 5.x alike
    save_tokenizer(tokenizer, hf_dir)
    return notes


def _cast_hf_weights(hf_dir: Path, dtype_name: str) -> None:
    """The exporter keeps unquantized float32 tensors of a float32 model; store them in the recipe
    dtype."""
    import torch
    from safetensors.torch import load_file, save_file

    dtype = getattr(torch, dtype_name)
    for path in sorted(hf_dir.glob("*.safetensors")):
        tensors = load_file(str(path))
        changed = False
        for name, tensor in tensors.items():
            if (
                tensor.dtype == torch.float32
                and not name.endswith("scale")
                and tensor.dtype != dtype
            ):
                tensors[name] = tensor.to(dtype)
                changed = True
        if changed:
            save_file(tensors, str(path), metadata={"format": "pt"})
    config_path = hf_dir / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        config["dtype"] = dtype_name
        config_path.write_text(json.dumps(config, indent=2) + "\n")


def check_exported_hf_scales(layers: list[LayerScales], hf_summary: dict[str, Any]) -> None:
    """The HF export's per-layer k_scale / v_scale must be the ones trtkv.kvcache.scales computed
    from the amaxes."""
    import math

    for kind in ("k", "v"):
        exported = hf_summary.get(f"{kind}_scales") or []
        if len(exported) != len(layers):
            raise StageError(
                f"hf/ holds {len(exported)} {kind}_scale tensors for {len(layers)} calibrated "
                "layers."
            )
        for layer, value in zip(layers, exported, strict=True):
            want = getattr(layer, f"{kind}_scale")
            if value is None or not math.isclose(want, value, rel_tol=1e-5):
                raise StageError(
                    f"layer {layer.layer}: hf/ {kind}_scale {value} != {want} computed from "
                    f"{kind}_amax {getattr(layer, f'{kind}_amax')} (kv_scales.json)."
                )


def check_exported_factors(layers: list[LayerScales], exported: list[float]) -> None:
    """The rank files' kv_cache_scaling_factor must be the one computed from the quantizers'
    amax."""
    import math

    if len(exported) != len(layers):
        raise StageError(
            f"export holds {len(exported)} kv_cache_scaling_factor tensors for {len(layers)} "
            "layers."
        )
    for layer, value in zip(layers, exported, strict=True):
        if not math.isclose(layer.kv_cache_scaling_factor, value, rel_tol=1e-5):
            raise StageError(
                f"layer {layer.layer}: exported kv_cache_scaling_factor {value} != "
                f"{layer.kv_cache_scaling_factor} computed from amax (k {layer.k_amax}, v "
                f"{layer.v_amax})."
            )
