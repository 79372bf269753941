"""The facts trtkv reads from a model's config.json (trtkv.checkpoints.hf_config fills them):
`ModelFacts` (geometry, each layer's attention, state layers, the fields each fact came from), its
experts (`MoE`) and its stored precision (`StoredQuant`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtkv.recipe.attention import LayerAttention
from trtkv.recipe.state import StateSpec


@dataclass
class MoE:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int  # 0 when none (all shared experts together)
    moe_layers: tuple[int, ...]
    source: str


@dataclass
class StoredQuant:
    """A pre-quantized checkpoint's precision (trtkv.checkpoints.checkpoint_quant reads it)."""

    method: str  # who wrote it: "modelopt", "compressed-tensors", "fp8", "mxfp4", "awq", "gptq"
    weight_bytes: float  # bytes per quantized weight, scales included
    # which weights: "linear" (all linear layers but routers), "experts", or "none" (a KV-only
    # export: the weights are 16-bit)
    quantized: str
    source: str
    # weight format per tensor group (experts, attention, embeddings, other): "fp8", "fp8_block",
    # "nvfp4", "mxfp4", "int4_awq", ..., or "unquantized"
    formats: dict[str, str] = field(default_factory=dict)
    kv_cache: str | None = None  # the KV cache scheme it declares: "fp8 per tensor", "nvfp4", ...

    @property
    def stored_format(self) -> str | None:
        """The weights' stored format in one word (model.checkpoint_quant, trtkv.recipe.stored):
        the method for fp8 / mxfp4 / awq / gptq configs, the quantized groups' format for ModelOpt
        and compressed-tensors (nvfp4, int4_awq, fp8, ...); None for a KV-only export (16-bit
        weights)."""
        if self.quantized == "none":
            return None
        if self.method in ("fp8", "mxfp4", "awq", "gptq"):
            return self.method
        quantized = [f for f in self.formats.values() if f != "unquantized"]
        return quantized[0] if quantized else self.method


@dataclass
class ModelFacts:
    path: Path
    model_type: str
    architectures: list[str]
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int | None
    vocab_size: int | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    layers: tuple[LayerAttention, ...]
    attention_source: str
    v_head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    q_lora_rank: int | None = None
    sparse_mla: bool = False
    sinks: str | None = None
    moe: MoE | None = None
    quant: StoredQuant | None = None
    dtype: str | None = None
    prefix: str = ""  # "text_config." for multimodal configs
    notes: list[str] = field(default_factory=list)
    state: StateSpec | None = None  # the fixed per-sequence state of the linear / mamba layers
    state_params: float = 0.0  # parameters of one state layer's mixer
    # layers with attention projections (None: every layer)
    attention_layers: tuple[int, ...] | None = None
    # layers with a dense MLP (None: every layer without experts)
    dense_mlp_layers: tuple[int, ...] | None = None
    mlp_matrices: int = 3  # gated MLP (gate, up, down); 2 for an ungated one (Nemotron-H's relu2)
    # the config's mamba_ssm_cache_dtype (vLLM's Nemotron-H default)
    config_ssm_dtype: str | None = None
