"""ReferenceRuntime: load runtime.json and its TensorRT-LLM checkpoint, then generate with the
quantized KV cache (see the package docstring, trtkv.runtime, for what it reproduces of an engine
and what not)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError
from trtkv.runtime.checkpoint import (
    RUNTIME_JSON,
    build_model,
    kv_format_for_algo,
    kv_scaling_factors,
    llama_config,
    read_json,
    trtllm_to_hf_state_dict,
)
from trtkv.runtime.errors import RequestError


def eos_ids(config: Any, tokenizer: Any) -> list[int]:
    """The end ids: config.json's eos_token_id (one or a list), else the tokenizer's."""
    eos = config.eos_token_id
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    return [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]


@dataclass
class ReferenceRuntime:
    """A loaded checkpoint: a float32 Llama or Gemma 3, its tokenizer and the KV-cache settings of
    the engine."""

    model: Any
    config: Any
    tokenizer: Any
    kv_format: str  # "fp8" | "int8" | "fp8_scale1" | "none"
    # per layer: the TensorRT-LLM checkpoint's kv_cache_scaling_factor (K and V)
    kv_scales: list[float] | None
    max_seq_len: int
    eos_token_ids: list[int]
    bos_token_id: int | None
    engine_dir: Path
    settings: dict[str, Any] = field(default_factory=dict)
    # the HF export's per-layer (k_scale, v_scale), FP8 amax/448: used by kv_format "fp8" when
    # kv_scales is None
    export_kv_scales: tuple[list[float], list[float]] | None = None

    @property
    def batch_invariant(self) -> bool:
        """Run the in-flight batch through trtkv.runtime.invariant (every greedy answer equal to its
        solo answer bit for bit, whatever shares its steps and however its prompt is chunked): the
        default. runtime.json `batch_invariant: false` or TRTKV_BATCH_INVARIANT=0 selects the plain
        batched path (=1 forces it on; the environment wins over the file), whose answers can change
        with the batch (docs/where-it-runs.md)."""
        import os

        env = os.environ.get("TRTKV_BATCH_INVARIANT")
        if env in ("0", "1"):
            return env == "1"
        value = self.settings.get("batch_invariant", True)
        return bool(value)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def prefill_chunk(self) -> int | None:
        """Tokens per prefill pass when the engine chunks long prompts (runtime.json
        enable_chunked_context), else None: the whole prompt in one pass, as an engine whose
        max_num_tokens covers max_input_len does."""
        if self.settings.get("enable_chunked_context") and self.settings.get("max_num_tokens"):
            return int(self.settings["max_num_tokens"])
        return None

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @classmethod
    def load(
        cls,
        engine_dir: Path,
        threads: int | None = None,
        kv_format: str | None = None,
        checkpoint: Path | None = None,
    ) -> ReferenceRuntime:
        """Load `engine_dir/runtime.json` (written by `trtkv build` for backend reference) and its
        checkpoint (or `checkpoint`: another TensorRT-LLM checkpoint folder, e.g. an edited
        copy)."""
        import torch
        from safetensors.torch import load_file

        if threads:
            torch.set_num_threads(threads)
        engine_dir = Path(engine_dir)
        settings = read_json(engine_dir / RUNTIME_JSON)
        if settings.get("hf_checkpoint") and checkpoint is None:
            return cls._load_hf_engine(engine_dir, settings, threads, kv_format)
        ckpt = Path(settings["checkpoint"])
        if not ckpt.is_dir() and settings.get("checkpoint_relative"):
            ckpt = (engine_dir / settings["checkpoint_relative"]).resolve()
        if checkpoint is not None:
            ckpt = Path(checkpoint)
        trt_cfg = read_json(ckpt / "config.json")
        mapping = trt_cfg.get("mapping") or {}
        if mapping.get("world_size", 1) != 1:
            raise StageError(
                f"{ckpt}: world_size {mapping.get('world_size')}; the reference runtime runs "
                "TP=PP=1 checkpoints only. Next: calibrate with build.tp_size=1 build.pp_size=1."
            )
        hf_name = settings.get("hf_config")
        hf_cfg = read_json(engine_dir / hf_name) if hf_name else None
        config = llama_config(trt_cfg, hf_cfg, ckpt / "config.json")
        tensors = load_file(str(ckpt / "rank0.safetensors"))
        model = build_model(config, trtllm_to_hf_state_dict(tensors, config))
        algo = (trt_cfg.get("quantization") or {}).get("kv_cache_quant_algo")
        kv_format = kv_format_for_algo(algo, ckpt / "config.json")
        scales = kv_scaling_factors(tensors, config.num_hidden_layers) if algo else None
        tokenizer = None
        if settings.get("tokenizer"):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(settings["tokenizer"])
        max_len = min(
            int(settings.get("max_seq_len") or config.max_position_embeddings),
            int(config.max_position_embeddings),
        )
        runtime = cls(
            model=model,
            config=config,
            tokenizer=tokenizer,
            kv_format=kv_format,
            kv_scales=scales,
            max_seq_len=max_len,
            eos_token_ids=eos_ids(config, tokenizer),
            bos_token_id=config.bos_token_id,
            engine_dir=engine_dir,
            settings=settings,
        )
        return runtime.with_kv_format(kv_format) if kv_format else runtime

    @classmethod
    def _load_hf_engine(
        cls, engine_dir: Path, settings: dict[str, Any], threads: int | None, kv_format: str | None
    ) -> ReferenceRuntime:
        """runtime.json of the reference backend pointing at an HF export (`hf_checkpoint`: a model,
        e.g. Gemma 3, with no TensorRT-LLM checkpoint): read as TensorRT-LLM's PyTorch backend reads
        it (load_hf)."""
        hf_dir = Path(settings["hf_checkpoint"])
        if not hf_dir.is_dir() and settings.get("hf_checkpoint_relative"):
            hf_dir = (engine_dir / settings["hf_checkpoint_relative"]).resolve()
        runtime = cls.load_hf(
            hf_dir,
            threads=threads,
            max_seq_len=settings.get("max_seq_len"),
            max_num_tokens=settings.get("max_num_tokens"),
            enable_chunked_prefill=bool(settings.get("enable_chunked_context")),
            tokenizer=settings.get("tokenizer"),
        )
        runtime = replace(runtime, engine_dir=engine_dir, settings={**runtime.settings, **settings})
        return runtime.with_kv_format(kv_format) if kv_format else runtime

    @classmethod
    def load_hf(
        cls,
        hf_dir: Path,
        *,
        threads: int | None = None,
        kv_dtype: str = "auto",
        max_seq_len: int | None = None,
        max_num_tokens: int | None = None,
        enable_chunked_prefill: bool = False,
        tokenizer: str | Path | None = None,
    ) -> ReferenceRuntime:
        """Load ModelOpt's unified HF checkpoint (the LLM API's artifact) as TensorRT-LLM's PyTorch
        backend does: FP8 weights times weight_scale, and an FP8 KV cache with scale 1.0: that
        backend ignores the exported k_scale/v_scale for FP8 (it loads them for NVFP4 only;
        trtkv.runtime.hf_checkpoint); they are kept in export_kv_scales for with_kv_format("fp8")
        (vLLM's semantics: K and V scaled apart). `kv_dtype` is kv_cache_config.dtype: auto (the
        checkpoint's kv_cache_quant_algo) or fp8. Llama or Gemma 3 (trtkv.runtime.gemma3)."""
        import torch
        from transformers import AutoTokenizer

        from trtkv.runtime import hf_checkpoint as hf

        if threads:
            torch.set_num_threads(threads)
        hf_dir = Path(hf_dir)
        weight_algo, kv_algo = hf.quant_config(hf_dir)
        where = hf_dir / hf.QUANT_CONFIG
        if weight_algo not in hf.WEIGHT_ALGOS:
            raise StageError(
                f"{where}: quant_algo {weight_algo!r}; the reference engine runs FP8 or "
                "unquantized weights."
            )
        if kv_dtype not in ("auto", "fp8"):
            raise StageError(
                f"kv_cache_config.dtype {kv_dtype!r}: the reference engine runs auto or fp8."
            )
        if kv_dtype == "fp8" and kv_algo is None:
            raise StageError(
                f"kv_cache_config.dtype fp8, but {hf_dir} has no FP8 KV scales "
                "(kv_cache_quant_algo null). Next: calibrate with quantization.kv_cache fp8."
            )
        if kv_algo not in hf.KV_ALGOS:
            raise StageError(
                f"{where}: kv_cache_quant_algo {kv_algo!r}; the reference engine runs FP8 or none."
            )
        config = hf.hf_model_config(hf_dir)
        tensors = hf.load_tensors(hf_dir)
        model = hf.build_hf_model(config, hf.dequantized_state_dict(tensors, weight_algo, hf_dir))
        export_scales = None
        # exported for vLLM; TensorRT-LLM's PyTorch backend runs FP8 KV with scale 1.0
        if kv_algo is not None:
            export_scales = hf.kv_scales(tensors, config.num_hidden_layers, hf_dir)
        del tensors
        source = Path(tokenizer) if tokenizer else hf_dir
        has_tokenizer = (source / "tokenizer_config.json").is_file() or (
            source / "tokenizer.json"
        ).is_file()
        # None: token ids only
        tok = AutoTokenizer.from_pretrained(str(source)) if has_tokenizer else None
        limit = int(config.max_position_embeddings)
        seq_len = min(max_seq_len or limit, limit)
        settings: dict[str, Any] = {
            "backend": "llmapi",
            "hf_checkpoint": str(hf_dir),
            "max_seq_len": seq_len,
            "max_num_tokens": max_num_tokens,
            "enable_chunked_context": enable_chunked_prefill,
            "kv_scale_semantics": "TensorRT-LLM PyTorch backend: FP8 KV with scale 1.0 (the "
            "exported k_scale/v_scale are read for NVFP4 only)",
        }
        kv_format = "fp8_scale1" if kv_algo == "FP8" or kv_dtype == "fp8" else "none"
        return cls(
            model=model,
            config=config,
            tokenizer=tok,
            kv_format=kv_format,
            kv_scales=None,
            max_seq_len=seq_len,
            eos_token_ids=eos_ids(config, tok),
            bos_token_id=config.bos_token_id,
            engine_dir=hf_dir,
            settings=settings,
            export_kv_scales=export_scales,
        )

    def with_kv_format(self, kv_format: str) -> ReferenceRuntime:
        """The same weights with another KV cache ("none" = unquantized float32 cache; "bf16"/"fp16"
        a 16-bit one), e.g. for A/B checks."""
        if kv_format not in ("none", "bf16", "fp16", "fp8", "int8", "fp8_scale1"):
            raise RequestError(
                f"kv_format {kv_format!r}: allowed none, bf16, fp16, fp8, int8, fp8_scale1."
            )
        if kv_format == "int8" and self.kv_scales is None:
            raise RequestError(
                "kv_format int8: this checkpoint has no kv_cache_scaling_factor (an HF export's "
                "k_scale/v_scale are FP8 scales, amax/448). Next: fp8, fp8_scale1 or none."
            )
        if kv_format == "fp8" and self.kv_scales is None and self.export_kv_scales is None:
            raise RequestError(
                "kv_format fp8: this checkpoint has no kv_cache_scaling_factor and no "
                "k_scale/v_scale."
            )
        return replace(self, kv_format=kv_format)

    def new_cache(self) -> Any:
        """A fresh KV cache for one request (quantized as the engine's, or unquantized);
        sliding-window layers (Gemma 3) keep only their window, as the engines' caches do."""
        if self.kv_format == "none":
            from transformers import DynamicCache

            return DynamicCache(config=self.config)
        from trtkv.kvcache.cache import QuantizedKVCache

        k_scales = v_scales = None
        if self.kv_format in ("fp8", "int8"):
            if self.kv_scales is not None:  # TensorRT-LLM <= 1.2: one scale per layer for K and V
                k_scales = v_scales = self.kv_scales
            elif self.export_kv_scales is not None:  # vLLM on the HF export: K and V apart
                k_scales, v_scales = self.export_kv_scales
        return QuantizedKVCache(
            config=self.config,
            fmt=self.kv_format,
            k_scales=k_scales,
            v_scales=v_scales,
            # each token dequantized once, not at every decode step
            keep_decoded=True,
        )

    def check_request(
        self,
        input_ids: Sequence[int],
        max_tokens: int,
        temperature: float,
        top_k: int,
        top_p: float,
    ) -> None:
        if not input_ids:
            raise RequestError("input_ids is empty: send at least one token.")
        if len(input_ids) >= self.max_seq_len:
            raise RequestError(
                f"prompt of {len(input_ids)} tokens: the limit is max_seq_len - 1 = "
                f"{self.max_seq_len - 1}."
            )
        if max_tokens < 1:
            raise RequestError(f"max_tokens {max_tokens}: must be >= 1.")
        if temperature < 0 or top_k < 0 or not 0.0 < top_p <= 1.0:
            raise RequestError(
                f"sampling values temperature={temperature}, top_k={top_k}, top_p={top_p}: need "
                f"temperature >= 0, top_k >= 0, 0 < top_p <= 1."
            )
        vocab = int(self.config.vocab_size)
        bad = [t for t in input_ids if not 0 <= int(t) < vocab]
        if bad:
            raise RequestError(f"token ids out of range [0, {vocab}): {bad[:5]}")

    def generate(self, input_ids: Sequence[int], **kwargs: Any) -> list[int]:
        """Generated ids only (end_id excluded, a matched stop word included); the keyword arguments
        are make_sequence's (max_tokens, sampling, end_id, stop_words, on_token -> False cancels,
        LogitControls, log_probs: each chosen token's log-probability after `controls`)."""
        from trtkv.runtime.batch import make_sequence, run_solo

        return run_solo(self, make_sequence(self, input_ids, **kwargs))

    def generate_text(self, prompt: str, **kwargs: Any) -> str:
        """Convenience: tokenize, generate, detokenize (needs the tokenizer)."""
        if self.tokenizer is None:
            raise RequestError(
                "this runtime has no tokenizer (runtime.json tokenizer is null): pass token ids."
            )
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return str(self.tokenizer.decode(self.generate(ids, **kwargs), skip_special_tokens=True))
