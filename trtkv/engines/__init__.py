"""Each engine's memory in one place: its KV-pool rule, the recipe knobs it reads, their defaults at
trtkv's pinned release, the flags its served command carries, and how the pool a running server
reports is read back. One module per engine (vllm and vllm_cpu, sglang, trtllm for the LLM API and
the engine path, reference), with what they share in pool (the estimate, the knobs, the rule's
signature), sizing (the recipe's model as the engines size it) and activation (the profiling /
warm-up forward).

The layer of the backends (tests/test_imports.py): a backend names its engine's rule object in its
`memory` (trtkv.backends.seam.MemoryRule), the planner calls it (trtkv.plan.engine_pool), and
tests/engines/test_memory_home.py fails on an engine memory flag or knob read outside this package.

Nothing is imported eagerly: each face name loads its module on first use.
"""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.engines.activation import ModelShape, Setup
    from trtkv.engines.kv_scale_audit import audit_folder
    from trtkv.engines.kv_scale_findings import FAIL, Audit, Finding
    from trtkv.engines.kv_scale_text import render_audit, serve_scale_lines
    from trtkv.engines.kv_tiers import (
        HostTier,
        engine_host_tier,
        engine_tier_params,
        llmapi_host_tier,
        llmapi_tier_config,
        sglang_host_tier,
        sglang_tier_args,
        vllm_host_tier,
        vllm_tier_args,
        vllm_with_offload,
        without_vllm_size,
    )
    from trtkv.engines.parallel import (
        PARALLEL_NOTE,
        check_moe,
        kv_tp,
        sequence_groups,
        weights_per_gpu,
    )
    from trtkv.engines.pool import (
        BatchLimit,
        EngineKnobs,
        EngineTokens,
        PoolEstimate,
        PoolRule,
        ServedPool,
        Sizing,
        TokenFacts,
    )
    from trtkv.engines.reference import REFERENCE_LOG, no_knobs, reference_log_pool, reference_pool
    from trtkv.engines.sequence import sequence_kv_bytes
    from trtkv.engines.sglang import (
        SGLANG_INFO,
        SGLANG_VERSION,
        sglang_at,
        sglang_batch_limit,
        sglang_chunk,
        sglang_info_tokens,
        sglang_init_step,
        sglang_knobs,
        sglang_recipe_pool,
        sglang_token_unit,
    )
    from trtkv.engines.sizing import kv_bytes_per_token_per_gpu, model_config_path
    from trtkv.engines.trtllm import (
        ENGINE_CAP_PARAM,
        ENGINE_FRACTION_PARAM,
        LLMAPI_CAP_KEY,
        LLMAPI_FRACTION_KEY,
        TRTLLM_LOG,
        TRTLLM_SERVE_FRACTION_FLAG,
        engine_batch_limit,
        engine_memory_knobs,
        llmapi_batch_limit,
        llmapi_memory_knobs,
        trt_engine_at,
        trt_engine_recipe_pool,
        trtllm_at,
        trtllm_log_pool,
        trtllm_recipe_pool,
        trtllm_token_unit,
    )
    from trtkv.engines.vllm import (
        VLLM_LOG,
        VLLM_VERSION,
        cpu_pin_bytes,
        vllm_at,
        vllm_batch_limit,
        vllm_block,
        vllm_knobs,
        vllm_log_tokens,
        vllm_metrics_blocks,
        vllm_recipe_pool,
        vllm_token_unit,
    )
    from trtkv.engines.vllm_blocks import hybrid_block_size
    from trtkv.engines.vllm_cpu import vllm_cpu_recipe_pool

__getattr__, __dir__ = attach(__name__, stub=__file__)

__all__ = [
    "Audit",
    "audit_folder",
    "BatchLimit",
    "check_moe",
    "cpu_pin_bytes",
    "engine_batch_limit",
    "ENGINE_CAP_PARAM",
    "ENGINE_FRACTION_PARAM",
    "engine_host_tier",
    "engine_memory_knobs",
    "engine_tier_params",
    "EngineKnobs",
    "EngineTokens",
    "FAIL",
    "Finding",
    "HostTier",
    "hybrid_block_size",
    "kv_bytes_per_token_per_gpu",
    "kv_tp",
    "llmapi_batch_limit",
    "LLMAPI_CAP_KEY",
    "LLMAPI_FRACTION_KEY",
    "llmapi_host_tier",
    "llmapi_memory_knobs",
    "llmapi_tier_config",
    "model_config_path",
    "ModelShape",
    "no_knobs",
    "PARALLEL_NOTE",
    "PoolEstimate",
    "PoolRule",
    "REFERENCE_LOG",
    "reference_log_pool",
    "reference_pool",
    "render_audit",
    "sequence_groups",
    "sequence_kv_bytes",
    "serve_scale_lines",
    "ServedPool",
    "Setup",
    "sglang_at",
    "sglang_batch_limit",
    "sglang_chunk",
    "sglang_host_tier",
    "SGLANG_INFO",
    "sglang_info_tokens",
    "sglang_init_step",
    "sglang_knobs",
    "sglang_recipe_pool",
    "sglang_tier_args",
    "sglang_token_unit",
    "SGLANG_VERSION",
    "Sizing",
    "TokenFacts",
    "trt_engine_at",
    "trt_engine_recipe_pool",
    "trtllm_at",
    "TRTLLM_LOG",
    "trtllm_log_pool",
    "trtllm_recipe_pool",
    "TRTLLM_SERVE_FRACTION_FLAG",
    "trtllm_token_unit",
    "vllm_at",
    "vllm_batch_limit",
    "vllm_block",
    "vllm_cpu_recipe_pool",
    "vllm_host_tier",
    "vllm_knobs",
    "VLLM_LOG",
    "vllm_log_tokens",
    "vllm_metrics_blocks",
    "vllm_recipe_pool",
    "vllm_tier_args",
    "vllm_token_unit",
    "VLLM_VERSION",
    "vllm_with_offload",
    "weights_per_gpu",
    "without_vllm_size",
]
