"""A TensorRT-LLM Llama checkpoint as a transformers LlamaForCausalLM: names, FP8 dequantization,
and the model config read from the checkpoint's config.json with TensorRT-LLM's defaults;
fill_model, the one way the reference runtime builds a transformers model from a state dict (Llama
here, Gemma 3 in trtkv.runtime.gemma3)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.core.errors import StageError
from trtkv.core.files import json_object
from trtkv.kvcache.engines import load_table

if TYPE_CHECKING:
    import torch


RUNTIME_JSON = "runtime.json"
# TensorRT-LLM Llama checkpoint names (per layer) -> transformers LlamaForCausalLM names.
# TRT-LLM's GatedMLP applies the activation to `fc`: fc = gate_proj, gate = up_proj (checked on a
# ModelOpt export).
LAYER_NAMES = {
    "input_layernorm": "input_layernorm",
    "post_layernorm": "post_attention_layernorm",
    "attention.dense": "self_attn.o_proj",
    "mlp.fc": "mlp.gate_proj",
    "mlp.gate": "mlp.up_proj",
    "mlp.proj": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "transformer.vocab_embedding": "model.embed_tokens",
    "transformer.ln_f": "model.norm",
    "lm_head": "lm_head",
}


def kv_format_for_algo(algo: object, where: Path) -> str:
    """The KV format the runtime stores for a checkpoint's kv_cache_quant_algo ("FP8" -> "fp8",
    None -> "none"): the KV-format registry's calibrated (or unquantized) row that writes it."""
    table = load_table()
    row = table.for_checkpoint_algo(algo) if algo is None or isinstance(algo, str) else None
    if row is None:
        algos = sorted({r.choice.checkpoint_algo or "" for r in table.recipe_rows()} - {""})
        raise StageError(
            f"{where}: kv_cache_quant_algo {algo!r}; the reference runtime runs {algos} or none."
        )
    return row.choice.name


# ---------------------------------------------------------------------------------------------
# Checkpoint <-> transformers state dict


def _dequantize(tensors: dict[str, torch.Tensor], base: str) -> torch.Tensor:
    """`base.weight` as float32, multiplied by `base.weights_scaling_factor` when the weight is
    quantized."""
    import torch

    weight = tensors[f"{base}.weight"]
    scale = tensors.get(f"{base}.weights_scaling_factor")
    if scale is None:
        if weight.dtype in (torch.float8_e4m3fn, torch.int8):
            raise StageError(
                f"{base}.weight is {weight.dtype} but {base}.weights_scaling_factor is missing."
            )
        return weight.float()
    if weight.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise StageError(
            f"{base}.weight: the reference runtime dequantizes FP8 weights only, got "
            f"{weight.dtype} with a weights_scaling_factor. Next: use quantization.weights fp8 or "
            "none."
        )
    scale = scale.float()
    if scale.numel() > 1:
        scale = scale.reshape(-1, *([1] * (weight.dim() - 1)))
    return weight.float() * scale


def trtllm_to_hf_state_dict(
    tensors: dict[str, torch.Tensor], config: Any
) -> dict[str, torch.Tensor]:
    """Map a TensorRT-LLM Llama checkpoint (one rank, TP=PP=1) to LlamaForCausalLM names, float32,
    dequantized."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for src, dst in GLOBAL_NAMES.items():
        if f"{src}.weight" in tensors:
            out[f"{dst}.weight"] = _dequantize(tensors, src)
            used.add(f"{src}.weight")
    for i in range(config.num_hidden_layers):
        pre, hf = f"transformer.layers.{i}.", f"model.layers.{i}."
        for src, dst in LAYER_NAMES.items():
            out[f"{hf}{dst}.weight"] = _dequantize(tensors, pre + src)
            used.add(f"{pre}{src}.weight")
        qkv = _dequantize(tensors, pre + "attention.qkv")
        used.add(f"{pre}attention.qkv.weight")
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=0)
        out[f"{hf}self_attn.q_proj.weight"] = q.contiguous()
        out[f"{hf}self_attn.k_proj.weight"] = k.contiguous()
        out[f"{hf}self_attn.v_proj.weight"] = v.contiguous()
    unknown = sorted(n for n in tensors if n.endswith((".weight", ".bias")) and n not in used)
    if unknown:
        raise StageError(
            f"checkpoint tensors the reference runtime does not map: {', '.join(unknown[:8])}"
            f"{' ...' if len(unknown) > 8 else ''}. It runs Llama-architecture checkpoints without "
            f"biases; Next: use a Llama model or another backend."
        )
    return out


def kv_scaling_factors(tensors: dict[str, torch.Tensor], num_layers: int) -> list[float]:
    """Per-layer `attention.kv_cache_scaling_factor` (the one TensorRT-LLM <= 1.2 reads for K and
    V)."""
    scales = []
    for i in range(num_layers):
        name = f"transformer.layers.{i}.attention.kv_cache_scaling_factor"
        if name not in tensors:
            raise StageError(
                f"checkpoint has a quantized KV cache but no {name}. Next: rerun `trtkv calibrate "
                "--force`."
            )
        scales.append(float(tensors[name].float().reshape(-1)[0]))
    return scales


# ---------------------------------------------------------------------------------------------
# Model config


def read_json(path: Path) -> dict[str, Any]:
    return json_object(path, "run `trtkv build` for this recipe")


# TensorRT-LLM's defaults for keys a Llama checkpoint config.json may omit, as TensorRT-LLM 1.2
# reads it: `tensorrt_llm/models/modeling_utils.py` PretrainedConfig.__init__
# (NVIDIA/TensorRT-LLM@b35ac1b6, version 1.2.0rc2) and `models/llama/config.py` LLaMAConfig.__init__
# (@89fd9b74); rotary_pct/rotary_dim as `Attention.create_attention_const_params` reads them.
# Unknown keys become attributes there (no error). Derived defaults: num_key_value_heads =
# num_attention_heads, head_size = hidden_size // num_attention_heads, intermediate_size = 4 *
# hidden_size. A missing lm_head.weight means the embedding is shared (PretrainedModel.load).
TRTLLM_DEFAULTS: dict[str, Any] = {
    "hidden_act": "gelu",  # ModelOpt and LLaMAConfig.from_hugging_face write silu for a Llama
    "norm_epsilon": 1e-5,
    "position_embedding_type": "learned_absolute",  # Llama exports write rope_gpt_neox
    "max_position_embeddings": None,
    "rotary_pct": 1.0,
    "rotary_base": 10000.0,
    "rotary_scaling": None,
    "mlp_bias": False,
    "attn_bias": False,
    "qk_layernorm": False,
}
REQUIRED_ARCH = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")


def checkpoint_architecture(trt_cfg: dict[str, Any], where: Path) -> dict[str, Any]:
    """Every architecture field of a TensorRT-LLM Llama checkpoint, TensorRT-LLM's defaults where a
    key is absent; raises StageError for what TensorRT-LLM would build differently from a Llama
    (biases, partial/learned RoPE)."""
    if trt_cfg.get("architecture") not in (None, "LlamaForCausalLM"):
        raise StageError(
            f"{where}: architecture {trt_cfg.get('architecture')!r}; the reference runtime runs "
            f"LlamaForCausalLM checkpoints only."
        )
    missing = [k for k in REQUIRED_ARCH if trt_cfg.get(k) is None]
    if missing:
        raise StageError(
            f"{where}: {', '.join(missing)} missing (TensorRT-LLM has no default for them). Next: "
            f"rerun `trtkv calibrate --force`."
        )
    arch = {
        **TRTLLM_DEFAULTS,
        **{k: v for k, v in trt_cfg.items() if v is not None or k == "rotary_scaling"},
    }
    heads, hidden = int(arch["num_attention_heads"]), int(arch["hidden_size"])
    # PretrainedConfig: MHA when absent
    arch["num_key_value_heads"] = int(arch.get("num_key_value_heads") or heads)
    arch["head_size"] = int(arch.get("head_size") or hidden // heads)
    # PretrainedConfig default
    arch["intermediate_size"] = int(arch.get("intermediate_size") or 4 * hidden)
    problems = []
    if arch["position_embedding_type"] != "rope_gpt_neox":
        problems.append(
            f"position_embedding_type {arch['position_embedding_type']!r} (a Llama uses "
            "rope_gpt_neox)"
        )
    if (
        int(arch.get("rotary_dim") or arch["head_size"] * float(arch["rotary_pct"]))
        != arch["head_size"]
    ):
        problems.append(
            f"partial rotary (rotary_pct {arch['rotary_pct']}, rotary_dim {arch.get('rotary_dim')})"
        )
    for flag in ("mlp_bias", "attn_bias", "qk_layernorm"):
        if arch[flag]:
            problems.append(f"{flag} true")
    if str(arch["hidden_act"]) not in ("silu", "swiglu"):
        problems.append(f"hidden_act {arch['hidden_act']!r} (a Llama MLP is gated silu)")
    if problems:
        raise StageError(
            f"{where}: TensorRT-LLM would build this checkpoint with {'; '.join(problems)}; the "
            "reference runtime runs what a Llama export holds. Next: check the export (`trtkv "
            "calibrate --force`)."
        )
    return arch


def llama_config(trt_cfg: dict[str, Any], hf_cfg: dict[str, Any] | None, where: Path) -> Any:
    """A LlamaConfig built from the TensorRT-LLM checkpoint's config.json alone, the way
    TensorRT-LLM reads it.

    The HF config (when given) contributes token ids only (bos/eos/pad are not part of the engine);
    a rope or layer count that exists only in the HF config is ignored here, so a checkpoint
    TensorRT-LLM would misread is misread by the reference runtime too (`trtkv generate` shows it).
    """
    from transformers import LlamaConfig

    from trtkv.checkpoints import rope

    arch = checkpoint_architecture(trt_cfg, where)
    positions = (
        arch["max_position_embeddings"] or (hf_cfg or {}).get("max_position_embeddings") or 4096
    )
    ropes = rope.from_trtllm(arch)
    rope_parameters = {
        "rope_type": ropes.scaling_type or "default",
        "rope_theta": ropes.theta,
        **{k: v for k, v in (ropes.scaling or {}).items() if k != "rope_type"},
    }
    data: dict[str, Any] = {
        "vocab_size": int(arch["vocab_size"]),
        "hidden_size": int(arch["hidden_size"]),
        "intermediate_size": int(arch["intermediate_size"]),
        "num_hidden_layers": int(arch["num_hidden_layers"]),
        "num_attention_heads": int(arch["num_attention_heads"]),
        "num_key_value_heads": int(arch["num_key_value_heads"]),
        "head_dim": int(arch["head_size"]),
        "rms_norm_eps": float(arch["norm_epsilon"]),
        "hidden_act": "silu",
        "max_position_embeddings": int(positions),
        "rope_parameters": rope_parameters,
        "attention_bias": False,
        "mlp_bias": False,
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        data[key] = (hf_cfg or {}).get(key)
    return LlamaConfig(**data, dtype="float32")


def fill_model(
    model_class: Any,
    config: Any,
    state_dict: dict[str, torch.Tensor],
    what: str,
    finish: Callable[[Any, Any], None],
) -> Any:
    """A float32 `model_class(config)` holding exactly `state_dict` (no random init, no missing
    tensors): built on the meta device, the tensors assigned, lm_head tied to the embedding when the
    checkpoint has none, then `finish(model, config)` sets what the checkpoint does not hold (the
    rotary embedding, non-persistent buffers). `what` names the model in the error."""
    import torch

    config = copy.deepcopy(config)
    tied = "lm_head.weight" not in state_dict
    config.tie_word_embeddings = tied
    with torch.device("meta"):
        model = model_class(config)
    expected = {k for k in model.state_dict() if not (tied and k == "lm_head.weight")}
    missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise StageError(
            f"checkpoint does not fill the {what}: missing {missing[:6]}, unexpected "
            f"{unexpected[:6]}."
        )
    model.load_state_dict(state_dict, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    finish(model, config)
    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if meta:
        raise StageError(f"reference runtime: tensors left uninitialised: {meta[:6]}")
    return model.float().eval()


def build_model(config: Any, state_dict: dict[str, torch.Tensor]) -> Any:
    """A float32 LlamaForCausalLM holding exactly `state_dict` (fill_model)."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    def finish(model: Any, config: Any) -> None:
        model.model.rotary_emb = LlamaRotaryEmbedding(config=config, device=torch.device("cpu"))

    return fill_model(LlamaForCausalLM, config, state_dict, "model", finish)
