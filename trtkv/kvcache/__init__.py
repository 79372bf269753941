"""KV-cache numerics: formats, a quantized transformers Cache, K/V statistics.

Only `formats` is imported eagerly (it has no torch dependency) so the planner stays fast.
"""

__all__ = [
    "AffineCalibration", "AffineCollector", "all_format_names", "attention", "attention_hook", "AttentionMode",
    "attn_head_scales", "AUTO", "bytes_per_element", "CACHE_ONLY", "calibrate_scales", "collect_kv_stats",
    "config_layer_windows", "CONVENTION", "engine_attention", "engine_attention_forward", "ENGINE_IMPL",
    "EngineRun", "engines", "f32", "FormatChoice", "FP8_MAX", "head_amax_from_channels", "KIVI_RESIDUAL",
    "kv_bytes_per_token", "KVFormat", "KVScale", "KVScales", "KVStats", "LayerKVStats", "load_attention",
    "load_kv_scales", "load_table", "MIN_AMAX", "mode_names", "MODELOPT_QUANT_CONFIG", "numerics_key",
    "outlier_channels", "OUTLIER_FACTOR", "parse_format", "PER_TENSOR_NAMES", "PER_TOKEN_HEAD_SCALE_BYTES",
    "q_scales_for", "QuantizedKVCache", "QuantizedKVLayer", "RowStore", "scales", "SCALES_FILE",
    "SCORE_BUDGET_BYTES", "select_mode", "UNQUANTIZED", "update_rows", "validate_attn_head_export",
    "write_attn_head_scales"
]
