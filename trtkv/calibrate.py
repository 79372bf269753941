"""The calibrate stage: ModelOpt calibration of KV scales (and FP8 weights), exported for TensorRT-LLM and HF.

recipe -> engines/<recipe>/checkpoint/:
  config.json + rank{r}.safetensors   TensorRT-LLM checkpoint (export_tensorrt_llm_checkpoint, tp/pp from the recipe)
  hf/                                 HF checkpoint (export_hf_checkpoint; FP8 or no KV: ModelOpt 0.47 asserts on INT8)
  tokenizer/                          the model's tokenizer, for downstream stages
  hf_config.json                      the model's HF config.json (build reads it: an INT8-KV checkpoint has no hf/)
  kv_scales.json                      per layer k/v amax, TensorRT-LLM factor, vLLM k_scale/v_scale (byte-stable);
                                      kv_cache none: kv_cache_quant_algo null and no layers
  calibration_report.md               per-layer table, warnings, K/V statistics
  manifest.json                       stage contract (trtkv.stage.run_stage)
Heavy imports (torch, transformers, modelopt) happen inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import re
import resource
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv import layout
from trtkv.errors import StageError
from trtkv.kvcache import scales as kv_scales
from trtkv.kvcache.formats import FP8_MAX
from trtkv.kvcache.scales import CONVENTION
from trtkv.layout import checkpoint_dir
from trtkv.recipe import KVCacheQuant, ModelDtype, Recipe, WeightQuant

if TYPE_CHECKING:
    import torch

STAGE = "calibrate"
CHECKPOINT = layout.CHECKPOINT
# The quantized KV caches only (kv_cache none maps to None in layout.KV_ALGO and is absent here).
KV_ALGO = {kv: algo for kv, algo in layout.KV_ALGO.items() if algo is not None}
# The KV quantizer entries, as data. FP8 is ModelOpt's preset KV_QUANT_CFG_CHOICES["fp8"] (read from ModelOpt at run
# time; this copy is only for --dry-run); INT8 has no preset in 0.47: one per-tensor 8-bit integer entry.
KV_ENTRIES: dict[KVCacheQuant, list[dict[str, Any]]] = {
    KVCacheQuant.FP8: [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": [4, 3], "axis": None}}],
    KVCacheQuant.INT8: [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}}],
}
FP8_BASE_MEANING = ("every Linear's weight_quantizer and input_quantizer FP8 E4M3 (num_bits [4, 3]) per-tensor; "
                    "lm_head, routers, embeddings disabled")
NO_KV_NOTE = ("KV cache unquantized (quantization.kv_cache none): config.json quantization.kv_cache_quant_algo is "
              "null, the rank files hold no kv_cache_scaling_factor, kv_scales.json lists no layers; the cache keeps "
              "K/V in the model dtype.")
DWARF_RATIO = 4.0  # a layer whose amax exceeds 4x the median layer amax

# (model, tokenizer) for a recipe; injectable so tests run the same path on a tiny model.
ModelLoader = Callable[[Recipe], tuple[Any, Any]]


@dataclass
class LayerScales:
    layer: int
    k_amax: float
    v_amax: float
    kv_cache_scaling_factor: float
    k_scale: float
    v_scale: float
    k_channel_amax: list[float] = field(default_factory=list)  # per (kv head, channel), flattened
    v_channel_amax: list[float] = field(default_factory=list)
    head_dim: int = 1

    def as_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "k_amax": self.k_amax, "v_amax": self.v_amax,
                "kv_cache_scaling_factor": self.kv_cache_scaling_factor, "k_scale": self.k_scale,
                "v_scale": self.v_scale}


# ---------------------------------------------------------------------------------------------
# What would run (no heavy imports): used by --dry-run here and by `trtkv build --dry-run`.


def supported_problems(recipe: Recipe) -> list[str]:
    """Recipe settings this stage cannot calibrate, each with its next step."""
    q, b, m = recipe.quantization, recipe.build, recipe.model
    out = []
    if q.weights not in (WeightQuant.FP8, WeightQuant.NONE):
        out.append(f"quantization.weights = {q.weights.value!r}: trtkv calibrate exports fp8 or none weights. Next: "
                   f"use one of those, or ModelOpt's examples/llm_ptq/hf_ptq.py for {q.weights.value}.")
    if m.dtype is ModelDtype.FLOAT32:
        out.append("model.dtype = 'float32': ModelOpt's TensorRT-LLM export writes float16 or bfloat16 only (it "
                   "falls back to float16). Next: use bfloat16 (or float16).")
    if m.architecture.lower() != "llama":
        out.append(f"model.architecture = {m.architecture!r}: only llama-family exports are tested here.")
    if m.num_kv_heads is not None and m.num_kv_heads % b.tp_size:
        out.append(f"build.tp_size = {b.tp_size} does not divide model.num_kv_heads = {m.num_kv_heads} "
                   f"(ModelOpt's TP split needs it).")
    if m.num_layers is not None and m.num_layers % b.pp_size:
        out.append(f"build.pp_size = {b.pp_size} does not divide model.num_layers = {m.num_layers} "
                   f"(ModelOpt's PP split asserts on it).")
    return out


def quantizes(recipe: Recipe) -> bool:
    """Whether ModelOpt quantizes anything (weights none + kv_cache none: a plain export in the model dtype)."""
    q = recipe.quantization
    return q.weights is WeightQuant.FP8 or q.kv_cache in KV_ALGO


def modelopt_config_spec(recipe: Recipe) -> dict[str, Any]:
    """The ModelOpt quantization config as data: the base config's name plus the KV entries appended to it."""
    base = "mtq.FP8_DEFAULT_CFG" if recipe.quantization.weights is WeightQuant.FP8 else None
    kv = recipe.quantization.kv_cache
    if not quantizes(recipe):
        return {"base": None, "base_meaning": "nothing to quantize (weights none, kv_cache none): mtq.quantize is "
                "not called; plain export in the model dtype", "kv_entries": [], "algorithm": None}
    if kv is KVCacheQuant.NONE:
        return {"base": base, "base_meaning": FP8_BASE_MEANING, "kv_entries": [],
                "kv_source": "none: kv_cache none, no KV entries; the base's {'quantizer_name': '*', 'enable': False} "
                             "leaves the k/v_bmm_quantizers disabled (KV cache unquantized)",
                "algorithm": "max"}
    return {
        "base": base,
        "base_meaning": (FP8_BASE_MEANING if base else
                         "no weight quantization: quant_cfg starts with {'quantizer_name': '*', 'enable': False}"),
        "kv_entries": KV_ENTRIES.get(kv, []),
        "kv_source": ("modelopt.recipe.presets.KV_QUANT_CFG_CHOICES['fp8']" if kv is KVCacheQuant.FP8 else
                      "hand entry (no INT8 KV preset in ModelOpt 0.47)"),
        "combined_with": "modelopt.torch.quantization.utils.update_quant_cfg_with_kv_cache_quant",
        "algorithm": "max",
    }


def export_targets(recipe: Recipe) -> dict[str, str]:
    """What the stage writes, file by file."""
    b, kv = recipe.build, recipe.quantization.kv_cache
    ranks = ", ".join(f"rank{r}.safetensors" for r in range(recipe.world_size))
    if kv is KVCacheQuant.FP8:
        hf = "hf/ (export_hf_checkpoint: hf_quant_config.json, k_scale/v_scale = amax/448)"
    elif kv is KVCacheQuant.NONE:
        hf = ("hf/ (export_hf_checkpoint: hf_quant_config.json quant_algo FP8, kv_cache_quant_algo null, no "
              "k_scale/v_scale)" if recipe.quantization.weights is WeightQuant.FP8 else
              f"hf/ (export_hf_checkpoint: a plain HF checkpoint in {recipe.model.dtype.value}, no hf_quant_config.json)")
    else:
        hf = ("hf/: not written (ModelOpt 0.47's export_hf_checkpoint asserts on INT8 KV: 'Invalid KV cache "
              "quantization format'); the report says so")
    kv_scales = ("kv_scales.json (per layer k/v amax, kv_cache_scaling_factor, k_scale, v_scale)" if kv in KV_ALGO else
                 'kv_scales.json ({"kv_cache_quant_algo": null, "num_layers": N, "layers": []})')
    return {
        "tensorrt_llm": (f"config.json + {ranks} (export_tensorrt_llm_checkpoint(model, {recipe.model.architecture!r}, "
                         f"torch.{recipe.model.dtype.value}, dir, inference_tensor_parallel={b.tp_size}, "
                         f"inference_pipeline_parallel={b.pp_size}))"),
        "hf": hf,
        "tokenizer": "tokenizer/ (the model's tokenizer files)",
        "kv_scales": kv_scales,
        "report": ("calibration_report.md (per-layer table, warnings, K/V statistics)" if kv in KV_ALGO else
                   "calibration_report.md (says the KV cache is unquantized; K/V statistics)"),
    }


def describe_calibration(recipe: Recipe) -> list[str]:
    """Lines saying what `trtkv calibrate` would do for this recipe (no heavy imports, writes nothing)."""
    c, q = recipe.calibration, recipe.quantization
    out = checkpoint_dir(recipe)
    batches = -(-c.num_samples // c.batch_size)
    kv_algo = KV_ALGO.get(q.kv_cache)
    what = ("ModelOpt mtq.quantize (max calibration)" if quantizes(recipe) else
            "no quantization (weights none, kv_cache none), plain export")
    lines = [
        f"calibrate {recipe.name}: {what} on {recipe.model.source}",
        f"  data: {c.dataset}: {c.num_samples} samples x {c.seq_len} tokens = {c.num_samples * c.seq_len} tokens, "
        f"batch {c.batch_size} ({batches} forward passes), seed {c.seed}",
        f"  ModelOpt config: {json.dumps(modelopt_config_spec(recipe))}",
    ]
    if kv_algo:
        factor = "max(k_amax, v_amax)/127" if kv_algo == "INT8" else "max(k_amax, v_amax)/448, clamped to >= 1.0"
        lines.append(f"  KV cache: {kv_algo} -> checkpoint config.json quantization.kv_cache_quant_algo = {kv_algo}, "
                     f"per-layer transformer.layers.{{i}}.attention.kv_cache_scaling_factor = {factor} "
                     f"(trtllm-build has no --{q.kv_cache.value}_kv_cache flag)")
    else:
        lines.append("  KV cache: unquantized -> checkpoint config.json quantization.kv_cache_quant_algo = null, no "
                     "kv_cache_scaling_factor tensors (K/V statistics are still collected for the report)")
    lines.append(f"  output: {out}/")
    lines += [f"    {name}: {what}" for name, what in export_targets(recipe).items()]
    lines += [f"  cannot run: {p}" for p in supported_problems(recipe)]
    return lines


# ---------------------------------------------------------------------------------------------
# The stage


def calibrate(recipe: Recipe, *, force: bool = False, loader: ModelLoader | None = None,
              log: Callable[[str], None] = print) -> Any:
    """Run the calibrate stage (skipped when up to date); returns trtkv.stage.StageResult."""
    from trtkv.stage import VERSIONED_TOOLS, run_stage

    problems = supported_problems(recipe)
    if problems:
        raise StageError(f"calibrate {recipe.name}: cannot run:\n" + "\n".join(f"  - {p}" for p in problems))
    files = _dataset_files(recipe)
    extra_key = {"build": {"tp_size": recipe.build.tp_size, "pp_size": recipe.build.pp_size},
                 "dataset_sha256": _files_hash(files)}

    def work(tmp: Path) -> dict[str, Any]:
        # Only when the checkpoint is not up to date: resolving may convert the packaged model or try a hub.
        model_dir = None
        chosen = loader
        if chosen is None:
            model_dir = _resolve_model(recipe)  # fails fast (hub id offline, missing package) before heavy work
            _check_memory(recipe)
            chosen = default_loader
        return _calibrate_into(tmp, recipe, chosen, model_dir, log)

    return run_stage(STAGE, recipe, checkpoint_dir(recipe), work, force=force, extra_key=extra_key, log=log,
                     sections=("model", "quantization", "calibration"), versioned_tools=VERSIONED_TOOLS)


def _dataset_files(recipe: Recipe) -> list[Path]:
    from trtkv.data import resolve_files

    return resolve_files(recipe.calibration.dataset)


def _files_hash(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _resolve_model(recipe: Recipe) -> Path:
    from trtkv.model import resolve_model_dir

    try:
        return resolve_model_dir(recipe)
    except StageError as exc:
        raise StageError(f"calibrate {recipe.name}: the model cannot be resolved, nothing was calibrated.\n{exc}\n"
                         f"(`trtkv calibrate {recipe.name} --dry-run` shows what would run.)") from exc


def _check_memory(recipe: Recipe) -> None:
    """Refuse early when the fp32 model cannot fit in this machine's memory (CPU calibration)."""
    params = recipe.model.num_parameters
    available = _mem_available_bytes()
    if params is None or available is None:
        return
    need = params * 4 * 1.3  # fp32 weights + fake-quant activations
    if need > available and not _cuda_available():
        raise StageError(f"calibrate {recipe.name}: model.num_parameters = {params:.3g} needs about "
                         f"{need / 2**30:.0f} GiB in fp32 on the CPU, only {available / 2**30:.0f} GiB is available "
                         f"and no CUDA device is visible. Next: calibrate on a GPU machine (hardware.gpu = "
                         f"{recipe.hardware.gpu.value}), then copy engines/{recipe.name}/checkpoint/ here.")


def _mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def default_loader(recipe: Recipe) -> tuple[Any, Any]:
    """The recipe's HF model (fp32 on CPU for speed, recipe dtype on GPU) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = _resolve_model(recipe)
    if torch.cuda.is_available():
        dtype = getattr(torch, recipe.model.dtype.value)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, device_map="auto")
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return model.eval(), tokenizer


def _calibrate_into(tmp: Path, recipe: Recipe, loader: ModelLoader, model_dir: Path | None,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """The stage's work: load, sample, calibrate, export, write scales and report, validate."""
    import torch

    from trtkv.checkpoint import validate_trtllm_checkpoint

    start = time.time()
    torch.manual_seed(recipe.calibration.seed)
    model, tokenizer = loader(recipe)
    load_s = time.time() - start
    _save_hf_config(model, model_dir, tmp / layout.HF_CONFIG)
    batches = calibration_batches(tokenizer, recipe)
    stats_md, stats_note = _kv_statistics(model, batches)
    t0, cpu0 = time.time(), time.process_time()
    quant_cfg, kv_notes = build_quant_cfg(recipe)
    layers = _quantize(model, quant_cfg, batches, recipe)
    num_layers = int(model.config.num_hidden_layers)
    calib_s, calib_cpu_s = time.time() - t0, time.process_time() - cpu0
    t0 = time.time()
    notes = kv_notes + _export_trtllm(model, tmp, recipe)
    notes += _export_hf(model, tokenizer, tmp, recipe)
    _write_rope(tmp, json.loads((tmp / layout.HF_CONFIG).read_text()))
    tokenizer.save_pretrained(str(tmp / "tokenizer"))
    export_s = time.time() - t0
    write_kv_scales(tmp / "kv_scales.json", layers, recipe, num_layers)
    summary = validate_trtllm_checkpoint(tmp, recipe)
    _check_exported_factors(layers, summary["kv_cache_scaling_factors"])
    timing = {"load_s": round(load_s, 2), "calibration_s": round(calib_s, 2),
              "calibration_cpu_s": round(calib_cpu_s, 2), "export_s": round(export_s, 2),
              "total_s": round(time.time() - start, 2), "peak_rss_mib": _peak_rss_mib(),
              "tokens": recipe.calibration.num_samples * recipe.calibration.seq_len, "batches": len(batches)}
    report = render_report(recipe, layers, timing, notes, stats_md, stats_note, model_dir)
    (tmp / "calibration_report.md").write_text(report)
    kv = f"{len(layers)} KV scale layers" if layers else f"{num_layers} layers, KV cache unquantized"
    log(f"calibrate: {kv}, {timing['tokens']} tokens in {calib_s:.1f} s (peak RSS "
        f"{timing['peak_rss_mib']:.0f} MiB); checkpoint validated ({len(summary['ranks'])} rank file(s))")
    return {"calibration": timing, "modelopt_quant_cfg": quant_cfg, "notes": notes, "validation": summary,
            "model_dir": str(model_dir) if model_dir else None}


def _save_hf_config(model: Any, model_dir: Path | None, target: Path) -> None:
    """The model's config.json (the source folder's file when known, else the loaded model's config)."""
    source = model_dir / "config.json" if model_dir is not None else None
    if source is not None and source.is_file():
        target.write_bytes(source.read_bytes())
    else:
        target.write_text(model.config.to_json_string(use_diff=False))


def _peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


# ---------------------------------------------------------------------------------------------
# Data


def calibration_batches(tokenizer: Any, recipe: Recipe) -> list[torch.Tensor]:
    """num_samples x seq_len tokens of the recipe's calibration text (trtkv.kvcache.scales.calibration_batches: the
    batches `trtkv probe` builds for the same recipe too)."""
    from trtkv.data import load_texts

    c = recipe.calibration
    return kv_scales.calibration_batches(tokenizer, load_texts(c.dataset), c.num_samples, c.seq_len, c.batch_size,
                                         c.seed, where=f"calibration.dataset {c.dataset!r}")


def _kv_statistics(model: Any, batches: list[torch.Tensor]) -> tuple[str | None, str]:
    """K/V statistics from trtkv.kvcache.stats (the probe's module) on the unquantized model."""
    import torch

    from trtkv.kvcache.stats import collect_kv_stats

    with torch.no_grad():
        stats = collect_kv_stats(model, batches)
    return str(stats.to_markdown()), ("From trtkv.kvcache.stats.collect_kv_stats(model, batches) on the unquantized "
                                      "model (same calibration batches).")


# ---------------------------------------------------------------------------------------------
# ModelOpt


def build_quant_cfg(recipe: Recipe) -> tuple[dict[str, Any] | None, list[str]]:
    """The ModelOpt config (a list of quant_cfg entries) for the recipe's weights and KV cache; None: nothing to do."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.utils.core_utils import update_quant_cfg_with_kv_cache_quant

    if not quantizes(recipe):
        return None, ["weights none and kv_cache none: mtq.quantize was not called; the checkpoints are a plain "
                      f"export in {recipe.model.dtype.value}.", NO_KV_NOTE]
    notes = []
    base: dict[str, Any]
    if recipe.quantization.weights is WeightQuant.FP8:
        base = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    else:
        base = {"quant_cfg": None, "algorithm": "max"}
    if recipe.quantization.kv_cache is KVCacheQuant.NONE:  # FP8_DEFAULT_CFG has no KV entries: k/v_bmm stay disabled
        return json.loads(json.dumps(base, default=list)), [NO_KV_NOTE]
    if recipe.quantization.kv_cache is KVCacheQuant.FP8:
        from modelopt.recipe.presets import KV_QUANT_CFG_CHOICES

        kv_entries = copy.deepcopy(KV_QUANT_CFG_CHOICES["fp8"]["quant_cfg"])
    else:
        kv_entries = copy.deepcopy(KV_ENTRIES[KVCacheQuant.INT8])
        notes.append("INT8 KV: ModelOpt 0.47 has no INT8 KV preset; used the entry "
                     "{'quantizer_name': '*[kv]_bmm_quantizer', 'cfg': {'num_bits': 8, 'axis': None}} (per tensor).")
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the whole config
        cfg = update_quant_cfg_with_kv_cache_quant(base, kv_entries)
    return json.loads(json.dumps(cfg, default=list)), notes


def _quantize(model: Any, quant_cfg: dict[str, Any] | None, batches: list[torch.Tensor],
              recipe: Recipe) -> list[LayerScales]:
    """mtq.quantize with a forward loop over the batches (progress bar); per-layer K/V amax and channel ranges.

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
        hooks = [mod.register_forward_hook(_channel_hook(name, channel_amax)) for name, mod in m.named_modules()
                 if kv in KV_ALGO and name.endswith(("k_bmm_quantizer", "v_bmm_quantizer"))]
        try:
            with torch.no_grad():
                for batch in tqdm(batches, desc=f"calibrate {recipe.name}", unit="batch"):
                    m(input_ids=batch.to(device), use_cache=False)
        finally:
            for hook in hooks:
                hook.remove()

    mtq.quantize(model, quant_cfg, forward_loop)
    return _layer_scales(model, channel_amax, kv) if kv in KV_ALGO else []


def _channel_hook(name: str, store: dict[str, Any]) -> Callable[..., None]:
    """Record the per-(head, channel) |max| of the tensor entering a KV quantizer ([batch, heads, seq, head_dim])."""

    def hook(_module: Any, inputs: tuple[Any, ...], _output: Any) -> None:
        x = inputs[0].detach().float().abs()
        amax = (x.amax(dim=(0, 2)) if x.dim() == 4 else x.reshape(-1, x.shape[-1]).amax(dim=0)[None]).cpu()
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
        raise StageError("ModelOpt inserted no k/v_bmm_quantizer: this model's attention is not supported by its KV "
                         "cache quantization. Next: use a llama-family model.")
    algo = KV_ALGO[kv]
    out = []
    for index in sorted(found):
        parts = found[index]
        k_amax, v_amax = (_amax(parts[s][0], parts[s][1]) for s in ("k", "v"))
        scales = kv_scales.layer_scales(k_amax, v_amax, algo)
        k_channels = channel_amax.get(parts["k"][1])
        out.append(LayerScales(index, k_amax, v_amax, scales["kv_cache_scaling_factor"], scales["k_scale"],
                               scales["v_scale"], _to_list(k_channels), _to_list(channel_amax.get(parts["v"][1])),
                               int(k_channels.shape[-1]) if k_channels is not None else 1))
    return out


def _amax(quantizer: Any, name: str) -> float:
    amax = getattr(quantizer, "amax", None)
    if amax is None or amax.numel() != 1:
        raise StageError(f"ModelOpt quantizer {name} has no per-tensor amax after calibration ({amax!r}). Next: check "
                         f"that the calibration forward reaches every attention layer.")
    value = kv_scales.f32(float(amax.float().item()))
    if not value > 0:
        raise StageError(f"ModelOpt quantizer {name}: amax = {value}; calibration saw no non-zero K/V.")
    return value


def _to_list(tensor: Any) -> list[float]:
    return [] if tensor is None else [float(v) for v in tensor.flatten().tolist()]


@contextlib.contextmanager
def _captured_warnings(notes: list[str], what: str) -> Any:
    """Turn the exporters' warnings into report notes (they name real limitations, e.g. tensorrt_llm absent)."""
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
        return ("tensorrt_llm is not installed, so ModelOpt wrote config.json by its manual path (no "
                "tensorrt_llm PretrainedConfig round trip); trtkv's validation checked the fields the build reads.")
    if "Enable lm_head quantization" in text:
        return (f"ModelOpt says '{text}' -- lm_head stays unquantized here: it is in quantization.exclude_modules "
                f"and stored in the model dtype.")
    return text


def _export_trtllm(model: Any, out: Path, recipe: Recipe) -> list[str]:
    """export_tensorrt_llm_checkpoint with the recipe's tp/pp (N >= 1: N = 0 crashes with ZeroDivisionError)."""
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    notes: list[str] = []
    if getattr(model.config, "architectures", None) is None:  # ModelOpt reads it (None -> TypeError)
        model.config.architectures = [type(model).__name__]
    dtype = getattr(torch, recipe.model.dtype.value)
    with _captured_warnings(notes, "export_tensorrt_llm_checkpoint"):
        export_tensorrt_llm_checkpoint(model, recipe.model.architecture, dtype, str(out),
                                       inference_tensor_parallel=recipe.build.tp_size,
                                       inference_pipeline_parallel=recipe.build.pp_size)
    _sort_exclude_modules(out / "config.json")
    return notes


def _write_rope(ckpt: Path, source: dict[str, Any]) -> None:
    """Write the model's RoPE where TensorRT-LLM 1.x and transformers 4.x read it (ModelOpt 0.47 under
    transformers 5 writes neither: rotary_base/rotary_scaling in config.json, rope_theta/rope_scaling in hf/)."""
    from trtkv import rope

    config_path = ckpt / "config.json"
    config_path.write_text(json.dumps(rope.complete_trtllm_config(json.loads(config_path.read_text()), source),
                                      indent=4) + "\n")
    hf_path = ckpt / "hf" / "config.json"
    if hf_path.is_file():
        hf_path.write_text(json.dumps(rope.complete_hf_config(json.loads(hf_path.read_text()), source), indent=2) + "\n")


def _sort_exclude_modules(config_path: Path) -> None:
    """ModelOpt writes exclude_modules from a set; sort it so config.json is reproducible."""
    config = json.loads(config_path.read_text())
    quant = config.get("quantization") or {}
    if isinstance(quant.get("exclude_modules"), list):
        quant["exclude_modules"] = sorted(quant["exclude_modules"])
        config_path.write_text(json.dumps(config, indent=4) + "\n")


def _export_hf(model: Any, tokenizer: Any, out: Path, recipe: Recipe) -> list[str]:
    """export_hf_checkpoint into hf/ for FP8 or no KV (ModelOpt 0.47 asserts on INT8 KV: skipped with a note)."""
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    if recipe.quantization.kv_cache is KVCacheQuant.INT8:
        return ["hf/ not written: ModelOpt 0.47's export_hf_checkpoint asserts on an INT8 KV cache ('Invalid KV cache "
                "quantization format'), and vLLM / TensorRT-LLM's PyTorch backend have no INT8 KV cache either. The "
                "TensorRT-LLM checkpoint (config.json + rank*.safetensors) carries the INT8 scales."]
    notes: list[str] = []
    hf_dir = out / "hf"
    dtype = getattr(torch, recipe.model.dtype.value)
    with _captured_warnings(notes, "export_hf_checkpoint"):
        export_hf_checkpoint(model, dtype=dtype, export_dir=str(hf_dir))
    _cast_hf_weights(hf_dir, recipe.model.dtype.value)
    tokenizer.save_pretrained(str(hf_dir))
    return notes


def _cast_hf_weights(hf_dir: Path, dtype_name: str) -> None:
    """The exporter keeps unquantized float32 tensors of a float32 model; store them in the recipe dtype."""
    import torch
    from safetensors.torch import load_file, save_file

    dtype = getattr(torch, dtype_name)
    for path in sorted(hf_dir.glob("*.safetensors")):
        tensors = load_file(str(path))
        changed = False
        for name, tensor in tensors.items():
            if tensor.dtype == torch.float32 and not name.endswith("scale") and tensor.dtype != dtype:
                tensors[name] = tensor.to(dtype)
                changed = True
        if changed:
            save_file(tensors, str(path), metadata={"format": "pt"})
    config_path = hf_dir / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        config["dtype"] = dtype_name
        config_path.write_text(json.dumps(config, indent=2) + "\n")


def _check_exported_factors(layers: list[LayerScales], exported: list[float]) -> None:
    """The rank files' kv_cache_scaling_factor must be the one computed from the quantizers' amax."""
    import math

    if len(exported) != len(layers):
        raise StageError(f"export holds {len(exported)} kv_cache_scaling_factor tensors for {len(layers)} layers.")
    for layer, value in zip(layers, exported, strict=True):
        if not math.isclose(layer.kv_cache_scaling_factor, value, rel_tol=1e-5):
            raise StageError(f"layer {layer.layer}: exported kv_cache_scaling_factor {value} != "
                             f"{layer.kv_cache_scaling_factor} computed from amax (k {layer.k_amax}, v {layer.v_amax}).")


# ---------------------------------------------------------------------------------------------
# kv_scales.json and the report


def write_kv_scales(path: Path, layers: list[LayerScales], recipe: Recipe, num_layers: int | None = None) -> None:
    """kv_scales.json (contract 1, trtkv.kvcache.scales): byte-identical for the same seed and inputs.

    kv_cache none: {"kv_cache_quant_algo": null, "num_layers": N, "convention": ..., "layers": []}.
    """
    doc = kv_scales.kv_scales_document(KV_ALGO.get(recipe.quantization.kv_cache), [ls.k_amax for ls in layers],
                                       [ls.v_amax for ls in layers], num_layers=num_layers)
    kv_scales.write_kv_scales(path, doc)


def find_warnings(layers: list[LayerScales], kv: KVCacheQuant) -> list[str]:
    """Warnings worth acting on: clamped FP8 factors, layers whose amax dwarfs the rest, outlier channels."""
    out: list[str] = []
    if not layers:  # kv_cache none: no scales to warn about
        return out
    if kv is KVCacheQuant.FP8:
        clamped = [ls.layer for ls in layers if max(ls.k_amax, ls.v_amax) / FP8_MAX < 1.0]
        if clamped:
            out.append(f"FP8: {len(clamped)}/{len(layers)} layers' kv_cache_scaling_factor clamped to 1.0 by "
                       f"ModelOpt's exporter (amax < 448): TensorRT-LLM's FP8 KV cache runs those layers with scale "
                       f"1.0, while hf/ (vLLM) keeps k_scale/v_scale = amax/448. Layers: {_ranges(clamped)}.")
    for kind in ("k", "v"):
        amaxes = [getattr(ls, f"{kind}_amax") for ls in layers]
        median = statistics.median(amaxes)
        big = [(ls.layer, a) for ls, a in zip(layers, amaxes, strict=True) if median > 0 and a > DWARF_RATIO * median]
        if big:
            listed = ", ".join(f"{i} ({a:.3g})" for i, a in big)
            out.append(f"{kind.upper()} amax of layer(s) {listed} exceeds {DWARF_RATIO:g}x the median layer amax "
                       f"({median:.3g}): one per-tensor scale spends its range on these layers' outliers.")
    if kv is KVCacheQuant.INT8:
        lopsided = [ls for ls in layers if min(ls.k_amax, ls.v_amax) * DWARF_RATIO < max(ls.k_amax, ls.v_amax)]
        if lopsided:
            worst = max(lopsided, key=lambda ls: max(ls.k_amax, ls.v_amax) / min(ls.k_amax, ls.v_amax))
            ratio = max(worst.k_amax, worst.v_amax) / min(worst.k_amax, worst.v_amax)
            levels = int(min(worst.k_amax, worst.v_amax) / worst.kv_cache_scaling_factor)
            out.append(f"INT8: in {len(lopsided)}/{len(layers)} layers K and V ranges differ by more than "
                       f"{DWARF_RATIO:g}x, but TensorRT-LLM shares one kv_cache_scaling_factor: worst is layer "
                       f"{worst.layer} ({ratio:.1f}x), whose smaller tensor uses only ~{levels} of 127 levels.")
    out += _outlier_warnings(layers)
    return out


def _outlier_channels(values: list[float]) -> list[tuple[int, float]]:
    from trtkv.kvcache.stats import outlier_channels  # the one outlier rule (K/V statistics use it too)

    return [(i, values[i]) for i in outlier_channels(values)]


def _outlier_warnings(layers: list[LayerScales]) -> list[str]:
    from trtkv.kvcache.stats import OUTLIER_FACTOR

    out = []
    for kind in ("k", "v"):
        hits = [(ls, _outlier_channels(getattr(ls, f"{kind}_channel_amax"))) for ls in layers]
        hits = [(ls, chans) for ls, chans in hits if chans]
        if hits:
            total = sum(len(c) for _, c in hits)
            worst, chans = max(hits, key=lambda h: max(v for _, v in h[1]))
            ch, val = max(chans, key=lambda c: c[1])
            out.append(f"{kind.upper()} outlier channels (amax > {OUTLIER_FACTOR:g}x the layer's median channel amax): "
                       f"{total} in {len(hits)} layers; largest: layer {worst.layer} head {ch // worst.head_dim} "
                       f"channel {ch % worst.head_dim}, amax {val:.3g}. A per-tensor {kind.upper()} scale spends its "
                       f"range on these channels and leaves fewer levels for the others.")
    return out


def _ranges(items: list[int]) -> str:
    """[0,1,2,5] -> '0-2, 5'."""
    out, start = [], None
    for i, value in enumerate(items):
        if start is None:
            start = value
        if i + 1 == len(items) or items[i + 1] != value + 1:
            out.append(f"{start}" if start == value else f"{start}-{value}")
            start = None
    return ", ".join(out)


def render_report(recipe: Recipe, layers: list[LayerScales], timing: dict[str, Any], notes: list[str],
                  stats_md: str | None, stats_note: str, model_dir: Path | None) -> str:
    """calibration_report.md: summary, warnings, notes, the per-layer table, K/V statistics."""
    c, q = recipe.calibration, recipe.quantization
    kv = KV_ALGO.get(q.kv_cache)
    kv_text = (f"{kv} (`quantization.kv_cache_quant_algo = {kv}`)" if kv else
               "unquantized (`quantization.kv_cache: none` -> `quantization.kv_cache_quant_algo = null`, no "
               "kv_cache_scaling_factor tensors)")
    lines = [f"# Calibration report: {recipe.name}", "",
             f"- model: `{recipe.model.source}`" + (f" (`{model_dir}`)" if model_dir else ""),
             f"- weights: {q.weights.value}; KV cache: {kv_text}",
             f"- data: `{c.dataset}`, {c.num_samples} x {c.seq_len} tokens, batch {c.batch_size}, seed {c.seed}",
             f"- time: load {timing['load_s']} s, calibration {timing['calibration_s']} s "
             f"({timing['calibration_cpu_s']} s CPU), export "
             f"{timing['export_s']} s; peak RSS {timing['peak_rss_mib']:.0f} MiB",
             f"- TensorRT-LLM mapping: tp {recipe.build.tp_size} x pp {recipe.build.pp_size}", "",
             "## Warnings", ""]
    found = find_warnings(layers, q.kv_cache)
    lines += [f"- {w}" for w in found] or ["- none"]
    lines += ["", "## Export notes", ""] + ([f"- {n}" for n in notes] or ["- none"])
    lines += ["", "## Per-layer scales", ""]
    if not layers:
        lines += ["None: the KV cache is unquantized (`quantization.kv_cache: none`), so no K/V scales were "
                  "calibrated or exported. The K/V statistics below show the ranges an FP8 or INT8 KV cache would "
                  "have to cover."]
    else:
        lines += _scale_table(layers)
    lines += ["", "## K/V statistics", "", stats_note, ""]
    if stats_md:
        lines.append(stats_md)
    return "\n".join(lines).rstrip() + "\n"


def _scale_table(layers: list[LayerScales]) -> list[str]:
    """The per-layer scales as a markdown table, after the convention."""
    lines = [CONVENTION, "",
             "| layer | K amax | V amax | TRT-LLM kv_cache_scaling_factor | vLLM k_scale | vLLM v_scale "
             "| K max/median channel | V max/median channel |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ls in layers:
        lines.append(f"| {ls.layer} | {ls.k_amax:.4g} | {ls.v_amax:.4g} | {ls.kv_cache_scaling_factor:.6g} | "
                     f"{ls.k_scale:.6g} | {ls.v_scale:.6g} | {_spread(ls.k_channel_amax)} | "
                     f"{_spread(ls.v_channel_amax)} |")
    return lines


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    median = statistics.median(values)
    return f"{max(values) / median:.1f}x" if median > 0 else "—"

