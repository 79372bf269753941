"""Attention on fixed key tiles, the batch-invariant attention of trtkv.runtime.invariant where
torch's flash kernel does not run (sliding layers, a model whose flash check fails) and in every
decode step: a sequence's keys laid on KEY_TILE tiles aligned to absolute positions, one batched
score GEMM and one value GEMM of fixed per-tile shapes, a row's unseen keys -inf before the exact
row max, the tiles added in tile order. A row's result depends on its position and its keys only:
not on the other rows, the chunk it came in, nor how many tiles they need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

KEY_TILE = 64  # keys per attention tile in prefill, tiles aligned to absolute positions
# prefill rows per attention block (a multiple of ROWS): bounds memory, skips unseen tiles
QUERY_BLOCK = 128


def attend_decode_rows(
    scaling: float,
    q: torch.Tensor,
    kv: list[tuple[torch.Tensor, torch.Tensor, int, int]],
    window: int | None,
    masks: dict[Any, Any] | None = None,
) -> torch.Tensor:
    """Decode rows q (n, H, d), row b at position p_b over its own sequence's keys/values (Hkv, T_b,
    d) holding positions first_b.. (kv[b] = (keys, values, first_b, p_b)), all rows in one set of
    calls. A row sees positions lo_b..p_b (lo_b = 0, or p_b - window + 1 on a sliding layer), laid
    on KEY_TILE tiles aligned to absolute positions; the rows' tiles are padded to the most any row
    needs, padding and unseen keys -inf. Per tile one batched (groups x d) x (d x TILE) score GEMM
    and one (groups x TILE) x (TILE x d) value GEMM (the same shape for every row, tile and batch),
    the exact row max over all tiles, exp, each tile's 64-key sum, and the tiles' sums and partial
    outputs added in tile order by cumsum (a sequential float64 accumulation: a padding tile adds
    exact zeros). So a row's result depends on its position and its keys only, not on the other rows
    nor on how many tiles they need. Returns (n, H * d). `masks`: the unseen-key masks by the
    rows' spans, kept by the caller across the layers of one step (the same spans in every layer of
    an attention kind)."""
    import torch
    import torch.nn.functional as F

    n, heads, d = q.shape
    kv_heads = kv[0][0].shape[0]
    groups = heads // kv_heads
    spans = []
    for _, _, first, p in kv:
        lo = 0 if window is None else max(0, p - window + 1)
        lo = max(lo, first)
        t0 = lo - lo % KEY_TILE
        spans.append((lo, t0, -(-(p + 1 - t0) // KEY_TILE)))
    tiles = max(t for _, _, t in spans)
    width = tiles * KEY_TILE
    if n == 1:  # one row: its keys padded in one call each
        (keys, values, first, p), (lo, t0, _) = kv[0], spans[0]
        pad = (0, 0, lo - t0, width - (p + 1 - t0))
        k_pad = F.pad(keys[:, lo - first : p + 1 - first], pad)[None]
        v_pad = F.pad(values[:, lo - first : p + 1 - first], pad)[None]
    else:
        k_pad = q.new_zeros(n, kv_heads, width, d)
        v_pad = q.new_zeros(n, kv_heads, width, d)
        for b, ((keys, values, first, p), (lo, t0, _)) in enumerate(zip(kv, spans, strict=True)):
            k_pad[b, :, lo - t0 : p + 1 - t0] = keys[:, lo - first : p + 1 - first]
            v_pad[b, :, lo - t0 : p + 1 - t0] = values[:, lo - first : p + 1 - first]
    bounds = tuple((lo - t0, r[3] + 1 - t0) for r, (lo, t0, _) in zip(kv, spans, strict=True))
    unseen = None if masks is None else masks.get((width, bounds))
    if unseen is None:
        seen = torch.zeros(n, width, dtype=torch.bool)
        for b, (start, stop) in enumerate(bounds):
            seen[b, start:stop] = True
        unseen = (~seen).view(n, 1, tiles, 1, KEY_TILE)
        if masks is not None:
            masks[width, bounds] = unseen
    # query head h reads KV head h // groups (repeat_kv)
    qg = (q * scaling).view(n, kv_heads, 1, groups, d)
    k_t = k_pad.view(n, kv_heads, tiles, KEY_TILE, d)
    v_t = v_pad.view(n, kv_heads, tiles, KEY_TILE, d)
    s = torch.matmul(qg, k_t.transpose(-1, -2))  # (n, Hkv, tiles, groups, TILE)
    s.masked_fill_(unseen, float("-inf"))
    # max is exact; every row sees at least its own key
    s.sub_(s.amax(dim=(2, 4), keepdim=True)).exp_()
    total = s.sum(-1).cumsum(2, dtype=torch.float64)[:, :, -1].to(q.dtype)  # (n, Hkv, groups)
    # (n, Hkv, groups, d)
    value = torch.matmul(s, v_t).cumsum(2, dtype=torch.float64)[:, :, -1].to(q.dtype)
    return (value / total[..., None]).reshape(n, heads * d)


@dataclass
class TilePlan:
    """How one chunk's rows meet its keys, the same in every layer of one attention kind (built once
    per chunk): keys padded onto `tiles` KEY_TILE tiles from absolute position t0; rows in
    QUERY_BLOCK-row blocks, block (r0, r1, lo, n, (m0, m1, mask)) reading tiles lo..lo+n (every tile
    holding a key one of its rows may see), its tiles m0..m1 (relative to lo) masked by `mask` (1,
    m1 - m0, (r1 - r0) * groups, KEY_TILE), true on a row's invisible keys (the tiles outside m0..m1
    are visible to all its rows)."""

    t0: int
    tiles: int
    blocks: list[tuple[int, int, int, int, Any]]


def tile_plan(
    positions: torch.Tensor, first: int, end: int, window: int | None, groups: int
) -> TilePlan:
    """The TilePlan of query rows at `positions` over keys at positions first..end-1 (see
    TilePlan)."""
    import torch

    t0 = first - first % KEY_TILE
    tiles = -(-(end - t0) // KEY_TILE)
    blocks = []
    for r0 in range(0, positions.shape[0], QUERY_BLOCK):
        pos = positions[r0 : r0 + QUERY_BLOCK]
        lo_pos, hi_pos = int(pos.min()), int(pos.max())
        lo = 0 if window is None else max(0, min(tiles - 1, (lo_pos - window + 1 - t0) // KEY_TILE))
        n = max(1, min(tiles, (hi_pos - t0) // KEY_TILE + 1) - lo)
        kpos = torch.arange(t0 + lo * KEY_TILE, t0 + (lo + n) * KEY_TILE)[None]
        qpos = pos.repeat_interleave(groups)[:, None]
        masked = (kpos > qpos) | (kpos < first) | (kpos >= end)
        if window is not None:
            masked |= kpos <= qpos - window
        seen = masked.view(-1, n, KEY_TILE).transpose(0, 1).contiguous()  # (n, R, TILE)
        # tiles with a masked key: only those get masked
        partial = seen.flatten(1).any(1).nonzero().flatten().tolist()
        m0, m1 = (partial[0], partial[-1] + 1) if partial else (0, 0)
        blocks.append((r0, r0 + pos.shape[0], lo, n, (m0, m1, seen[None, m0:m1])))
    return TilePlan(t0, tiles, blocks)


def attend_tiles(
    scaling: float,
    q: torch.Tensor,
    positions: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    first: int,
    window: int | None,
    plan: TilePlan | None = None,
) -> torch.Tensor:
    """Prefill rows q (W, H, d) at `positions` (W,) of one sequence over its keys/values (Hkv, T,
    d), which hold positions first..: keys on KEY_TILE tiles aligned to absolute positions; per
    block of rows one batched score GEMM and one batched value GEMM over its tiles (each tile a
    (rows x groups, d) x (d, TILE) product, the shape MKL computes alike for any batch), a row's
    masked keys exactly 0 after the exact row max, tile sums added in tile order (a tile a row
    cannot see adds exact zeros, so skipping it changes nothing). Returns (W, H * d)."""
    import torch
    import torch.nn.functional as F

    w, heads, d = q.shape
    kv_heads, count = keys.shape[0], keys.shape[1]
    groups, end = heads // kv_heads, first + count
    plan = plan or tile_plan(positions, first, end, window, groups)
    pad = (0, 0, first - plan.t0, plan.tiles * KEY_TILE - (end - plan.t0))
    k_t = F.pad(keys, pad).view(kv_heads, plan.tiles, KEY_TILE, d)  # (Hkv, tiles, TILE, d)
    v_t = F.pad(values, pad).view(kv_heads, plan.tiles, KEY_TILE, d)
    # (w, g)
    qg = (
        (q * scaling)
        .view(w, kv_heads, groups, d)
        .permute(1, 0, 2, 3)
        .reshape(kv_heads, w * groups, d)
    )
    out = q.new_empty(kv_heads, w * groups, d)
    for r0, r1, lo, n, (m0, m1, mask) in plan.blocks:
        s = torch.matmul(
            qg[:, None, r0 * groups : r1 * groups], k_t[:, lo : lo + n].transpose(-1, -2)
        )
        if m1 > m0:  # s: (Hkv, n, rows x groups, TILE)
            s[:, m0:m1].masked_fill_(mask, float("-inf"))
        top = s.amax(dim=(1, 3), keepdim=True)  # max is exact: the order cannot matter
        top.masked_fill_(torch.isinf(top), 0.0)  # a row with no key (a padding row): zeros, not NaN
        s.sub_(top).exp_()
        sums = s.sum(-1)  # (Hkv, n, R)
        total, value = sums[:, 0].clone(), torch.matmul(s[:, 0], v_t[:, lo])
        for t in range(1, n):  # tiles added in tile order, so a row's sum cannot depend on n
            total.add_(sums[:, t])
            value.baddbmm_(s[:, t], v_t[:, lo + t])
        out[:, r0 * groups : r1 * groups] = value / total[..., None]
    return out.view(kv_heads, w, groups, d).permute(1, 0, 2, 3).reshape(w, heads * d)
