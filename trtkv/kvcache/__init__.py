"""KV-cache numerics: formats, a quantized transformers Cache, K/V statistics.

Nothing is imported eagerly: each face name loads its module on first use, so the planner, which
reads only `formats` (no torch), stays fast.
"""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.kvcache.affine import AffineCalibration, AffineCollector
    from trtkv.kvcache.attention import SCORE_BUDGET_BYTES
    from trtkv.kvcache.attention_hook import (
        ENGINE_IMPL,
        EngineRun,
        engine_attention,
        engine_attention_forward,
        q_scales_for,
    )
    from trtkv.kvcache.attention_modes import (
        AUTO,
        CACHE_ONLY,
        AttentionMode,
        format_modes,
        load_attention,
        mode_names,
        select_mode,
    )
    from trtkv.kvcache.attn_head import (
        KV_CACHE_SCHEME_TENSOR,
        MODELOPT_QUANT_CONFIG,
        PER_TENSOR_NAMES,
        SCALES_FILE,
        attn_head_scales,
        compressed_tensors_config,
        head_amax_from_channels,
        validate_attn_head_export,
        validate_per_tensor_export,
        write_attn_head_scales,
        write_per_tensor_scheme,
    )
    from trtkv.kvcache.cache import QuantizedKVCache, config_layer_windows, update_rows
    from trtkv.kvcache.engines import FormatRow, load_table
    from trtkv.kvcache.formats import (
        FP8_MAX,
        PER_TOKEN_HEAD_SCALE_BYTES,
        SPECS,
        UNQUANTIZED,
        KVFormat,
        bytes_per_element,
        kv_bytes_per_token,
    )
    from trtkv.kvcache.names import KIVI_RESIDUAL, FormatChoice, all_format_names, parse_format
    from trtkv.kvcache.quant import numerics_key
    from trtkv.kvcache.quantized_layer import QuantizedKVLayer
    from trtkv.kvcache.scales import (
        CONVENTION,
        MIN_AMAX,
        KVScales,
        calibrate_scales,
        f32,
        load_kv_scales,
    )
    from trtkv.kvcache.stats import (
        OUTLIER_FACTOR,
        KVStats,
        LayerKVStats,
        collect_kv_stats,
        outlier_channels,
    )

# each name's module is imported on first use: most load torch, and the planner must not
__getattr__, __dir__ = attach(
    __name__, submodules=["attention", "attention_hook", "engines", "scales"], stub=__file__
)

__all__ = [
    "AffineCalibration",
    "AffineCollector",
    "all_format_names",
    "attention",
    "attention_hook",
    "AttentionMode",
    "attn_head_scales",
    "AUTO",
    "bytes_per_element",
    "CACHE_ONLY",
    "calibrate_scales",
    "collect_kv_stats",
    "compressed_tensors_config",
    "config_layer_windows",
    "CONVENTION",
    "engine_attention",
    "engine_attention_forward",
    "ENGINE_IMPL",
    "EngineRun",
    "engines",
    "f32",
    "format_modes",
    "FormatChoice",
    "FormatRow",
    "FP8_MAX",
    "head_amax_from_channels",
    "KIVI_RESIDUAL",
    "kv_bytes_per_token",
    "KV_CACHE_SCHEME_TENSOR",
    "KVFormat",
    "KVScales",
    "KVStats",
    "LayerKVStats",
    "load_attention",
    "load_kv_scales",
    "load_table",
    "MIN_AMAX",
    "mode_names",
    "MODELOPT_QUANT_CONFIG",
    "numerics_key",
    "outlier_channels",
    "OUTLIER_FACTOR",
    "parse_format",
    "PER_TENSOR_NAMES",
    "PER_TOKEN_HEAD_SCALE_BYTES",
    "q_scales_for",
    "QuantizedKVCache",
    "QuantizedKVLayer",
    "scales",
    "SCALES_FILE",
    "SCORE_BUDGET_BYTES",
    "select_mode",
    "SPECS",
    "UNQUANTIZED",
    "update_rows",
    "validate_attn_head_export",
    "validate_per_tensor_export",
    "write_attn_head_scales",
    "write_per_tensor_scheme",
]
