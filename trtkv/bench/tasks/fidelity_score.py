"""Teacher-forced re-scoring for the fidelity task: the 16-bit reference and the format's prediction
on the served tokens, cached per document.

Both scorers run prefix + served continuation through a float32 Llama in one pass and keep, per
continuation position, the log-probability of the served token, the argmax, their own top-k and
their log-probabilities at the served top-k tokens (when the protocol gave them). The reference is
the recipe's original 16-bit weights in transformers with an unquantized cache (as golden.py); the
prediction is the weights the engine serves (the checkpoint's, FP8 dequantized as the engine reads
them) with the recipe's KV format stored by trtkv.kvcache with the calibrated scales of
kv_scales.json as that engine applies them (`engine_semantics`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError
from trtkv.recipe import Recipe
from trtkv.recipe.backend_rules import BACKEND_ROWS
from trtkv.recipe.layout import HF

TOP_K = 5
REFERENCE_PRODUCER = (
    "transformers AutoModelForCausalLM, the recipe's original 16-bit weights computed in float32, "
    "unquantized KV cache (DynamicCache), teacher-forced on the served tokens"
)


@dataclass
class Served:
    """One document as served: prompt ids (as the server's preprocessing makes them), continuation
    and its log-probs."""

    prefix_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    # per position {token id: log-prob} (OpenAI top_logprobs)
    top: list[dict[int, float]] | None = None
    error: str | None = None


@dataclass
class Scored:
    """A scorer's view of one document's continuation positions."""

    chosen: list[float]  # log p of the served token
    argmax: list[int]
    top: list[dict[int, float]]  # the scorer's own top-k
    at: list[dict[int, float]] | None  # its log p at the tokens asked for (the engines' top-k)

    def to_json(self) -> dict[str, Any]:
        def keyed(rows: list[dict[int, float]] | None) -> list[dict[str, float]] | None:
            return None if rows is None else [{str(k): v for k, v in r.items()} for r in rows]

        return {
            "chosen": self.chosen,
            "argmax": self.argmax,
            "top": keyed(self.top),
            "at": keyed(self.at),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Scored:
        def ints(rows: list[dict[str, float]] | None) -> list[dict[int, float]] | None:
            return (
                None if rows is None else [{int(k): float(v) for k, v in r.items()} for r in rows]
            )

        return cls(doc["chosen"], doc["argmax"], ints(doc["top"]) or [], ints(doc["at"]))


def teacher_forced(
    model: Any,
    new_cache: Callable[[], Any],
    served: Served,
    want: list[set[int]] | None = None,
    k: int = TOP_K,
) -> Scored:
    """One pass over prefix + continuation; at the positions that predict each continuation token:
    the served token's log p, the argmax, the top-k and the log p of the tokens in `want` (per
    position)."""
    return teacher_forced_nested(model, new_cache, [(served, want)], k)[0]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def teacher_forced_nested(
    model: Any,
    new_cache: Callable[[], Any],
    items: Sequence[tuple[Served, list[set[int]] | None]],
    k: int = TOP_K,
    attention: Callable[[Any, Any, Served], Any] | None = None,
) -> list[Scored]:
    """teacher_forced for documents that share a prefix (one document cut to several lengths):
    longest first, each next one keeps the cache's tokens it shares (up to its last prompt token)
    and runs only the rest. Causal attention and a per-token KV format make that what a fresh pass
    computes; a cache that cannot be cropped (KIVI, sliding windows) gets a fresh pass.
    `attention(model, cache, served)`: a context the document's pass runs in (an engine attention
    mode, trtkv.kvcache.attention_hook: the prompt through its prefill kernel, the continuation
    through its decode kernel); every document then gets a fresh pass."""
    from contextlib import nullcontext

    import torch

    from trtkv.core.errors import TrtkvError

    order = sorted(
        range(len(items)), key=lambda i: -len(items[i][0].prefix_ids) - len(items[i][0].ids)
    )
    out: list[Scored | None] = [None] * len(items)
    cache: Any = None
    fed: list[int] = []
    for i in order:
        served, want = items[i]
        seq = served.prefix_ids + served.ids
        p0, n = len(served.prefix_ids) - 1, len(served.ids)
        keep = min(_common(fed, seq), p0) if cache is not None and attention is None else 0
        if keep > 0:
            try:
                cache.crop(keep)
            except (TrtkvError, AttributeError, NotImplementedError):
                keep = 0
        if keep == 0:
            cache = new_cache()
        with (
            torch.inference_mode(),
            attention(model, cache, served) if attention else nullcontext(),
        ):
            hidden = model.model(
                input_ids=torch.tensor([seq[keep:]]), past_key_values=cache, use_cache=True
            ).last_hidden_state
            lp = torch.log_softmax(
                model.lm_head(hidden[0, p0 - keep : p0 - keep + n]).float(), dim=-1
            )
        fed = seq
        target = torch.tensor(served.ids)
        chosen = lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        vals, idx = lp.topk(k, dim=-1)
        top = [
            dict(zip(map(int, j), map(float, v), strict=True))
            for j, v in zip(idx, vals, strict=True)
        ]
        at = (
            None
            if want is None
            else [{t: float(lp[j, t]) for t in sorted(row)} for j, row in enumerate(want)]
        )
        out[i] = Scored([float(x) for x in chosen], [int(x) for x in lp.argmax(-1)], top, at)
    return [x for x in out if x is not None]


def doc_key(scorer_key: str, served: Served, want: list[set[int]] | None) -> str:
    tokens = None if want is None else [sorted(r) for r in want]
    blob = json.dumps([scorer_key, served.prefix_ids, served.ids, tokens]).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


# scorer models kept for the process (two: the last used)
_LOADED: dict[str, tuple[Any, Callable[[], Any]]] = {}
_KEEP_LOADED = 2


class CachedScorer:
    """A scorer whose results are kept in one JSON file per scorer (keyed by its key and the
    document's tokens); the model is loaded only when a document is not cached; with a `model_id`
    (its files) once per process (the last two such models stay loaded: one bench or test loads the
    reference and the prediction once)."""

    def __init__(
        self,
        name: str,
        key: str,
        path: Path,
        load: Callable[[], tuple[Any, Callable[[], Any]]],
        info: dict[str, str],
        model_id: str = "",
        attention: Callable[[Any, Any, Served], Any] | None = None,
    ) -> None:
        self.name, self.key, self.path, self._load, self.info = name, key, path, load, info
        self.attention = attention
        # "": this instance's own model only
        self.model_id = f"{name}:{key}:{model_id}" if model_id else ""
        self._own: tuple[Any, Callable[[], Any]] | None = None
        self.computed = 0
        self.load_seconds = 0.0
        try:
            doc = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, json.JSONDecodeError):
            doc = {}
        self._cache: dict[str, Any] = doc.get("docs", {}) if doc.get("key") == key else {}

    def _model(self) -> tuple[Any, Callable[[], Any]]:
        import time

        import torch

        from trtkv.platform.host import auto_threads

        # 1 on a busy machine (a local server's threads): OpenMP spins
        torch.set_num_threads(auto_threads())
        if not self.model_id:
            if self._own is None:
                t = time.time()
                self._own = self._load()
                self.load_seconds += time.time() - t
            return self._own
        if self.model_id not in _LOADED:
            t = time.time()
            while len(_LOADED) >= _KEEP_LOADED:
                _LOADED.pop(next(iter(_LOADED)))
            _LOADED[self.model_id] = self._load()
            self.load_seconds += time.time() - t
        _LOADED[self.model_id] = _LOADED.pop(self.model_id)  # most recently used last
        return _LOADED[self.model_id]

    def model(self) -> tuple[Any, Callable[[], Any]]:
        """(the scorer's model, a function making its fresh cache), loaded on first use."""
        return self._model()

    def score(self, served: Served, want: list[set[int]] | None = None) -> Scored:
        return self.score_nested([(served, want)])[0]

    def score_nested(self, items: Sequence[tuple[Served, list[set[int]] | None]]) -> list[Scored]:
        """Scores of documents that may share prefixes (teacher_forced_nested); cached ones are not
        recomputed."""
        keys = [doc_key(self.key, s, w) for s, w in items]
        todo = [i for i, k in enumerate(keys) if k not in self._cache]
        if todo:
            model, new_cache = self._model()
            scored_all = teacher_forced_nested(
                model, new_cache, [items[i] for i in todo], attention=self.attention
            )
            for i, scored in zip(todo, scored_all, strict=True):
                self._cache[keys[i]] = scored.to_json()
            self.computed += len(todo)
        return [Scored.from_json(self._cache[k]) for k in keys]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"key": self.key, "info": self.info, "docs": self._cache}))
        tmp.replace(self.path)


def _digest(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        if p.is_file():
            h.update(p.name.encode() + str(p.stat().st_size).encode() + p.read_bytes()[: 1 << 16])
    return h.hexdigest()[:16]


def reference_scorer(model_dir: Path, folder: Path) -> CachedScorer:
    """The 16-bit model in transformers (float32 compute, unquantized cache)."""

    def load() -> tuple[Any, Callable[[], Any]]:
        import torch
        from transformers import AutoModelForCausalLM, DynamicCache

        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch.float32, local_files_only=True
        ).eval()
        return model, lambda: DynamicCache(config=model.config)

    key = (
        _digest([model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))])
        + REFERENCE_PRODUCER
    )
    return CachedScorer(
        "reference",
        key,
        folder / "reference.json",
        load,
        {"producer": REFERENCE_PRODUCER, "model_dir": str(model_dir)},
        str(model_dir),
    )


def kv_scales_for(
    how: str, layers: Sequence[Any], kv_format: str
) -> tuple[str, list[float] | None, list[float] | None]:
    """(cache format, k scales, v scales) for QuantizedKVCache: kv_scales.json's layers as an
    engine applies them (`how`: its ScaleUse.how)."""
    if how == "one" and kv_format == "fp8":
        return "fp8_scale1", None, None
    if how == "split":
        return kv_format, [x.k_scale for x in layers], [x.v_scale for x in layers]
    shared = [x.kv_cache_scaling_factor for x in layers]
    return kv_format, shared, list(shared)


def prediction_scorer(recipe: Recipe, folder: Path, log: Callable[[str], None]) -> CachedScorer:
    """The recipe's format as its engine implements it: the served weights + trtkv.kvcache with
    kv_scales.json."""
    from trtkv.contracts.artifacts import KVScalesFile
    from trtkv.recipe import layout

    kv = recipe.kv_row.choice.name
    use = BACKEND_ROWS[recipe.build.backend].scale_use
    engine = use.name
    ckpt = layout.checkpoint_dir(recipe)
    scales = KVScalesFile.load(ckpt)
    if scales is None or not scales.layers:
        raise StageError(
            f"fidelity: {KVScalesFile.path(ckpt)} is missing or holds no layers, so the format's "
            f"prediction has no calibrated scales. Next: run `trtkv calibrate {recipe.name}`."
        )
    fmt, ks, vs = kv_scales_for(use.how, scales.layers, kv)
    rank = ckpt / "rank0.safetensors"
    hf = ckpt / HF
    weights = (
        "TensorRT-LLM checkpoint (dequantized as the engine reads it)"
        if rank.is_file()
        else "HF export"
    )
    if not rank.is_file() and not hf.is_dir():
        raise StageError(
            f"fidelity: neither {rank} nor {hf} exists, so the prediction has no served weights. "
            f"Next: run `trtkv calibrate {recipe.name}`."
        )

    def load() -> tuple[Any, Callable[[], Any]]:
        from trtkv.kvcache.cache import QuantizedKVCache
        from trtkv.runtime.engine import ReferenceRuntime

        log(f"fidelity: loading the prediction's model ({weights}, KV {fmt} as {engine}) ...")
        if rank.is_file():
            model, config = _trtllm_model(ckpt)
        else:
            rt = ReferenceRuntime.load_hf(hf)
            model, config = rt.model, rt.config
        return model, lambda: QuantizedKVCache(config=config, fmt=fmt, k_scales=ks, v_scales=vs)

    from trtkv.recipe.engine_attention import recipe_mode

    mode, why = recipe_mode(recipe)
    key = (
        _digest([ckpt / "config.json", rank, KVScalesFile.path(ckpt)])
        + f"{fmt}:{engine}"
        + ("" if mode == "cache_only" else f":{mode}")
    )
    return CachedScorer(
        "predicted",
        key,
        folder / "predicted.json",
        load,
        {
            "weights": f"{weights} in {ckpt}",
            "kv_format": fmt,
            "engine": engine,
            "scales": f"{KVScalesFile.path(ckpt)} ({use.fields})",
            "semantics": use.text,
            "attention": mode,
            "attention_why": why,
        },
        str(ckpt),
        None if mode == "cache_only" else engine_attention_for(mode),
    )


def engine_attention_for(mode_name: str) -> Callable[[Any, Any, Served], Any]:
    """A document's pass under an engine attention mode: its prompt through the prefill kernel, the
    served continuation through the decode kernel (trtkv.kvcache.attention_hook), as the engine
    computed them."""

    def attention(model: Any, cache: Any, served: Served) -> Any:
        from trtkv.kvcache.attention_hook import EngineRun, engine_attention, q_scales_for
        from trtkv.kvcache.attention_modes import load_attention

        mode = load_attention().mode(mode_name)
        return engine_attention(
            model, EngineRun(mode, cache, len(served.prefix_ids), q_scales_for(cache, mode))
        )

    return attention


def _trtllm_model(ckpt: Path) -> tuple[Any, Any]:
    from safetensors.torch import load_file

    from trtkv.runtime.checkpoint import (
        build_model,
        llama_config,
        read_json,
        trtllm_to_hf_state_dict,
    )

    hf_cfg = ckpt / HF / "config.json"
    config = llama_config(
        read_json(ckpt / "config.json"),
        read_json(hf_cfg) if hf_cfg.is_file() else None,
        ckpt / "config.json",
    )
    tensors = load_file(str(ckpt / "rank0.safetensors"))
    return build_model(config, trtllm_to_hf_state_dict(tensors, config)), config
