"""The one owner of static KV scales: calibration batches, amax -> scale maths, and
`kv_scales.json`.

`trtkv calibrate` (ModelOpt's quantizers measure the amaxes) and `trtkv probe` (a short pass of the
model, or the recipe's kv_scales.json when calibrate wrote one) both build their calibration batches
with `calibration_batches`, turn amaxes into scales with `layer_scales`, and read/write
`kv_scales.json` here. Light at import (no torch): `trtkv calibrate --dry-run` and `trtkv build
--dry-run` import it.

Scales are dequantization multipliers (x ~= q * scale), one per layer:
- fp8 (HF/vLLM): k_scale = k_amax / 448, v_scale = v_amax / 448, separate and unclamped;
- fp8_scale1: 1.0;
- int8 (TensorRT-LLM): kv_cache_scaling_factor = max(k_amax, v_amax) / 127, shared by K and V;
- int8_split (variant): k_amax / 127 and v_amax / 127.
- fp8_affine (ModelOpt's, a variant of fp8): per layer the amax of x - bias and the bias per (KV
  head, channel), for K and V, from the same calibration pass (trtkv.kvcache.affine collects them as
  ModelOpt does); k_scale = amax / 448.
"""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.core.errors import StageError
from trtkv.kvcache.formats import FP8_MAX, INT8_MAX, KVFormat

if TYPE_CHECKING:
    import torch

    from trtkv.contracts.artifacts import KVScalesFile
    from trtkv.kvcache.affine import AffineCalibration
    from trtkv.kvcache.names import FormatChoice
    from trtkv.kvcache.numerics import KVScale
    from trtkv.kvcache.stats import KVStats

MIN_AMAX = 1e-6
CONVENTION = (
    "Scales are dequantization multipliers: x ~= q * scale. kv_cache_scaling_factor is what "
    "TensorRT-LLM <= 1.2 reads: ONE scale shared by K and V, INT8: max(k_amax, v_amax)/127, FP8: "
    "max(k_amax, v_amax)/448 clamped to >= 1.0 by ModelOpt's exporter. k_scale/v_scale follow "
    "vLLM/HF: separate, amax/448 (FP8) or amax/127 (INT8), unclamped. amax is the max |x| of "
    "post-RoPE K and of V over the calibration tokens."
)


def f32(value: float) -> float:
    """Round to float32 (what a checkpoint stores), so kv_scales.json and the rank files agree
    exactly."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


# kv_cache_quant_algo -> the |value| a static scale maps amax to (NVFP4's global scale: amax / 448
# too, as ModelOpt 0.47 exports it and TensorRT-LLM's PyTorch backend loads it; older ModelOpt wrote
# amax / (6 x 448))
ALGO_QMAX = {"FP8": FP8_MAX, "INT8": float(INT8_MAX), "NVFP4": FP8_MAX}


def layer_scales(k_amax: float, v_amax: float, algo: str) -> dict[str, float]:
    """kv_cache_scaling_factor (TensorRT-LLM's shared one; FP8 clamped to >= 1.0 as ModelOpt exports
    it) and k_scale/v_scale (vLLM/HF: separate, unclamped), float32-rounded, for algo "FP8", "INT8"
    or "NVFP4" (whose k_scale/v_scale are the per-tensor global scales amax/448)."""
    qmax = ALGO_QMAX[algo]
    shared = max(k_amax, v_amax) / qmax
    return {
        "kv_cache_scaling_factor": f32(max(shared, 1.0) if algo == "FP8" else shared),
        "k_scale": f32(k_amax / qmax),
        "v_scale": f32(v_amax / qmax),
    }


def kv_scales_document(
    algo: str | None,
    k_amax: list[float],
    v_amax: list[float],
    num_layers: int | None = None,
    source: str | None = None,
) -> KVScalesFile:
    """The kv_scales.json document: per layer k/v amax and both scale conventions. Deterministic (no
    timestamps, fixed order). algo None (an unquantized KV cache): no layers."""
    from trtkv.contracts.artifacts import KVScaleLayer, KVScalesFile

    layers = (
        []
        if algo is None
        else [
            KVScaleLayer(layer=i, k_amax=ka, v_amax=va, **layer_scales(ka, va, algo))
            for i, (ka, va) in enumerate(zip(k_amax, v_amax, strict=True))
        ]
    )
    return KVScalesFile(
        kv_cache_quant_algo=algo,
        num_layers=len(layers) if num_layers is None else num_layers,
        convention=CONVENTION,
        **({"source": source} if source is not None else {}),
        layers=layers,
    )


@dataclass
class KVScales:
    """Per-layer calibrated K and V |max| and the scales every static format derives from them."""

    k_amax: list[float]
    v_amax: list[float]
    source: str
    stats: KVStats | None = None
    info: dict = field(default_factory=dict)
    # fp8_affine's per-layer amax and bias (a calibration pass only)
    affine: AffineCalibration | None = None
    # fp8_attn_head: per layer, per KV head (a pass only)
    k_head_amax: list[list[float]] = field(default_factory=list)
    v_head_amax: list[list[float]] = field(default_factory=list)
    # nvfp4_rotate: per layer max |H k| (a pass only)
    k_rotated_amax: list[float] = field(default_factory=list)

    def for_format(
        self, fmt: KVFormat | str | FormatChoice
    ) -> tuple[list[KVScale] | None, list[KVScale] | None]:
        """(k_scales, v_scales) for QuantizedKVCache, or (None, None) for formats without static
        scales."""
        from trtkv.kvcache.names import parse_format

        choice = parse_format(fmt)
        if choice.affine:
            if self.affine is None:
                raise StageError(
                    f"KV format {choice.name} needs a bias per (KV head, channel) and the amax of "
                    f"x - bias from a calibration pass; the scales from {self.source} have none "
                    "(kv_scales.json holds amaxes only). Next: calibrate with "
                    "trtkv.kvcache.scales.calibrate_scales (the probe's own short pass does) or "
                    f"drop {choice.name} from --formats."
                )
            ks, vs = self.affine.scales()
            k_params: list[KVScale] = list(ks)
            v_params: list[KVScale] = list(vs)
            return k_params, v_params
        if choice.variant:
            return self._for_variant(choice.variant)
        k = [max(a, MIN_AMAX) for a in self.k_amax]
        v = [max(a, MIN_AMAX) for a in self.v_amax]
        if choice.base is KVFormat.FP8:
            return [a / FP8_MAX for a in k], [a / FP8_MAX for a in v]
        # the per-layer global scales, K and V apart (ModelOpt: amax / 448)
        if choice.base is KVFormat.NVFP4:
            return [a / FP8_MAX for a in k], [a / FP8_MAX for a in v]
        if choice.base is KVFormat.INT8:
            if choice.split_scales:
                return [a / INT8_MAX for a in k], [a / INT8_MAX for a in v]
            shared: list[KVScale] = [max(a, b) / INT8_MAX for a, b in zip(k, v, strict=False)]
            return shared, list(shared)
        return None, None

    def _for_variant(self, name: str) -> tuple[list[KVScale] | None, list[KVScale] | None]:
        """fp8_attn_head: per-head scales as vLLM loads them; nvfp4_4over6: nvfp4's globals
        amax/448; nvfp4_rotate: the amax of rotated K and of V (ModelOpt's max calibration);
        fp8_e5m2 / nvfp4_cast: none."""
        from trtkv.kvcache.variants import head_scale

        def missing(what: str) -> StageError:
            return StageError(
                f"KV format {name} needs {what} from a calibration pass; the scales from "
                f"{self.source} have none (kv_scales.json holds per-layer amaxes only). Next: "
                "calibrate with trtkv.kvcache.scales.calibrate_scales (the probe's own short pass "
                f"does) or drop {name} from --formats."
            )

        if name == "fp8_attn_head":
            if not self.k_head_amax or not self.v_head_amax:
                raise missing("each layer's K and V amax per KV head")
            return [head_scale(a) for a in self.k_head_amax], [
                head_scale(a) for a in self.v_head_amax
            ]
        if name == "nvfp4_4over6":
            return (
                [max(a, MIN_AMAX) / FP8_MAX for a in self.k_amax],
                [max(a, MIN_AMAX) / FP8_MAX for a in self.v_amax],
            )
        if name == "nvfp4_rotate":
            if not self.k_rotated_amax:
                raise missing("each layer's amax of Hadamard-rotated K")
            return [max(a, MIN_AMAX) for a in self.k_rotated_amax], [
                max(a, MIN_AMAX) for a in self.v_amax
            ]
        return None, None

    def format_amaxes(self, fmt: KVFormat | str | FormatChoice) -> dict | None:
        """The amaxes a format reads beyond the per-layer k/v amax (fp8_attn_head: per KV head;
        nvfp4_rotate: rotated K), for cache keys; None for every other format, so their keys stay as
        they were."""
        from trtkv.kvcache.names import parse_format

        variant = parse_format(fmt).variant
        if variant == "fp8_attn_head":
            return {"k_head_amax": self.k_head_amax, "v_head_amax": self.v_head_amax}
        if variant == "nvfp4_rotate":
            return {"k_rotated_amax": self.k_rotated_amax}
        return None

    def to_probe_json(self) -> dict[str, Any]:
        """What probe.json records: where the scales came from and the per-layer amaxes they derive
        from."""
        return {
            "source": self.source,
            "layers": [
                {"layer": i, "k_amax": k, "v_amax": v}
                for i, (k, v) in enumerate(zip(self.k_amax, self.v_amax, strict=True))
            ],
        }


def load_kv_scales(path: Path, num_layers: int | None = None) -> KVScales:
    """Read scales for the probe: calibrate's kv_scales.json (trtkv.contracts.artifacts.KVScalesFile
    is its typed model) or a hand-made `--scales` file, so this reader is lenient: amaxes come from
    k_amax/v_amax, or are rebuilt from k_scale/v_scale."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StageError(
            f"{path}: cannot read KV scales ({exc}). Next: rerun `trtkv calibrate` or pass another "
            f"--scales file."
        ) from exc
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not layers:
        raise StageError(
            f'{path}: no "layers" list. Expected the kv_scales.json schema written by `trtkv '
            "calibrate`."
        )
    qmax = ALGO_QMAX.get(str(doc.get("kv_cache_quant_algo", "FP8")), float(INT8_MAX))
    k, v = [], []
    for i, entry in enumerate(sorted(layers, key=lambda e: e.get("layer", 0))):
        try:
            ka = entry["k_amax"] if "k_amax" in entry else entry["k_scale"] * qmax
            va = entry["v_amax"] if "v_amax" in entry else entry["v_scale"] * qmax
        except (KeyError, TypeError) as exc:
            raise StageError(
                f"{path}: layers[{i}] has neither k_amax/v_amax nor k_scale/v_scale."
            ) from exc
        k.append(float(ka))
        v.append(float(va))
    if num_layers is not None and len(k) != num_layers:
        raise StageError(
            f"{path}: {len(k)} layers of scales for a model with {num_layers} layers. Next: "
            "recalibrate for this model (`trtkv calibrate`)."
        )
    return KVScales(
        k_amax=k,
        v_amax=v,
        source=str(path),
        info={"kv_cache_quant_algo": doc.get("kv_cache_quant_algo")},
    )


def separator_ids(tokenizer: Any) -> list[int]:
    """What joins two calibration records: the tokenizer's EOS id (a document boundary), none when
    it has none."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return [int(eos)] if isinstance(eos, int) else []


def calibration_batches(
    tokenizer: Any,
    texts: list[str],
    num_samples: int = 16,
    seq_len: int = 256,
    batch_size: int = 4,
    seed: int = 1234,
    where: str = "calibration text",
) -> list[torch.Tensor]:
    """num_samples x seq_len tokens: records in a seeded order, each followed by the EOS id,
    concatenated, cut into [batch_size, seq_len] tensors. The one batch builder: for one recipe and
    seed, calibrate and the probe's own short pass read the same token stream (the probe takes its
    first min(num_samples, 16) x min(seq_len, 256) tokens)."""
    import torch

    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    need = num_samples * seq_len
    ids: list[int] = []
    sep = separator_ids(tokenizer)
    for index in order:
        ids += tokenizer(texts[index], add_special_tokens=False)["input_ids"] + sep
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise StageError(
            f"{where}: {len(ids)} tokens in {len(texts)} records, but num_samples x seq_len = "
            f"{num_samples} x {seq_len} = {need} are needed. Next: lower calibration.num_samples "
            "or calibration.seq_len, or add text."
        )
    samples = torch.tensor(ids[:need], dtype=torch.long).view(num_samples, seq_len)
    return list(samples.split(batch_size))


def calibrate_scales(
    model,
    tokenizer,
    texts: list[str] | None = None,
    num_samples: int = 16,  # noqa: ANN001
    seq_len: int = 256,
    batch_size: int = 4,
    seed: int = 1234,
) -> KVScales:
    """A short pass of `model` over calibration text: per-layer K/V |max| (and the K/V
    statistics)."""
    if texts is None:
        from trtkv.core.texts import CALIB_DEFAULT, load_texts

        texts = load_texts(CALIB_DEFAULT)
    from trtkv.kvcache.stats import collect_kv_stats

    batches = calibration_batches(tokenizer, texts, num_samples, seq_len, batch_size, seed)
    stats = collect_kv_stats(model, batches)
    return KVScales(
        k_amax=stats.k_amax,
        v_amax=stats.v_amax,
        stats=stats,
        source=f"trtkv short calibration pass: {num_samples} x {seq_len} tokens, seed {seed}",
        info={"num_samples": num_samples, "seq_len": seq_len, "seed": seed},
        affine=stats.affine,
        k_head_amax=stats.k_head_amax,
        v_head_amax=stats.v_head_amax,
        k_rotated_amax=stats.k_rotated_amax,
    )
