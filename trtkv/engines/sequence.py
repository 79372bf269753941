"""One sequence's bytes as an engine accounts them: `exact` sums what each layer holds (its tokens'
KV, a state layer's fixed state: TensorRT-LLM's per-layer windows and state slots); `vllm` is what
vLLM allocates (trtkv.engines.vllm_blocks). The planner, `trtkv init` and the vLLM backend's pool
size all call this one function."""

from __future__ import annotations

from collections.abc import Sequence

from trtkv.engines.vllm_blocks import vllm_stage_bytes
from trtkv.kvcache.formats import KVFormat
from trtkv.recipe.attention import (
    VLLM_BLOCK_GPU,
    Accounting,
    KVShape,
    LayerAttention,
    stages,
    vllm_hybrid_on,
)


def sequence_kv_bytes(
    layers: Sequence[LayerAttention],
    shape: KVShape,
    fmts: Sequence[KVFormat],
    context: int,
    tp: int = 1,
    pp: int = 1,
    accounting: Accounting = Accounting.EXACT,
    batched_tokens: int = 8192,
    block: int = VLLM_BLOCK_GPU,
    hybrid: bool | None = None,
    prefix_caching: bool = True,
) -> float:
    """KV (and fixed state) one `context`-token sequence keeps on the fullest GPU (tp=pp=1: in all),
    per the engine's accounting (`hybrid` forces vLLM's hybrid manager on or off; by default it
    follows vLLM's default for these layers; `prefix_caching`: vLLM's default, on, keeps two state
    blocks per sequence, trtkv.engines.vllm_blocks)."""
    hybrid = vllm_hybrid_on(layers) if hybrid is None else hybrid
    worst = 0.0
    for stage in stages(len(layers), pp):
        if accounting is Accounting.EXACT:
            total = sum(
                layers[i].tokens_held(context) * shape.bytes_per_token(layers[i], fmts[i], tp)
                + shape.sequence_state_bytes(layers[i], tp)
                for i in stage
            )
        else:
            total = vllm_stage_bytes(
                layers,
                shape,
                fmts,
                context,
                tp,
                stage,
                batched_tokens,
                block,
                hybrid,
                prefix_caching,
            )
        worst = max(worst, total)
    return worst
