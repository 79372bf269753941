"""trtkv's reference runtime: the exported TensorRT-LLM checkpoint executed in PyTorch on the CPU.

It is a correctness reference, not TensorRT: it reads `rank0.safetensors` of the checkpoint that `trtllm-build`
would compile, dequantizes FP8 weights with their `weights_scaling_factor` (so the weight numerics are the
engine's), and decodes with trtkv's quantized KV cache using the checkpoint's per-layer `kv_cache_scaling_factor`
(TensorRT-LLM <= 1.2 semantics: one scale per layer shared by K and V). Computation is float32.

Activations are NOT quantized: the checkpoint's `activation_scaling_factor` tensors (FP8 GEMM inputs on a GPU) are
ignored, every GEMM runs in float32 on the dequantized weights. So the reference reproduces the engine's weight and
KV-cache numerics, not its FP8 activation rounding; differences that come from the latter will not show here.

    rt = ReferenceRuntime.load(Path("engines/smollm2_fp8kv/engine"))
    ids = rt.generate(rt.tokenizer("Q: capital of France?\\nA:")["input_ids"], max_tokens=8)
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.errors import StageError, TrtkvError
from trtkv.layout import KV_ALGO

if TYPE_CHECKING:
    import torch

RUNTIME_JSON = "runtime.json"
# TensorRT-LLM Llama checkpoint names (per layer) -> transformers LlamaForCausalLM names.
# TRT-LLM's GatedMLP applies the activation to `fc`: fc = gate_proj, gate = up_proj (checked on a ModelOpt export).
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
# checkpoint kv_cache_quant_algo -> the KV format the runtime stores ("FP8" -> "fp8", None -> "none")
KV_FORMATS: dict[str | None, str] = {algo: kv.value for kv, algo in KV_ALGO.items()}


class RequestError(TrtkvError, ValueError):
    """A generate() call with arguments the runtime cannot serve (too long, empty, bad sampling values)."""


# ---------------------------------------------------------------------------------------------
# Checkpoint <-> transformers state dict


def _dequantize(tensors: dict[str, torch.Tensor], base: str) -> torch.Tensor:
    """`base.weight` as float32, multiplied by `base.weights_scaling_factor` when the weight is quantized."""
    import torch

    weight = tensors[f"{base}.weight"]
    scale = tensors.get(f"{base}.weights_scaling_factor")
    if scale is None:
        if weight.dtype in (torch.float8_e4m3fn, torch.int8):
            raise StageError(f"{base}.weight is {weight.dtype} but {base}.weights_scaling_factor is missing.")
        return weight.float()
    if weight.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise StageError(f"{base}.weight: the reference runtime dequantizes FP8 weights only, got {weight.dtype} "
                         f"with a weights_scaling_factor. Next: use quantization.weights fp8 or none.")
    scale = scale.float()
    if scale.numel() > 1:
        scale = scale.reshape(-1, *([1] * (weight.dim() - 1)))
    return weight.float() * scale


def trtllm_to_hf_state_dict(tensors: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """Map a TensorRT-LLM Llama checkpoint (one rank, TP=PP=1) to LlamaForCausalLM names, float32, dequantized."""
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
        raise StageError(f"checkpoint tensors the reference runtime does not map: {', '.join(unknown[:8])}"
                         f"{' ...' if len(unknown) > 8 else ''}. It runs Llama-architecture checkpoints without "
                         f"biases; Next: use a Llama model or another backend.")
    return out


def hf_to_trtllm_state_dict(state_dict: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """The inverse mapping (unquantized), for writing small TensorRT-LLM-layout checkpoints in tests and tools."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for src, dst in GLOBAL_NAMES.items():
        if f"{dst}.weight" in state_dict:
            out[f"{src}.weight"] = state_dict[f"{dst}.weight"]
    for i in range(config.num_hidden_layers):
        pre, hf = f"transformer.layers.{i}.", f"model.layers.{i}."
        for src, dst in LAYER_NAMES.items():
            out[f"{pre}{src}.weight"] = state_dict[f"{hf}{dst}.weight"]
        out[f"{pre}attention.qkv.weight"] = torch.cat(
            [state_dict[f"{hf}self_attn.{p}_proj.weight"] for p in "qkv"], dim=0)
    return {k: v.contiguous() for k, v in out.items()}


def kv_scaling_factors(tensors: dict[str, torch.Tensor], num_layers: int) -> list[float]:
    """Per-layer `attention.kv_cache_scaling_factor` (the one TensorRT-LLM <= 1.2 reads for K and V)."""
    scales = []
    for i in range(num_layers):
        name = f"transformer.layers.{i}.attention.kv_cache_scaling_factor"
        if name not in tensors:
            raise StageError(f"checkpoint has a quantized KV cache but no {name}. Next: rerun `trtkv calibrate --force`.")
        scales.append(float(tensors[name].float().reshape(-1)[0]))
    return scales


# ---------------------------------------------------------------------------------------------
# Model config


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageError(f"{path}: missing. Next: run `trtkv build` for this recipe.") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise StageError(f"{path}: not readable as JSON ({exc}).") from exc
    if not isinstance(data, dict):
        raise StageError(f"{path}: expected a JSON object.")
    return data


# TensorRT-LLM's defaults for keys a Llama checkpoint config.json may omit, as TensorRT-LLM 1.2 reads it:
# `tensorrt_llm/models/modeling_utils.py` PretrainedConfig.__init__ (NVIDIA/TensorRT-LLM@b35ac1b6, version 1.2.0rc2)
# and `models/llama/config.py` LLaMAConfig.__init__ (@89fd9b74); rotary_pct/rotary_dim as
# `Attention.create_attention_const_params` reads them. Unknown keys become attributes there (no error).
# Derived defaults: num_key_value_heads = num_attention_heads, head_size = hidden_size // num_attention_heads,
# intermediate_size = 4 * hidden_size. A missing lm_head.weight means the embedding is shared (PretrainedModel.load).
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
    """Every architecture field of a TensorRT-LLM Llama checkpoint, TensorRT-LLM's defaults where a key is absent;
    raises StageError for what TensorRT-LLM would build differently from a Llama (biases, partial/learned RoPE)."""
    if trt_cfg.get("architecture") not in (None, "LlamaForCausalLM"):
        raise StageError(f"{where}: architecture {trt_cfg.get('architecture')!r}; the reference runtime runs "
                         f"LlamaForCausalLM checkpoints only.")
    missing = [k for k in REQUIRED_ARCH if trt_cfg.get(k) is None]
    if missing:
        raise StageError(f"{where}: {', '.join(missing)} missing (TensorRT-LLM has no default for them). Next: "
                         f"rerun `trtkv calibrate --force`.")
    arch = {**TRTLLM_DEFAULTS, **{k: v for k, v in trt_cfg.items() if v is not None or k == "rotary_scaling"}}
    heads, hidden = int(arch["num_attention_heads"]), int(arch["hidden_size"])
    arch["num_key_value_heads"] = int(arch.get("num_key_value_heads") or heads)  # PretrainedConfig: MHA when absent
    arch["head_size"] = int(arch.get("head_size") or hidden // heads)
    arch["intermediate_size"] = int(arch.get("intermediate_size") or 4 * hidden)  # PretrainedConfig default
    problems = []
    if arch["position_embedding_type"] != "rope_gpt_neox":
        problems.append(f"position_embedding_type {arch['position_embedding_type']!r} (a Llama uses rope_gpt_neox)")
    if int(arch.get("rotary_dim") or arch["head_size"] * float(arch["rotary_pct"])) != arch["head_size"]:
        problems.append(f"partial rotary (rotary_pct {arch['rotary_pct']}, rotary_dim {arch.get('rotary_dim')})")
    for flag in ("mlp_bias", "attn_bias", "qk_layernorm"):
        if arch[flag]:
            problems.append(f"{flag} true")
    if str(arch["hidden_act"]) not in ("silu", "swiglu"):
        problems.append(f"hidden_act {arch['hidden_act']!r} (a Llama MLP is gated silu)")
    if problems:
        raise StageError(f"{where}: TensorRT-LLM would build this checkpoint with {'; '.join(problems)}; the reference "
                         f"runtime runs what a Llama export holds. Next: check the export (`trtkv calibrate --force`).")
    return arch


def llama_config(trt_cfg: dict[str, Any], hf_cfg: dict[str, Any] | None, where: Path) -> Any:
    """A LlamaConfig built from the TensorRT-LLM checkpoint's config.json alone, the way TensorRT-LLM reads it.

    The HF config (when given) contributes token ids only (bos/eos/pad are not part of the engine); a rope or layer
    count that exists only in the HF config is ignored here, so a checkpoint TensorRT-LLM would misread is misread
    by the reference runtime too (`trtkv generate` shows it).
    """
    from transformers import LlamaConfig

    from trtkv import rope

    arch = checkpoint_architecture(trt_cfg, where)
    positions = arch["max_position_embeddings"] or (hf_cfg or {}).get("max_position_embeddings") or 4096
    ropes = rope.from_trtllm(arch)
    rope_parameters = {"rope_type": ropes.scaling_type or "default", "rope_theta": ropes.theta,
                       **{k: v for k, v in (ropes.scaling or {}).items() if k != "rope_type"}}
    data: dict[str, Any] = {
        "vocab_size": int(arch["vocab_size"]), "hidden_size": int(arch["hidden_size"]),
        "intermediate_size": int(arch["intermediate_size"]), "num_hidden_layers": int(arch["num_hidden_layers"]),
        "num_attention_heads": int(arch["num_attention_heads"]),
        "num_key_value_heads": int(arch["num_key_value_heads"]), "head_dim": int(arch["head_size"]),
        "rms_norm_eps": float(arch["norm_epsilon"]), "hidden_act": "silu",
        "max_position_embeddings": int(positions), "rope_parameters": rope_parameters,
        "attention_bias": False, "mlp_bias": False,
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        data[key] = (hf_cfg or {}).get(key)
    return LlamaConfig(**data, dtype="float32")


def build_model(config: Any, state_dict: dict[str, torch.Tensor]) -> Any:
    """A float32 LlamaForCausalLM holding exactly `state_dict` (no random init, no missing tensors)."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = copy.deepcopy(config)
    tied = "lm_head.weight" not in state_dict
    config.tie_word_embeddings = tied
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = {k for k in model.state_dict() if not (tied and k == "lm_head.weight")}
    missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise StageError(f"checkpoint does not fill the model: missing {missing[:6]}, unexpected {unexpected[:6]}.")
    model.load_state_dict(state_dict, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = LlamaRotaryEmbedding(config=config, device=torch.device("cpu"))
    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if meta:
        raise StageError(f"reference runtime: tensors left uninitialised: {meta[:6]}")
    return model.float().eval()


# ---------------------------------------------------------------------------------------------
# Sampling


def pick_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
               generator: torch.Generator | None) -> int:
    """Greedy when temperature == 0 or top_k == 1; else temperature, top-k, then top-p (nucleus) sampling."""
    import torch

    if temperature <= 0.0 or top_k == 1:
        return int(torch.argmax(logits))
    scores = logits.float() / temperature
    if 0 < top_k < scores.numel():
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p  # the top token is always kept
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


@dataclass
class LogitControls:
    """What TensorRT-LLM applies to the logits before sampling, per request (its SamplingConfig / Request fields).

    The order is TensorRT-LLM's (`batchApplyPenalty`): temperature scaling first (done by the caller), then the
    penalties. Penalties look at the whole sequence (prompt and generated tokens), as TensorRT-LLM 1.x does by default:
    repetition divides positive logits and multiplies negative ones by `repetition_penalty` for every token seen;
    presence subtracts `presence_penalty` once per seen token, frequency `frequency_penalty` per occurrence. The end
    ids are banned until `min_tokens` tokens were generated (all of the request's end ids; TensorRT-LLM has one);
    a bad word's last token is banned when the sequence ends with the rest of it; `embedding_bias` (exactly
    vocabulary-sized, as TensorRT-LLM requires) is added before the temperature (`add_bias`).
    """

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    bad_words: list[list[int]] = field(default_factory=list)
    embedding_bias: list[float] | None = None

    @property
    def active(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.min_tokens > 0 or bool(self.bad_words) or bool(self.embedding_bias))

    def add_bias(self, logits: torch.Tensor) -> torch.Tensor:
        import torch

        logits = logits.float()
        if not self.embedding_bias:
            return logits
        if len(self.embedding_bias) != logits.numel():
            raise RequestError(f"embedding_bias has {len(self.embedding_bias)} entries, the vocabulary "
                               f"{logits.numel()}: it must have exactly one per token (as TensorRT-LLM requires).")
        return logits + torch.tensor(self.embedding_bias, dtype=logits.dtype)

    def apply(self, logits: torch.Tensor, seq: list[int], generated: int, end_ids: set[int]) -> torch.Tensor:
        """Penalties, min_tokens and bad words on (already biased and temperature-scaled) logits."""
        import torch

        logits = logits.float().clone()
        if seq and (self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty):
            ids, counts = torch.unique(torch.tensor(seq, dtype=torch.long), return_counts=True)
            seen = logits[ids]
            if self.repetition_penalty != 1.0:
                seen = torch.where(seen > 0, seen / self.repetition_penalty, seen * self.repetition_penalty)
            seen = seen - self.presence_penalty - self.frequency_penalty * counts.to(logits.dtype)
            logits[ids] = seen
        if generated < self.min_tokens:
            for end in end_ids:
                logits[end] = float("-inf")
        for word in self.bad_words:
            if word and (len(word) == 1 or seq[-(len(word) - 1):] == word[:-1]):
                logits[word[-1]] = float("-inf")
        return logits


def _ends_with(seq: list[int], stops: Sequence[Sequence[int]]) -> bool:
    return any(stop and len(seq) >= len(stop) and seq[-len(stop):] == list(stop) for stop in stops)


# ---------------------------------------------------------------------------------------------
# The runtime


@dataclass
class ReferenceRuntime:
    """A loaded checkpoint: a float32 Llama, its tokenizer and the KV-cache settings of the engine."""

    model: Any
    config: Any
    tokenizer: Any
    kv_format: str  # "fp8" | "int8" | "none"
    kv_scales: list[float] | None
    max_seq_len: int
    eos_token_ids: list[int]
    bos_token_id: int | None
    engine_dir: Path
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def prefill_chunk(self) -> int | None:
        """Tokens per prefill pass when the engine chunks long prompts (runtime.json enable_chunked_context), else
        None: the whole prompt in one pass, as an engine whose max_num_tokens covers max_input_len does."""
        if self.settings.get("enable_chunked_context") and self.settings.get("max_num_tokens"):
            return int(self.settings["max_num_tokens"])
        return None

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @classmethod
    def load(cls, engine_dir: Path, threads: int | None = None, kv_format: str | None = None,
             checkpoint: Path | None = None) -> ReferenceRuntime:
        """Load `engine_dir/runtime.json` (written by `trtkv build` for backend reference) and its checkpoint
        (or `checkpoint`: another TensorRT-LLM checkpoint folder, e.g. an edited copy)."""
        import torch
        from safetensors.torch import load_file

        if threads:
            torch.set_num_threads(threads)
        engine_dir = Path(engine_dir)
        settings = _read_json(engine_dir / RUNTIME_JSON)
        ckpt = Path(settings["checkpoint"])
        if not ckpt.is_dir() and settings.get("checkpoint_relative"):
            ckpt = (engine_dir / settings["checkpoint_relative"]).resolve()
        if checkpoint is not None:
            ckpt = Path(checkpoint)
        trt_cfg = _read_json(ckpt / "config.json")
        mapping = trt_cfg.get("mapping") or {}
        if mapping.get("world_size", 1) != 1:
            raise StageError(f"{ckpt}: world_size {mapping.get('world_size')}; the reference runtime runs TP=PP=1 "
                             f"checkpoints only. Next: calibrate with build.tp_size=1 build.pp_size=1.")
        hf_name = settings.get("hf_config")
        hf_cfg = _read_json(engine_dir / hf_name) if hf_name else None
        config = llama_config(trt_cfg, hf_cfg, ckpt / "config.json")
        tensors = load_file(str(ckpt / "rank0.safetensors"))
        model = build_model(config, trtllm_to_hf_state_dict(tensors, config))
        algo = (trt_cfg.get("quantization") or {}).get("kv_cache_quant_algo")
        if algo not in KV_FORMATS:
            raise StageError(f"{ckpt}/config.json: kv_cache_quant_algo {algo!r}; the reference runtime runs "
                             f"{[k for k in KV_FORMATS if k]} or none.")
        scales = kv_scaling_factors(tensors, config.num_hidden_layers) if algo else None
        tokenizer = None
        if settings.get("tokenizer"):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(settings["tokenizer"])
        eos = config.eos_token_id if config.eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        max_len = min(int(settings.get("max_seq_len") or config.max_position_embeddings),
                      int(config.max_position_embeddings))
        runtime = cls(model=model, config=config, tokenizer=tokenizer, kv_format=KV_FORMATS[algo], kv_scales=scales,
                      max_seq_len=max_len, eos_token_ids=eos_ids, bos_token_id=config.bos_token_id,
                      engine_dir=engine_dir, settings=settings)
        return runtime.with_kv_format(kv_format) if kv_format else runtime

    def with_kv_format(self, kv_format: str) -> ReferenceRuntime:
        """The same weights with another KV cache ("none" = unquantized float32 cache), e.g. for A/B checks."""
        if kv_format not in ("none", "fp8", "int8", "fp8_scale1"):
            raise RequestError(f"kv_format {kv_format!r}: allowed none, fp8, int8, fp8_scale1.")
        if kv_format in ("fp8", "int8") and self.kv_scales is None:
            raise RequestError(f"kv_format {kv_format}: this checkpoint has no kv_cache_scaling_factor.")
        return replace(self, kv_format=kv_format)

    def new_cache(self) -> Any:
        """A fresh KV cache for one request (quantized as the engine's, or unquantized)."""
        if self.kv_format == "none":
            from transformers import DynamicCache

            return DynamicCache(config=self.config)
        from trtkv.kvcache.cache import QuantizedKVCache

        scales = self.kv_scales if self.kv_format in ("fp8", "int8") else None
        return QuantizedKVCache(config=self.config, fmt=self.kv_format, k_scales=scales, v_scales=scales)

    def _check_request(self, input_ids: Sequence[int], max_tokens: int, temperature: float, top_k: int,
                       top_p: float) -> None:
        if not input_ids:
            raise RequestError("input_ids is empty: send at least one token.")
        if len(input_ids) >= self.max_seq_len:
            raise RequestError(f"prompt of {len(input_ids)} tokens: the limit is max_seq_len - 1 = {self.max_seq_len - 1}.")
        if max_tokens < 1:
            raise RequestError(f"max_tokens {max_tokens}: must be >= 1.")
        if temperature < 0 or top_k < 0 or not 0.0 < top_p <= 1.0:
            raise RequestError(f"sampling values temperature={temperature}, top_k={top_k}, top_p={top_p}: need "
                               f"temperature >= 0, top_k >= 0, 0 < top_p <= 1.")
        vocab = int(self.config.vocab_size)
        bad = [t for t in input_ids if not 0 <= int(t) < vocab]
        if bad:
            raise RequestError(f"token ids out of range [0, {vocab}): {bad[:5]}")

    def generate(
        self,
        input_ids: Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        end_id: int | None = None,
        stop_words: Sequence[Sequence[int]] | None = None,
        on_token: Callable[[int], bool | None] | None = None,
        controls: LogitControls | None = None,
        log_probs: list[float] | None = None,
    ) -> list[int]:
        """Generated ids only (end_id excluded, a matched stop word included); on_token(id) -> False cancels.

        `controls`: penalties, min_tokens, bad words, logit bias (TensorRT-LLM's semantics, see LogitControls).
        `log_probs`: when given, receives the log-probability of each generated token (log-softmax of the logits
        after `controls`, before temperature) as it is chosen, before on_token is called.
        """
        import torch

        self._check_request(input_ids, max_tokens, temperature, top_k, top_p)
        if controls is not None and controls.min_tokens > max_tokens:
            raise RequestError(f"min_tokens {controls.min_tokens} exceeds max_tokens {max_tokens}.")
        max_tokens = min(max_tokens, self.max_seq_len - len(input_ids))
        ends = {end_id} if end_id is not None else set(self.eos_token_ids)
        stops = [list(s) for s in (stop_words or []) if s]
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        cache = self.new_cache()
        out: list[int] = []
        with torch.inference_mode():
            step = torch.tensor([list(input_ids)], dtype=torch.long)
            chunk = self.prefill_chunk
            while chunk and step.shape[1] > chunk:  # chunked prefill: at most max_num_tokens per forward pass
                self.model(input_ids=step[:, :chunk], past_key_values=cache, use_cache=True)
                step = step[:, chunk:]
            seq = list(input_ids)
            while True:
                logits = self.model(input_ids=step, past_key_values=cache, use_cache=True).logits[0, -1]
                scale = temperature
                if controls is not None and controls.active:
                    # TensorRT-LLM's penalty kernel: bias, then 1/temperature, then the penalties
                    logits = controls.add_bias(logits)
                    if temperature > 0:
                        logits, scale = logits / temperature, 1.0
                    logits = controls.apply(logits, seq, len(out), ends)
                token = pick_token(logits, scale, top_k, top_p, generator)
                if token in ends:
                    break
                if log_probs is not None:
                    log_probs.append(float(torch.log_softmax(logits.float(), dim=-1)[token]))
                out.append(token)
                seq.append(token)
                if on_token is not None and on_token(token) is False:
                    break
                if len(out) >= max_tokens or _ends_with(out, stops):
                    break
                step = torch.tensor([[token]], dtype=torch.long)
        return out

    def generate_text(self, prompt: str, **kwargs: Any) -> str:
        """Convenience: tokenize, generate, detokenize (needs the tokenizer)."""
        if self.tokenizer is None:
            raise RequestError("this runtime has no tokenizer (runtime.json tokenizer is null): pass token ids.")
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return str(self.tokenizer.decode(self.generate(ids, **kwargs), skip_special_tokens=True))


# ---------------------------------------------------------------------------------------------
# Measurement: quantized-KV greedy answers vs unquantized ones on the shipped quiz
# (the bench's quiz prompt and scoring, trtkv.bench.quiz, so the figures compare with `trtkv bench`)


def quiz_answers(runtime: ReferenceRuntime, items: list[dict[str, str]], max_tokens: int = 10) -> list[str]:
    """Greedy answers (first line, stripped) to the bench's few-shot capital-city prompt of each item."""
    from trtkv.bench import quiz

    if runtime.tokenizer is None:
        raise RequestError("quiz answers need the tokenizer.")
    newline = runtime.tokenizer("\n", add_special_tokens=False)["input_ids"]
    answers = []
    for item in items:
        prompt = quiz.few_shot_prompt(quiz.render(item["question"]))
        ids = runtime.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out = runtime.generate(ids, max_tokens=max_tokens, stop_words=[newline])
        answers.append(str(runtime.tokenizer.decode(out, skip_special_tokens=True)).strip().split("\n")[0].strip())
    return answers


def quiz_agreement(runtime: ReferenceRuntime, items: list[dict[str, str]], max_tokens: int = 10) -> dict[str, Any]:
    """How often the runtime's KV format gives the same greedy quiz answer as an unquantized KV cache (+ accuracy)."""
    from trtkv.bench import quiz

    quantized = quiz_answers(runtime, items, max_tokens)
    baseline = quiz_answers(runtime.with_kv_format("none"), items, max_tokens)
    same = [a == b for a, b in zip(quantized, baseline, strict=True)]
    fmt = runtime.kv_format
    return {"kv_format": fmt, "items": len(items), "agree": sum(same), "agreement": sum(same) / max(1, len(items)),
            "accuracy": {fmt: sum(quiz.is_correct(it["answer"], a) for it, a in zip(items, quantized, strict=True))
                         / max(1, len(items)),
                         "none": sum(quiz.is_correct(it["answer"], b) for it, b in zip(items, baseline, strict=True))
                         / max(1, len(items))},
            "differences": [{"question": quiz.render(it["question"]), fmt: a, "none": b}
                            for it, a, b, s in zip(items, quantized, baseline, same, strict=True) if not s]}


def _main(argv: list[str] | None = None) -> int:
    """`python -m trtkv.runtime ENGINE_DIR [--items N]`: print the quiz agreement of the engine's KV format."""
    import argparse
    import time

    from trtkv.data import quiz_items

    parser = argparse.ArgumentParser(prog="python -m trtkv.runtime", description=_main.__doc__)
    parser.add_argument("engine_dir", type=Path)
    parser.add_argument("--items", type=int, default=0, help="first N quiz items (0 = all)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    items = quiz_items()
    items = items[: args.items] if args.items else items
    start = time.time()
    runtime = ReferenceRuntime.load(args.engine_dir, threads=args.threads)
    result = quiz_agreement(runtime, items)
    result["seconds"] = round(time.time() - start, 1)
    acc = result["accuracy"]
    print(f"{result['kv_format']} KV vs unquantized KV: {result['agree']}/{result['items']} greedy quiz answers agree "
          f"({100 * result['agreement']:.1f}%); quiz accuracy {acc[result['kv_format']]:.3f} vs {acc['none']:.3f}; "
          f"{result['seconds']} s")
    for d in result["differences"][:20]:
        print(f"  {d['question']}: {d[result['kv_format']]!r} vs {d['none']!r}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main())
