"""The bytes a checkpoint's weights take as stored, per tensor group (experts, attention,
embeddings, other): read from the safetensors headers where the folder holds the weights
(trtkv.checkpoints.safetensors_headers), else estimated from config.json's shapes and the declared
format (labelled an estimate).

Groups, by tensor name as the published checkpoints name them: `experts` (routed experts:
`.experts.`, e.g. DeepSeek's `mlp.experts.N.`, Mixtral's `block_sparse_moe.experts.N.`,
gpt-oss's packed `mlp.experts.gate_up_proj_blocks`), `attention` (`self_attn`, `.attn.`,
`.attention.`, their KV scales included), `embeddings` (input embeddings and lm_head), `other`
(dense MLPs, shared experts, routers, norms, state-space mixers, MTP layers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from trtkv.checkpoints.checkpoint_quant import GROUPS, UNQUANTIZED
from trtkv.checkpoints.model_facts import ModelFacts
from trtkv.checkpoints.params import ParamCount
from trtkv.checkpoints.safetensors_headers import TensorEntry, holds_weights, read_tensors

_EXPERTS = re.compile(r"(^|\.)experts\.")
_ATTENTION = re.compile(r"(^|\.)(self_attn|attn|attention|cross_attn)\.")
_EMBEDDINGS = re.compile(
    r"(^|\.)(embed_tokens|lm_head|wte|word_embeddings|embed_out|tok_embeddings|embedding)\."
)


def tensor_group(name: str) -> str:
    """The group a stored tensor belongs to (experts, attention, embeddings, other)."""
    if _EXPERTS.search(name):
        return "experts"
    if _ATTENTION.search(name):
        return "attention"
    if _EMBEDDINGS.search(name):
        return "embeddings"
    return "other"


@dataclass(frozen=True)
class StoredBytes:
    """A checkpoint's weight bytes per tensor group and where the figures came from."""

    groups: dict[str, float]  # group -> bytes
    estimate: bool  # True: from config.json's shapes; False: the safetensors headers as stored
    source: str
    dtypes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # group -> dtypes stored

    @property
    def total(self) -> float:
        return sum(self.groups.values())


def header_bytes(entries: list[TensorEntry], folder: Path) -> StoredBytes:
    """Bytes per group as the shards store them (scales, zero points and KV scales included)."""
    groups = dict.fromkeys(GROUPS, 0.0)
    dtypes: dict[str, set[str]] = {g: set() for g in GROUPS}
    for e in entries:
        g = tensor_group(e.name)
        groups[g] += e.nbytes
        dtypes[g].add(e.dtype)
    shards = len({e.shard for e in entries})
    return StoredBytes(
        groups,
        False,
        f"safetensors headers of {folder} ({len(entries)} tensors in {shards} shard(s))",
        {g: tuple(sorted(d)) for g, d in dtypes.items()},
    )


def estimated_bytes(f: ModelFacts, count: ParamCount, dtype_bytes: float) -> StoredBytes:
    """Bytes per group from the config's parameter counts: a quantized group at the format's
    bytes per weight (scales included), the rest and the MoE routers at `dtype_bytes`; an estimate
    (norms, biases, sinks and the formats' per-tensor scales left out)."""
    formats = f.quant.formats if f.quant is not None else {}
    per = f.quant.weight_bytes if f.quant is not None else dtype_bytes
    params = {
        "experts": count.experts,
        "attention": count.attention,
        "embeddings": count.embedding,
        "other": count.total - count.experts - count.attention - count.embedding - count.routers,
    }
    groups = {
        g: params[g] * (per if formats.get(g, UNQUANTIZED) != UNQUANTIZED else dtype_bytes)
        for g in GROUPS
    }
    groups["other"] += count.routers * dtype_bytes
    return StoredBytes(groups, True, f"estimate from {f.path} (no weights in the folder)")


def stored_bytes(f: ModelFacts, count: ParamCount, dtype_bytes: float) -> StoredBytes:
    """The headers' figures where config.json's folder holds the weights, else the estimate."""
    folder = f.path.parent
    if holds_weights(folder):
        return header_bytes(read_tensors(folder), folder)
    return estimated_bytes(f, count, dtype_bytes)


def stored_note(f: ModelFacts, count: ParamCount, dtype_bytes: float) -> str | None:
    """One line for the plan: the checkpoint's declared formats and KV scheme, and its stored bytes
    per group (the groups it has), from the headers or labelled an estimate; None for a 16-bit
    checkpoint."""
    q = f.quant
    if q is None:
        return None
    stored = stored_bytes(f, count, dtype_bytes)
    present = [g for g in GROUPS if stored.groups[g] > 0]
    formats = ", ".join(f"{g} {q.formats.get(g, UNQUANTIZED)}" for g in present)
    groups = ", ".join(f"{g} {stored.groups[g] / 2**30:.3g}" for g in present)
    kv = f"KV cache declared: {q.kv_cache}" if q.kv_cache else "no KV cache scheme declared"
    how = "an estimate from config.json alone" if stored.estimate else stored.source
    return (
        f"Checkpoint quantization: {q.source}; weights {formats}; {kv}. Stored weights "
        f"{stored.total / 2**30:.4g} GiB ({groups} GiB), {how}."
    )
