"""The numeric ranges trtkv accepts, in one table: a model's config.json, the recipe's fields and
overrides, and the flags that size a deployment all take their bounds from here.

Each range names the largest published value it admits, so a bound is a statement about real models,
not a guess: a value outside it is a typo or a hostile file (a `num_hidden_layers` of 1e9 would make
the planner build a multi-GB per-layer table). The ceilings leave several-fold room above the
largest model named.

`CONFIG_FIELDS` maps a config.json field to its range; the config reader
(trtkv.checkpoints.hf_config_fields) checks every field it finds there, so teaching the reader a new
architecture's fields is one line each in that mapping.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import Field

INT32_MAX = 2**31 - 1  # Kubernetes' int32 fields (replicas, ports), and protobuf int32
# A name that lands in commands, configs and comments as it is (a model family, a config.json
# model_type or dtype)
WORD = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


@dataclass(frozen=True)
class Range:
    """Inclusive bounds and the largest published value they admit (said in every refusal)."""

    low: float
    high: float
    largest: str  # e.g. "Llama-3.1-405B: 126"

    def admits(self, value: float) -> bool:
        return math.isfinite(value) and self.low <= value <= self.high

    def text(self) -> str:
        return f"{_num(self.low)}..{_num(self.high)} (the largest published: {self.largest})"

    def field(self) -> dict[str, float]:
        """pydantic Field bounds (`Field(None, **RANGES["layers"].field())`)."""
        return {"ge": self.low, "le": self.high}


def _num(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


RANGES: dict[str, Range] = {
    # model shapes
    "layers": Range(1, 1024, "Llama-3.1-405B: 126 layers; PaLM 540B: 118"),
    "heads": Range(1, 1024, "Falcon-180B: 232 query heads; Llama-3.1-405B, DeepSeek-V3: 128"),
    "head_dim": Range(1, 4096, "Gemma-2-9B: 256 channels per head; DeepSeek-V3 q/k: 192"),
    "hidden": Range(1, 131072, "Megatron-Turing NLG 530B: 20,480; Llama-3.1-405B: 16,384"),
    "ffn": Range(0, 1 << 20, "Nemotron-4 340B and PaLM 540B: 73,728"),
    "vocab": Range(1, 1 << 22, "Gemma 3: 262,208 tokens; Llama 4: 202,048"),
    "positions": Range(1, 1 << 27, "Llama 4 Scout: 10,485,760 tokens of context"),
    "window": Range(0, 1 << 27, "Llama 4 Scout: 10,485,760 tokens; 0 or null: no window"),
    "latent": Range(
        0, 65536, "DeepSeek-V3: kv_lora_rank 512, q_lora_rank 1,536, qk_rope_head_dim 64"
    ),
    "group": Range(-1, 1 << 20, "GPTQ/AWQ group_size 128; -1: one group per column"),
    "experts": Range(0, 4096, "Switch Transformer C: 2,048 experts; Kimi K2: 384"),
    "layer_index": Range(0, 1023, "Llama-3.1-405B: layer 125 (one below `layers`)"),
    "small_count": Range(
        0, 1024, "DeepSeek-V3: first_k_dense_replace 3, Llama 4: interleave step 2"
    ),
    "quant_bits": Range(1, 16, "GPTQ/AWQ: 2 to 8 bits"),
    "state": Range(
        1,
        65536,
        "Nemotron-H: ssm_state_size 128; Qwen3-Next: 32 value heads x 128 x 128 channels; "
        "Jamba: mamba_d_state 16",
    ),
    "parameters": Range(1, 1e14, "Kimi K2: 1.04e12 parameters"),
    "weights_gib": Range(1e-6, 1 << 20, "Kimi K2 in bf16: about 1,940 GiB"),
    # engine and benchmark sizes
    "batch": Range(1, 1 << 20, "a guard, not a model fact: a million sequences in flight"),
    "requests": Range(1, 1 << 24, "a guard, not a model fact: 16.7 million requests per run"),
    "rate": Range(1e-6, 1e6, "a guard, not a model fact: a million requests per second"),
    "seed": Range(0, 2**32 - 1, "numpy's RandomState seed range"),
    "delay_us": Range(0, 10**9, "a guard, not a model fact: 1,000 s of queue delay"),
    # hardware and deployment
    "gpus": Range(1, 65536, "a GB200 NVL72 rack: 72 GPUs in one NVLink domain"),
    "memory_gib": Range(
        1e-3, 16384, "B300: 288 GB of HBM per GPU (a CPU host's RAM may stand in, up to 16 TiB)"
    ),
    "bandwidth_gbps": Range(1e-3, 1e6, "B300: 8,000 GB/s of HBM bandwidth"),
    "storage_gbps": Range(
        1e-3, 1e4, "a PCIe 5.0 NVMe drive: about 14 GB/s; a 400 Gb/s network link: 50 GB/s"
    ),
    "replicas": Range(1, INT32_MAX, "Kubernetes' int32 replica count"),
    # time
    "timeout_s": Range(
        1e-6, 604800, "a week: longer than any engine start or request; poll()'s limit is 24.8 days"
    ),
}

# config.json field -> range. Absent and null fields are not checked here (the reader says which
# ones it needs); a list (Mistral's per-layer sliding_window, moe_layers) is checked element by
# element.
CONFIG_FIELDS: dict[str, str] = {
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "num_key_value_heads": "heads",
    "head_dim": "head_dim",
    "qk_nope_head_dim": "latent",
    "qk_rope_head_dim": "latent",
    "v_head_dim": "head_dim",
    "hidden_size": "hidden",
    "intermediate_size": "ffn",
    "intermediate_size_mlp": "ffn",
    "moe_intermediate_size": "ffn",
    "shared_expert_intermediate_size": "ffn",
    "vocab_size": "vocab",
    "max_position_embeddings": "positions",
    "sliding_window": "window",
    "attention_chunk_size": "window",
    "kv_lora_rank": "latent",
    "q_lora_rank": "latent",
    "index_topk": "positions",
    "n_routed_experts": "experts",
    "num_local_experts": "experts",
    "num_experts": "experts",
    "num_experts_per_tok": "experts",
    "experts_per_token": "experts",
    "n_shared_experts": "experts",
    "moe_layers": "layer_index",
    "mlp_only_layers": "layer_index",
    "max_window_layers": "layers",
    "first_k_dense_replace": "small_count",
    "moe_layer_freq": "small_count",
    "decoder_sparse_step": "small_count",
    "interleave_moe_layer_step": "small_count",
    "no_rope_layer_interval": "small_count",
    "sliding_window_pattern": "small_count",
    "bits": "quant_bits",
    "group_size": "group",
    "weight_block_size": "positions",
    # linear-attention and state-space layers (trtkv.checkpoints.hybrid_config); mamba_d_head and
    # mamba_dt_rank may be the word "auto" (Granite 4, Jamba) and are checked by that reader
    "linear_num_key_heads": "heads",
    "linear_num_value_heads": "heads",
    "linear_key_head_dim": "head_dim",
    "linear_value_head_dim": "head_dim",
    "linear_conv_kernel_dim": "small_count",
    "conv_kernel": "small_count",
    "mamba_d_conv": "small_count",
    "mamba_num_heads": "heads",
    "mamba_n_heads": "heads",
    "mamba_head_dim": "head_dim",
    "mamba_n_groups": "heads",
    "n_groups": "heads",
    "mamba_d_state": "state",
    "ssm_state_size": "state",
    "mamba_expand": "small_count",
    "attn_layer_period": "small_count",
    "attn_layer_offset": "small_count",
    "expert_layer_period": "small_count",
    "expert_layer_offset": "small_count",
    "moe_shared_expert_intermediate_size": "ffn",
    "shared_intermediate_size": "ffn",
    "full_attention_interval": "small_count",
    # Gemma 4's per-layer geometry
    "global_head_dim": "head_dim",
    "num_global_key_value_heads": "heads",
    "num_kv_shared_layers": "small_count",
}
# entries of a per-layer list (layer_types, no_rope_layers, ...): more layers than `layers` allows
MAX_LIST = 4096
# the CONFIG_FIELDS that may hold a list of such numbers (Mistral's per-layer windows, layer
# indices, block shapes)
LIST_VALUED = {"sliding_window", "moe_layers", "mlp_only_layers", "weight_block_size"}


def bounded(default: Any, name: str, **kwargs: Any) -> Any:
    """A pydantic Field bounded by the range `name`: recipes, overrides and `trtkv init` share the
    same bounds (the range's name is kept for the error message, trtkv.recipe.loader)."""
    return Field(
        default,
        **{
            "ge": RANGES[name].low,
            "le": RANGES[name].high,
            "json_schema_extra": {"range": name},
            **kwargs,
        },
    )


def check_int(name: str, value: Any, range_name: str) -> str | None:
    """None when `value` is an integer inside the range, else what is wrong (the caller adds the
    file and next step)."""
    r = RANGES[range_name]
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name}: {_shown(value)} is not an integer; one in {r.text()} is needed"
    if not r.admits(value):
        return f"{name}: {_shown(value)} is outside {r.text()}"
    return None


def check_config_field(name: str, value: Any) -> list[str]:
    """Problems with one config.json field named in CONFIG_FIELDS (an int, or a list of
    ints/nulls)."""
    range_name = CONFIG_FIELDS[name]
    if value is None:
        return []
    if isinstance(value, list) and name in LIST_VALUED:
        if len(value) > MAX_LIST:
            return [f"{name}: a list of {len(value):,} entries (at most {MAX_LIST:,})"]
        found = [
            check_int(f"{name}[{i}]", v, range_name) for i, v in enumerate(value) if v is not None
        ]
        return [p for p in found if p][:3]
    problem = check_int(name, value, range_name)
    return [problem] if problem else []


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
