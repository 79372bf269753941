"""trtkv's reference runtime's memory: max_batch_size caches of max_seq_len (a cache per request),
no memory knob, and the pool line it prints at startup (read back by `trtkv status` and `trtkv
bench`).
"""

from __future__ import annotations

import re
from dataclasses import replace

from trtkv.core.readback import MAX_POOL_BYTES, MAX_POOL_TOKENS, whole
from trtkv.engines.pool import EngineKnobs, PoolEstimate, Sizing, Term
from trtkv.recipe import Recipe


def no_knobs(recipe: Recipe) -> EngineKnobs:
    """The reference runtime: max_batch_size caches of max_seq_len, no memory knob."""
    return EngineKnobs(None, None, True)


def reference_pool(recipe: Recipe, sizing: Sizing, knobs: EngineKnobs) -> PoolEstimate:
    """The reference runtime: one cache per request, at most max_batch_size requests of
    max_seq_len."""
    pool = recipe.build.max_batch_size * sizing.sequence_bytes(recipe.build.max_seq_len)
    est = PoolEstimate(
        "reference",
        "trtkv",
        "reference runtime: max_batch_size sequences of max_seq_len, one cache "
        "per request (trtkv.runtime.batch.Batcher admits max_batch_size)",
        "trtkv/runtime/batch.py Batcher, trtkv/runtime/engine.py ReferenceRuntime.new_cache",
        "none",
        0.0,
        True,
        pool,
        (Term("weights", sizing.setup.weights_bytes, "weights"),),
        pool,
        pool,
    )
    return replace(est, bound="pin")


REFERENCE_POOL_LINE = (
    "trtkv reference runtime KV pool: {bytes} bytes ({batch} requests x {seq} "
    "tokens x {per_token} bytes)"
)


_REFERENCE_POOL = re.compile(
    r"trtkv reference runtime KV pool: (\d+) bytes \((\d+) requests x (\d+) tokens"
)
REFERENCE_LOG = "reference runtime log 'trtkv reference runtime KV pool: N bytes'"


def reference_log_pool(text: str) -> tuple[float, int] | None:
    """The reference runtime's own line (REFERENCE_POOL_LINE): (bytes, tokens = requests x
    tokens)."""
    found = _REFERENCE_POOL.findall(text)
    if not found:
        return None
    total, batch, seq = found[-1]
    tokens = whole(batch, REFERENCE_LOG, "requests", MAX_POOL_TOKENS) * whole(
        seq, REFERENCE_LOG, "tokens", MAX_POOL_TOKENS
    )
    return (
        float(whole(total, REFERENCE_LOG, "bytes", MAX_POOL_BYTES)),
        whole(tokens, REFERENCE_LOG, "requests x tokens", MAX_POOL_TOKENS),
    )
