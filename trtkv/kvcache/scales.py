"""Static KV scales: from the calibrate stage's kv_scales.json (contract 1), or from a short calibration pass.

Scales are dequantization multipliers (x ~= q * scale), one per layer:
- fp8 (HF/vLLM): k_scale = k_amax / 448, v_scale = v_amax / 448, separate and unclamped;
- fp8_scale1: 1.0;
- int8 (TensorRT-LLM): kv_cache_scaling_factor = max(k_amax, v_amax) / 127, shared by K and V;
- int8_split (variant): k_amax / 127 and v_amax / 127.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trtkv.errors import StageError
from trtkv.kvcache.formats import KVFormat
from trtkv.kvcache.quant import FP8_MAX, INT8_MAX, FormatChoice, parse_format
from trtkv.kvcache.stats import KVStats, collect_kv_stats

MIN_AMAX = 1e-6
CONVENTION = ("scales are dequantization multipliers (x ~= q * scale); kv_cache_scaling_factor is TensorRT-LLM's "
              "single per-layer scale shared by K and V: INT8 max(k_amax, v_amax)/127, FP8 max(k_amax, v_amax)/448 "
              "clamped to >= 1.0 (ModelOpt export); k_scale/v_scale follow vLLM/HF: amax/448 (FP8) or amax/127 "
              "(INT8), separate and unclamped")


@dataclass
class KVScales:
    """Per-layer calibrated K and V |max| and the scales every static format derives from them."""

    k_amax: list[float]
    v_amax: list[float]
    source: str
    stats: KVStats | None = None
    info: dict = field(default_factory=dict)

    def for_format(self, fmt: KVFormat | str | FormatChoice) -> tuple[list[float] | None, list[float] | None]:
        """(k_scales, v_scales) for QuantizedKVCache, or (None, None) for formats without static scales."""
        choice = parse_format(fmt)
        k = [max(a, MIN_AMAX) for a in self.k_amax]
        v = [max(a, MIN_AMAX) for a in self.v_amax]
        if choice.base is KVFormat.FP8:
            return [a / FP8_MAX for a in k], [a / FP8_MAX for a in v]
        if choice.base is KVFormat.INT8:
            if choice.split_scales:
                return [a / INT8_MAX for a in k], [a / INT8_MAX for a in v]
            shared = [max(a, b) / INT8_MAX for a, b in zip(k, v, strict=False)]
            return shared, list(shared)
        return None, None

    def to_kv_scales_json(self, algo: str = "FP8") -> dict:
        """The contract-1 kv_scales.json document for these amaxes."""
        layers = []
        for i, (ka, va) in enumerate(zip(self.k_amax, self.v_amax, strict=False)):
            qmax = FP8_MAX if algo == "FP8" else INT8_MAX
            shared = max(ka, va) / qmax
            layers.append({"layer": i, "k_amax": ka, "v_amax": va,
                           "kv_cache_scaling_factor": max(shared, 1.0) if algo == "FP8" else shared,
                           "k_scale": ka / qmax, "v_scale": va / qmax})
        return {"kv_cache_quant_algo": algo, "num_layers": len(layers), "convention": CONVENTION,
                "source": self.source, "layers": layers}


def load_kv_scales(path: Path, num_layers: int | None = None) -> KVScales:
    """Read a kv_scales.json (contract 1); amaxes come from k_amax/v_amax (or are rebuilt from k_scale/v_scale)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StageError(f"{path}: cannot read KV scales ({exc}). Next: rerun `trtkv calibrate` or pass another "
                         f"--scales file.") from exc
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not layers:
        raise StageError(f"{path}: no \"layers\" list. Expected the kv_scales.json schema written by `trtkv calibrate`.")
    qmax = FP8_MAX if doc.get("kv_cache_quant_algo", "FP8") == "FP8" else INT8_MAX
    k, v = [], []
    for i, entry in enumerate(sorted(layers, key=lambda e: e.get("layer", 0))):
        try:
            ka = entry["k_amax"] if "k_amax" in entry else entry["k_scale"] * qmax
            va = entry["v_amax"] if "v_amax" in entry else entry["v_scale"] * qmax
        except (KeyError, TypeError) as exc:
            raise StageError(f"{path}: layers[{i}] has neither k_amax/v_amax nor k_scale/v_scale.") from exc
        k.append(float(ka))
        v.append(float(va))
    if num_layers is not None and len(k) != num_layers:
        raise StageError(f"{path}: {len(k)} layers of scales for a model with {num_layers} layers. Next: recalibrate "
                         f"for this model (`trtkv calibrate`).")
    return KVScales(k_amax=k, v_amax=v, source=str(path), info={"kv_cache_quant_algo": doc.get("kv_cache_quant_algo")})


def calibration_batches(tokenizer, texts: list[str], num_samples: int = 16, seq_len: int = 256,  # noqa: ANN001
                        batch_size: int = 4, seed: int = 1234) -> list[torch.Tensor]:
    """num_samples windows of seq_len tokens from shuffled texts, grouped in [batch, seq_len] tensors."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    ids: list[int] = []
    need = num_samples * seq_len
    for i in order:
        ids += tokenizer(texts[i] + "\n\n", add_special_tokens=False).input_ids
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise StageError(f"calibration text has {len(ids)} tokens, need {need} ({num_samples} x {seq_len}). "
                         f"Next: lower calibration.num_samples/seq_len or add text.")
    rows = torch.tensor(ids[:need]).reshape(num_samples, seq_len)
    return [rows[i: i + batch_size] for i in range(0, num_samples, batch_size)]


def calibrate_scales(model, tokenizer, texts: list[str] | None = None, num_samples: int = 16,  # noqa: ANN001
                     seq_len: int = 256, batch_size: int = 4, seed: int = 1234) -> KVScales:
    """A short pass of `model` over calibration text: per-layer K/V |max| (and the K/V statistics)."""
    if texts is None:
        from trtkv.data import CALIB_DEFAULT, load_texts

        texts = load_texts(CALIB_DEFAULT)
    batches = calibration_batches(tokenizer, texts, num_samples, seq_len, batch_size, seed)
    stats = collect_kv_stats(model, batches)
    return KVScales(k_amax=stats.k_amax, v_amax=stats.v_amax, stats=stats,
                    source=f"trtkv short calibration pass: {num_samples} x {seq_len} tokens, seed {seed}",
                    info={"num_samples": num_samples, "seq_len": seq_len, "seed": seed})
