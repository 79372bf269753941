"""K/V statistics per layer: does "K has outlier channels, V varies per token" hold for this model?

    stats = collect_kv_stats(model, [input_ids, ...])   # HF causal LM, list of [batch, tokens] LongTensors
    print(stats.to_markdown()); Path("kv_stats.json").write_text(stats.to_json())

K and V are taken as the cache stores them (K after RoPE), over all heads of a layer; a "channel" is
one (kv_head, dim) pair. Per layer:
- K |max| per channel; outlier channels = channel amax > OUTLIER_FACTOR x the layer's median channel
  amax;
- V spread per token: the |max| of each (token, head) row, summarized as median / p99 / max;
- range ratios: per-tensor amax / median per-channel amax (K) and per-tensor amax / median per-token
  amax (V): how much resolution a single per-tensor scale wastes compared with per-channel or
  per-token scales.
"""  # noqa: E501

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.affine import AffineCalibration, AffineCollector

OUTLIER_FACTOR = 4.0


@dataclass
class LayerKVStats:
    """Statistics of one layer's K and V."""

    layer: int
    k_amax: float
    v_amax: float
    k_channel_amax_median: float
    k_outlier_channels: list[int]  # flat index head * head_dim + dim
    k_tensor_to_channel_ratio: float
    v_channel_amax_median: float
    v_outlier_channels: list[int]
    v_token_amax_median: float
    v_token_amax_p99: float
    v_token_amax_max: float
    v_tensor_to_token_ratio: float
    k_token_amax_median: float
    k_tensor_to_token_ratio: float


@dataclass
class KVStats:
    """Per-layer K/V statistics of a model over some token batches."""

    layers: list[LayerKVStats]
    tokens: int
    head_dim: int
    kv_heads: int
    outlier_factor: float = OUTLIER_FACTOR
    notes: list[str] = field(default_factory=list)
    # fp8_affine's bias and amax, collected as ModelOpt does, same batches
    affine: AffineCalibration | None = None
    # per layer, per KV head (fp8_attn_head)
    k_head_amax: list[list[float]] = field(default_factory=list)
    v_head_amax: list[list[float]] = field(default_factory=list)
    # per layer max |H k| (nvfp4_rotate's K amax)
    k_rotated_amax: list[float] = field(default_factory=list)

    @property
    def k_amax(self) -> list[float]:
        return [x.k_amax for x in self.layers]

    @property
    def v_amax(self) -> list[float]:
        return [x.v_amax for x in self.layers]

    def summary(self) -> dict:
        """Model-level verdict on the K-outlier-channel / V-per-token claim."""
        n = len(self.layers)
        with_k_outliers = sum(1 for x in self.layers if x.k_outlier_channels)
        with_v_outliers = sum(1 for x in self.layers if x.v_outlier_channels)
        k_ratio = _median([x.k_tensor_to_channel_ratio for x in self.layers])
        v_ratio = _median([x.v_tensor_to_token_ratio for x in self.layers])
        kv_gap = _median([x.k_amax / x.v_amax for x in self.layers if x.v_amax > 0])
        return {
            "layers": n,
            "layers_with_k_outlier_channels": with_k_outliers,
            "layers_with_v_outlier_channels": with_v_outliers,
            "median_k_tensor_to_channel_ratio": k_ratio,
            "median_v_tensor_to_token_ratio": v_ratio,
            "median_k_amax_over_v_amax": kv_gap,
            "k_outlier_channels_hold": with_k_outliers > n / 2,
            "v_varies_per_token": v_ratio > 2.0,
        }

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "head_dim": self.head_dim,
            "kv_heads": self.kv_heads,
            "outlier_factor": self.outlier_factor,
            "summary": self.summary(),
            "notes": self.notes,
            "layers": [asdict(x) for x in self.layers],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        s = self.summary()
        lines = [
            f"K/V statistics over {self.tokens} tokens ({self.kv_heads} KV heads x head_dim "
            f"{self.head_dim}; K after RoPE, as cached). Outlier channel: channel |max| > "
            f"{self.outlier_factor:g}x the layer's median channel |max|.",
            "",
            f"- K outlier channels in {s['layers_with_k_outlier_channels']}/{s['layers']} layers; "
            "median K per-tensor/per-channel range ratio "
            f"{s['median_k_tensor_to_channel_ratio']:.1f}x.",
            "- V per-token |max| varies: median per-tensor/per-token ratio "
            f"{s['median_v_tensor_to_token_ratio']:.1f}x; V outlier channels in "
            f"{s['layers_with_v_outlier_channels']}/{s['layers']} layers.",
            f"- K's range is {s['median_k_amax_over_v_amax']:.1f}x V's (median over layers): a "
            "scale shared by K and V (TensorRT-LLM INT8) leaves V about "
            f"{127 / max(s['median_k_amax_over_v_amax'], 1e-9):.0f} of 127 levels.",
            f'- Claim "K has outlier channels, V varies per token": K outliers '
            f"{'hold' if s['k_outlier_channels_hold'] else 'do not hold'} on this model, V "
            f"per-token variation {'holds' if s['v_varies_per_token'] else 'does not hold'}.",
            "",
            "| layer | K amax | K ch. median | K outlier ch. | K tensor/ch. | V amax | V token "
            "median | V token p99 | V tensor/token | V outlier ch. |",
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for x in self.layers:
            outl = ", ".join(
                f"h{c // self.head_dim}:{c % self.head_dim}" for c in x.k_outlier_channels[:4]
            )
            more = f" (+{len(x.k_outlier_channels) - 4})" if len(x.k_outlier_channels) > 4 else ""
            lines.append(
                f"| {x.layer} | {x.k_amax:.2f} | {x.k_channel_amax_median:.2f} | "
                f"{len(x.k_outlier_channels)}{': ' + outl + more if outl else ''} | "
                f"{x.k_tensor_to_channel_ratio:.1f} | {x.v_amax:.3f} | {x.v_token_amax_median:.3f} "
                f"| {x.v_token_amax_p99:.3f} | {x.v_tensor_to_token_ratio:.1f} | "
                f"{len(x.v_outlier_channels)} |"
            )
        return "\n".join(lines) + "\n"


def outlier_channels(channel_amax: list[float], factor: float = OUTLIER_FACTOR) -> list[int]:
    """Channels whose |max| exceeds `factor` x the layer's median channel |max| (the lower median,
    as torch's).

    The one outlier rule: the K/V statistics here and the calibration report's warnings both use
    it."""
    import statistics

    if not channel_amax:
        return []
    median = statistics.median_low(channel_amax)
    return [i for i, value in enumerate(channel_amax) if median > 0 and value > factor * median]


def _median(values: list[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).median()) if values else 0.0


class _Accumulator:
    """Running per-layer maxima and per-token amax samples."""

    def __init__(self) -> None:
        self.k_channel: torch.Tensor | None = None
        self.v_channel: torch.Tensor | None = None
        self.v_tokens: list[torch.Tensor] = []
        self.k_tokens: list[torch.Tensor] = []
        self.k_affine, self.v_affine = AffineCollector(), AffineCollector()
        self.k_rotated = 0.0

    def add(self, k: torch.Tensor, v: torch.Tensor) -> None:
        # one collect per batch, in the model dtype, as ModelOpt's k/v_bmm_quantizer
        self.k_affine.collect(k)
        self.v_affine.collect(v)
        ka, va = k.float().abs(), v.float().abs()
        # ModelOpt's k_bmm_quantizer sees H k (nvfp4_rotate)
        if k.shape[-1] > 1 and k.shape[-1] & -k.shape[-1] >= 2:
            from trtkv.kvcache.variants import modelopt_hadamard

            self.k_rotated = max(self.k_rotated, float(modelopt_hadamard(k).float().abs().amax()))
        kc = ka.amax(dim=(0, 2)).flatten()  # [H * D]
        vc = va.amax(dim=(0, 2)).flatten()
        self.k_channel = kc if self.k_channel is None else torch.maximum(self.k_channel, kc)
        self.v_channel = vc if self.v_channel is None else torch.maximum(self.v_channel, vc)
        self.v_tokens.append(va.amax(-1).flatten())
        self.k_tokens.append(ka.amax(-1).flatten())

    def finish(self, layer: int, factor: float) -> LayerKVStats:
        if self.k_channel is None or self.v_channel is None:
            raise TrtkvError(f"collect_kv_stats: layer {layer} saw no K/V.")
        kc, vc = self.k_channel.cpu(), self.v_channel.cpu()
        vt, kt = torch.cat(self.v_tokens).cpu(), torch.cat(self.k_tokens).cpu()
        k_amax, v_amax = float(kc.max()), float(vc.max())
        kc_med, vc_med = float(kc.median()), float(vc.median())
        vt_med, kt_med = float(vt.median()), float(kt.median())
        return LayerKVStats(
            layer=layer,
            k_amax=k_amax,
            v_amax=v_amax,
            k_channel_amax_median=kc_med,
            k_outlier_channels=outlier_channels([float(x) for x in kc.flatten()], factor),
            k_tensor_to_channel_ratio=k_amax / kc_med if kc_med > 0 else 0.0,
            v_channel_amax_median=vc_med,
            v_outlier_channels=outlier_channels([float(x) for x in vc.flatten()], factor),
            v_token_amax_median=vt_med,
            v_token_amax_p99=float(torch.quantile(vt.double(), 0.99)),
            v_token_amax_max=float(vt.max()),
            v_tensor_to_token_ratio=v_amax / vt_med if vt_med > 0 else 0.0,
            k_token_amax_median=kt_med,
            k_tensor_to_token_ratio=k_amax / kt_med if kt_med > 0 else 0.0,
        )


def collect_kv_stats(
    model, batches: Iterable[torch.Tensor], factor: float = OUTLIER_FACTOR
) -> KVStats:  # noqa: ANN001
    """Run `model` (an HF causal LM) on each [batch, tokens] input_ids tensor and gather per-layer
    K/V statistics."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    accs: list[_Accumulator] = []
    tokens = 0
    kv_heads = head_dim = 0
    with torch.inference_mode():
        for ids in batches:
            ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
            cache = DynamicCache(config=model.config)
            model(input_ids=ids.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1)
            tokens += ids.numel()
            for i, layer in enumerate(cache.layers):
                keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
                if keys is None or values is None:
                    raise TrtkvError(
                        f"collect_kv_stats: layer {i} is not an attention layer with K/V tensors."
                    )
                while len(accs) <= i:
                    accs.append(_Accumulator())
                accs[i].add(keys, values)
                kv_heads, head_dim = keys.shape[1], keys.shape[-1]
    if not accs:
        raise TrtkvError(
            "collect_kv_stats: no batches given. Next: pass a non-empty list of input_ids tensors."
        )
    affine = AffineCalibration.from_collectors(
        [a.k_affine for a in accs], [a.v_affine for a in accs]
    )
    return KVStats(
        layers=[acc.finish(i, factor) for i, acc in enumerate(accs)],
        tokens=tokens,
        head_dim=head_dim,
        kv_heads=kv_heads,
        outlier_factor=factor,
        affine=affine,
        k_head_amax=[_per_head(a.k_channel, kv_heads) for a in accs],
        v_head_amax=[_per_head(a.v_channel, kv_heads) for a in accs],
        k_rotated_amax=[a.k_rotated for a in accs],
    )


def _per_head(channel_amax: torch.Tensor | None, kv_heads: int) -> list[float]:
    """A layer's per-channel amax ([kv_heads * head_dim], head-major) reduced to one amax per KV
    head."""
    if channel_amax is None:
        return []
    return [float(x) for x in channel_amax.cpu().reshape(kv_heads, -1).amax(-1)]
