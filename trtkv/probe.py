"""`trtkv probe`: KV-cache precision vs context length, measured on the recipe's real model.

For each format and context length, on long natural text (calibration_data/eval, never used for calibration):
KL divergence of next-token distributions to the unquantized model (mean and last quarter of positions), perplexity
and its change, top-1 agreement, measured KV bytes per token, clipping rate of static scales; needle retrieval
(a random passkey at several depths); and the scale-reuse experiment (scales from short prompts applied at long
context and through decode steps). Writes probe.json, probe.md and PNG plots; per-(format, length) results are
cached under cache/ so an interrupted sweep resumes.

Method (also written into probe.md):
- Reference: the model (float32 compute) with K/V stored as float16 (`fp16`); its own KL is 0 by construction.
- Every format runs through QuantizedKVCache, where each query attends to the quantized K/V of all positions up
  to and including its own: the view of a decode step. Per-token formats quantize each token independently, so
  one causal pass over the text equals token-by-token decoding exactly. KIVI's fp16 window depends on the query
  position, so KIVI text is fed in 128-token chunks aligned with its window flushes: each token sees the quantized
  history plus the full-precision window, as in decoding.
- One pass at the longest length serves every shorter length: the first L positions of a causal pass are the pass
  over the first L tokens. Metrics at length L use the predictions of tokens 1..L-1.
- Needles are scored teacher-forced: retrieval counts when the greedy prediction of every passkey digit is right
  (exactly what greedy generation would produce). Seeds share the haystack before the needle (one prefix pass).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trtkv import __version__ as trtkv_version
from trtkv.errors import StageError, TrtkvError
from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.formats import KVFormat, kv_bytes_per_token
from trtkv.kvcache.quant import KIVI_RESIDUAL, FormatChoice, parse_format
from trtkv.kvcache.scales import KVScales, calibrate_scales, load_kv_scales

if TYPE_CHECKING:
    from trtkv.recipe import Recipe

METHOD_VERSION = 3  # bump when the numbers a cached result holds would change
REFERENCE = "fp16"
LOGIT_CHUNK = 512
DECODE_PROMPT = 1024
DECODE_STEPS = 32
NEEDLE_DEFAULT_MAX = 512  # default needle lengths: the longest sweep length <= this (keeps the default sweep ~15 min)
SEMANTICS = {
    "fp16": "reference: K/V stored as float16 (float32 compute); KL 0 by construction",
    "bf16": "K/V stored as bfloat16 (what a bf16 deployment of this model caches)",
    "fp8": "HF/vLLM: E4M3, separate static K and V scales per layer = calibrated amax/448 (unclamped), x/scale "
           "saturated at +-448",
    "fp8_scale1": "vLLM without scales (scale 1.0); also TensorRT-LLM <= 1.2 whenever the model's KV amax < 448, "
                  "because ModelOpt clamps the exported FP8 kv_cache_scaling_factor to >= 1.0",
    "int8": "TensorRT-LLM int8_kv_cache: ONE static scale per layer shared by K and V = max(k_amax, v_amax)/127, "
            "round-half-even(x * 1/scale), saturated to [-128, 127]",
    "int8_split": "trtkv variant: int8 with separate static K and V scales (amax/127 each); no TensorRT-LLM <= 1.2 "
                  "equivalent",
    "int8_token": "dynamic symmetric INT8 per (token, head), float16 scale (no calibration; an 8-bit upper bound)",
    "int4_g32": "asymmetric INT4 per token, groups of 32 channels, float16 scale + zero point",
    "int4_g64": "asymmetric INT4 per token, groups of 64 channels, float16 scale + zero point",
    "int4_g128": "asymmetric INT4 per token, groups of 128 channels (= head_dim 64 here), float16 scale + zero point",
    "kivi4": "KIVI 4-bit: K per channel over 32-token groups, V per token over 32-channel groups, 128-token fp16 window",
    "kivi2": "KIVI 2-bit: K per channel over 32-token groups, V per token over 32-channel groups, 128-token fp16 window",
}


@dataclass
class ProbeSettings:
    """What one probe run measures."""

    formats: list[str]
    lengths: list[int]
    needle_lengths: list[int]
    needle_depths: list[float]
    needle_seeds: int
    decode_prompt: int = DECODE_PROMPT
    decode_steps: int = DECODE_STEPS
    scales_path: Path | None = None
    threads: int | None = None
    progress: bool = True


@dataclass
class Loaded:
    """The model, its tokenizer and the text the probe runs on."""

    model: Any
    tokenizer: Any
    device: torch.device
    model_dir: Path
    text_ids: list[int]
    haystack_ids: list[int]
    key: str
    info: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- settings


def default_settings(recipe: Recipe, formats: list[str] | None = None, lengths: list[int] | None = None,
                     needle_lengths: list[int] | None = None) -> ProbeSettings:
    """Settings from the recipe's probe section, overridden by the CLI's lists."""
    fmts = [parse_format(f).name for f in (formats or [f.value for f in recipe.probe.formats])]
    fmts = [REFERENCE] + [f for f in dict.fromkeys(fmts) if f != REFERENCE]
    lens = sorted(set(lengths or recipe.probe.lengths))
    max_pos = recipe.model.max_position_embeddings
    if max_pos and max(lens) > max_pos:
        raise TrtkvError(f"probe lengths {lens}: {max(lens)} exceeds the model's max_position_embeddings {max_pos}. "
                         f"Next: pass --lengths up to {max_pos}.")
    if any(n < 16 for n in lens):
        raise TrtkvError(f"probe lengths {lens}: every length must be >= 16 tokens.")
    if needle_lengths is None:
        short = [n for n in lens if n <= NEEDLE_DEFAULT_MAX]
        needle_lengths = [max(short)] if short else [min(lens)]
    if any(n < 64 for n in needle_lengths):
        raise TrtkvError(f"needle lengths {needle_lengths}: each must be >= 64 tokens (haystack + passkey + question).")
    return ProbeSettings(formats=fmts, lengths=lens, needle_lengths=sorted(set(needle_lengths)),
                         needle_depths=list(recipe.probe.needle_depths), needle_seeds=recipe.probe.needle_seeds)


# ----------------------------------------------------------------------------- loading


def _file_digest(path: Path, limit: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(limit))
    h.update(str(path.stat().st_size).encode())
    return h.hexdigest()[:16]


def load_model(recipe: Recipe, settings: ProbeSettings) -> Loaded:
    """The recipe's model in float32 (CUDA when present), its tokenizer and the eval text as token ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtkv.data import EVAL_LONG_TEXT, eval_long_text
    from trtkv.model import resolve_model_dir
    from trtkv.paths import project_root

    torch.set_num_threads(settings.threads or auto_threads())
    model_dir = resolve_model_dir(recipe)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = model.to(device).eval()  # type: ignore[arg-type]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    texts = eval_long_text()
    need = max(settings.lengths)
    text_ids = _tokens(tokenizer, texts, need)
    # the needle's haystack: another part of the text (none needed with --no-needle)
    haystack_ids = (_tokens(tokenizer, list(reversed(texts)), max(settings.needle_lengths))
                    if settings.needle_lengths else [])
    weights = sorted(model_dir.glob("*.safetensors"))
    key_src = {"config": (model_dir / "config.json").read_text(),
               "weights": [(w.name, w.stat().st_size) for w in weights],
               "eval": _file_digest(project_root() / EVAL_LONG_TEXT), "method": METHOD_VERSION,
               "device": device.type}
    key = hashlib.sha256(json.dumps(key_src, sort_keys=True).encode()).hexdigest()[:16]
    return Loaded(model, tokenizer, device, model_dir, text_ids, haystack_ids, key,
                  {"model_dir": str(model_dir), "device": str(device), "threads": torch.get_num_threads(),
                   "compute_dtype": "float32", "num_layers": model.config.num_hidden_layers,
                   "num_kv_heads": model.config.num_key_value_heads,
                   "head_dim": getattr(model.config, "head_dim", None)
                   or model.config.hidden_size // model.config.num_attention_heads})


def auto_threads() -> int:
    """torch's default, or 1 when the machine is already busy (load >= cores): oversubscribed OpenMP threads spin
    and ran 2-3x slower than one thread on a shared 2-core machine."""
    cores = os.cpu_count() or 1
    busy = os.getloadavg()[0] >= cores if hasattr(os, "getloadavg") else False
    return 1 if busy else torch.get_num_threads()


def _tokens(tokenizer, texts: list[str], need: int) -> list[int]:  # noqa: ANN001
    ids: list[int] = []
    for text in texts:
        ids += tokenizer(text + "\n\n", add_special_tokens=False).input_ids
        if len(ids) >= need:
            return ids[:need]
    raise StageError(f"the evaluation text has only {len(ids)} tokens, the probe needs {need}. "
                     f"Next: pass shorter --lengths.")


# ----------------------------------------------------------------------------- scales


def probe_scales(recipe: Recipe, loaded: Loaded, settings: ProbeSettings, out: Path) -> KVScales:
    """Static scales: --scales file, else the calibrate stage's kv_scales.json, else a short calibration pass.

    The K/V statistics always come from the short calibration pass (cached in out/cache/calibration.json).
    """
    from trtkv import paths
    from trtkv.data import load_texts
    from trtkv.kvcache.stats import KVStats, LayerKVStats

    cal = recipe.calibration
    num_samples, seq_len = min(cal.num_samples, 16), min(cal.seq_len, 256)
    cache_file = out / "cache" / "calibration.json"
    ckey = hashlib.sha256(json.dumps([loaded.key, cal.dataset, num_samples, seq_len, cal.seed]).encode()).hexdigest()[:16]
    own: KVScales | None = None
    if cache_file.is_file():
        doc = json.loads(cache_file.read_text())
        if doc.get("key") == ckey:
            st = doc["stats"]
            stats = KVStats(layers=[LayerKVStats(**x) for x in st["layers"]], tokens=st["tokens"],
                            head_dim=st["head_dim"], kv_heads=st["kv_heads"], outlier_factor=st["outlier_factor"])
            own = KVScales(k_amax=doc["k_amax"], v_amax=doc["v_amax"], source=doc["source"], stats=stats,
                           info=doc.get("info", {}))
    if own is None:
        texts = load_texts(cal.dataset)
        own = calibrate_scales(loaded.model, loaded.tokenizer, texts, num_samples=num_samples, seq_len=seq_len,
                               batch_size=min(cal.batch_size, 4), seed=cal.seed)
        stats_dict = own.stats.to_dict() if own.stats else {}
        _write_json(cache_file, {"key": ckey, "k_amax": own.k_amax, "v_amax": own.v_amax, "source": own.source,
                                 "info": own.info, "stats": stats_dict})
    path = settings.scales_path or paths.recipe_output_dir(recipe.name) / "checkpoint" / "kv_scales.json"
    if settings.scales_path is not None or path.is_file():
        given = load_kv_scales(path, loaded.model.config.num_hidden_layers)
        given.stats = own.stats
        return given
    return own


# ----------------------------------------------------------------------------- running the model


def make_cache(loaded: Loaded, choice: FormatChoice, scales: KVScales, record_positions: bool = False
               ) -> QuantizedKVCache:
    ks, vs = scales.for_format(choice)
    return QuantizedKVCache(loaded.model.config, choice, ks, vs, record_positions=record_positions)


def chunk_for(choice: FormatChoice) -> int | None:
    """Chunk size that makes prefill match decode (KIVI's window), None for one pass."""
    return KIVI_RESIDUAL if choice.base in (KVFormat.KIVI4, KVFormat.KIVI2) else None


def feed(model, ids: torch.Tensor, cache: QuantizedKVCache, chunk: int | None) -> torch.Tensor:  # noqa: ANN001
    """Run ids [batch, T] through the model with the cache; return the last hidden states [batch, T, hidden]."""
    outs = []
    start = 0
    total = ids.shape[1]
    with torch.inference_mode():
        while start < total:
            if chunk is None:
                end = total
            else:
                seen = cache.get_seq_length()
                end = min(total, start + chunk - (seen % chunk))  # align with the window flush grid
            out = model.model(input_ids=ids[:, start:end], past_key_values=cache, use_cache=True)
            outs.append(out.last_hidden_state)
            start = end
    return torch.cat(outs, dim=1)


def _logprobs(model, hidden: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    return torch.log_softmax(model.lm_head(hidden).float(), dim=-1)


def position_metrics(model, ref_hidden: torch.Tensor, hidden: torch.Tensor, targets: torch.Tensor  # noqa: ANN001
                     ) -> dict[str, torch.Tensor]:
    """Per position t (predicting token t+1): KL(ref || q), NLL under q and ref, top-1 agreement."""
    kl, nll_q, nll_ref, agree = [], [], [], []
    with torch.inference_mode():
        for s in range(0, targets.shape[0], LOGIT_CHUNK):
            e = min(s + LOGIT_CHUNK, targets.shape[0])
            lr = _logprobs(model, ref_hidden[s:e])
            lq = lr if hidden is ref_hidden else _logprobs(model, hidden[s:e])
            kl.append((lr.exp() * (lr - lq)).sum(-1).clamp(min=0.0))
            t = targets[s:e].unsqueeze(-1)
            nll_q.append(-lq.gather(-1, t).squeeze(-1))
            nll_ref.append(-lr.gather(-1, t).squeeze(-1))
            agree.append((lr.argmax(-1) == lq.argmax(-1)).float())
    return {"kl": torch.cat(kl).cpu(), "nll_q": torch.cat(nll_q).cpu(), "nll_ref": torch.cat(nll_ref).cpu(),
            "agree": torch.cat(agree).cpu()}


def reference_hidden(loaded: Loaded, n: int, out: Path) -> tuple[torch.Tensor, dict]:
    """Hidden states of the reference (fp16 cache) over the first n text tokens (cached)."""
    path = out / "cache" / "reference.pt"
    if path.is_file():
        doc = torch.load(path, weights_only=True)
        if doc.get("key") == loaded.key and doc["hidden"].shape[0] >= n:
            return doc["hidden"][:n].to(loaded.device), doc["bytes"]
    choice = parse_format(REFERENCE)
    cache = QuantizedKVCache(loaded.model.config, choice)
    ids = torch.tensor([loaded.text_ids[:n]], device=loaded.device)
    t0 = time.time()
    hidden = feed(loaded.model, ids, cache, None)[0]
    info = {"bytes_per_token": cache.bytes_per_token(), "stored_bytes": cache.stored_bytes(),
            "seconds": round(time.time() - t0, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"key": loaded.key, "hidden": hidden.cpu(), "bytes": info}, path)
    return hidden, info


def run_format(loaded: Loaded, choice: FormatChoice, scales: KVScales, n: int, ref_hidden: torch.Tensor) -> dict:
    """One pass of the text through the format's cache: per-position metrics, clipping, bytes."""
    targets = torch.tensor(loaded.text_ids[1:n], device=loaded.device)
    t0 = time.time()
    if choice.name == REFERENCE:
        hidden = ref_hidden[: n - 1]
        metrics = position_metrics(loaded.model, hidden, hidden, targets)
        return {"metrics": metrics, "clip": None, "clip_positions": None, "seconds": 0.0}
    cache = make_cache(loaded, choice, scales, record_positions=choice.static)
    ids = torch.tensor([loaded.text_ids[:n]], device=loaded.device)
    hidden = feed(loaded.model, ids, cache, chunk_for(choice))[0]
    metrics = position_metrics(loaded.model, ref_hidden[: n - 1], hidden[: n - 1], targets)
    clip_pos = cache.clip_per_position()
    return {"metrics": metrics, "clip": cache.clip_stats() if choice.static else None,
            "clip_positions": None if clip_pos is None else clip_pos.cpu(),
            "bytes_per_token": cache.bytes_per_token(), "stored_bytes": cache.stored_bytes(),
            "residual_bytes": cache.residual_bytes(), "quantized_tokens": cache.quantized_tokens(),
            "seconds": round(time.time() - t0, 1)}


def length_record(loaded: Loaded, choice: FormatChoice, run: dict, n: int, ref_bytes: dict) -> dict:
    """The probe.json record of one format at context length n (from a pass over >= n tokens)."""
    m = {k: v[: n - 1].double() for k, v in run["metrics"].items()}
    q0 = (3 * n) // 4
    ppl = math.exp(float(m["nll_q"].mean()))
    ppl_ref = math.exp(float(m["nll_ref"].mean()))
    info = loaded.info
    per_token_elems = 2 * info["num_layers"] * info["num_kv_heads"] * info["head_dim"]
    formula = kv_bytes_per_token(info["num_layers"], info["num_kv_heads"], info["head_dim"], choice.base)
    measured = ref_bytes["bytes_per_token"] if choice.name == REFERENCE else run["bytes_per_token"]
    rec = {"format": choice.name, "context_len": n, "kl_mean": float(m["kl"].mean()),
           "kl_last_quarter": float(m["kl"][q0:].mean()) if q0 < n - 1 else float(m["kl"].mean()),
           "ppl": ppl, "ppl_ref": ppl_ref, "ppl_delta": ppl - ppl_ref,
           "top1_agreement": float(m["agree"].mean()), "needle_accuracy": None,
           "clip_rate": None, "k_clip_rate": None, "v_clip_rate": None,
           "kv_bytes_per_token": measured, "kv_bytes_per_token_formula": formula,
           "bytes_vs_formula": measured / formula if formula else None,
           "kv_semantics": SEMANTICS.get(choice.name, choice.base.value), "positions": n - 1}
    if run.get("clip_positions") is not None:
        clipped = float(run["clip_positions"][:n].sum())
        rec["clip_rate"] = clipped / (n * per_token_elems)
    if run.get("clip"):
        layers = run["clip"]["layers"]
        elems = sum(x["elements"] for x in layers) / 2
        rec["k_clip_rate"] = sum(x["k_clip"] for x in layers) / elems if elems else 0.0
        rec["v_clip_rate"] = sum(x["v_clip"] for x in layers) / elems if elems else 0.0
        rec["k_clip_rate_note"] = f"K/V clip rates over all {run['quantized_tokens']} tokens of the pass"
    if choice.base in (KVFormat.KIVI4, KVFormat.KIVI2):
        rec["fp16_window_tokens"] = KIVI_RESIDUAL
        rec["fp16_window_bytes_max"] = KIVI_RESIDUAL * per_token_elems * 2
    return rec


# ----------------------------------------------------------------------------- needle


def needle_trials(loaded: Loaded, choice: FormatChoice, scales: KVScales, length: int, depths: list[float],
                  seeds: int) -> dict:
    """Passkey retrieval at each depth: accuracy over `seeds` random passkeys (teacher-forced greedy check)."""
    tok = loaded.tokenizer
    by_depth: dict[str, float] = {}
    details = []
    for depth in depths:
        rng = random.Random(f"{length}-{depth}")
        keys = [str(rng.randint(10000, 99999)) for _ in range(seeds)]
        seqs = []
        for key in keys:
            needle = tok(f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n",
                         add_special_tokens=False).input_ids
            tail = tok(f"\nWhat is the pass key? The pass key is {key}", add_special_tokens=False).input_ids
            digits = tok(key, add_special_tokens=False).input_ids
            if tail[-len(digits):] != digits:  # tokenizers that merge the digits with the space
                digits = tail[-len(digits):]
            hay = length - len(needle) - len(tail) + 1
            if hay < 8:
                raise TrtkvError(f"needle length {length} is too short for the passkey text.")
            pos = int(round(hay * depth))
            seqs.append((loaded.haystack_ids[:pos], needle + loaded.haystack_ids[pos:hay] + tail[:-1], digits))
        prefix = seqs[0][0]
        cache = make_cache(loaded, choice, scales)
        chunk = chunk_for(choice)
        if prefix:
            feed(loaded.model, torch.tensor([prefix], device=loaded.device), cache, chunk)
            cache.batch_repeat_interleave(len(seqs))
        suffix = torch.tensor([s[1] for s in seqs], device=loaded.device)
        hidden = feed(loaded.model, suffix, cache, chunk)
        n_dig = len(seqs[0][2])
        with torch.inference_mode():
            pred = loaded.model.lm_head(hidden[:, -n_dig:]).argmax(-1).cpu()
        hits = [pred[i].tolist() == seqs[i][2] for i in range(len(seqs))]
        by_depth[f"{depth:g}"] = sum(hits) / len(hits)
        details.append({"depth": depth, "passkeys": keys, "hits": hits})
    return {"by_depth": by_depth, "accuracy": sum(by_depth.values()) / len(by_depth), "trials": details}


# ----------------------------------------------------------------------------- scale reuse through decode


def decode_experiment(loaded: Loaded, formats: list[FormatChoice], scales: KVScales, prompt: int, steps: int) -> dict:
    """Static scales from short prompts, applied to a long prompt and then token-by-token decode steps."""
    ids = torch.tensor([loaded.text_ids[:prompt]], device=loaded.device)
    ref_cache = QuantizedKVCache(loaded.model.config, REFERENCE)
    ref_steps, tokens = [], []
    with torch.inference_mode():
        h = feed(loaded.model, ids, ref_cache, None)[:, -1]
        for _ in range(steps):
            lp = _logprobs(loaded.model, h)[0]
            ref_steps.append(lp)
            nxt = int(lp.argmax())
            tokens.append(nxt)
            h = loaded.model.model(input_ids=torch.tensor([[nxt]], device=loaded.device), past_key_values=ref_cache,
                                   use_cache=True).last_hidden_state[:, -1]
    results = {}
    for choice in formats:
        cache = make_cache(loaded, choice, scales, record_positions=True)
        kls = []
        with torch.inference_mode():
            h = feed(loaded.model, ids, cache, None)[:, -1]
            for i, nxt in enumerate(tokens):
                lq = _logprobs(loaded.model, h)[0]
                kls.append(float((ref_steps[i].exp() * (ref_steps[i] - lq)).sum().clamp(min=0)))
                h = loaded.model.model(input_ids=torch.tensor([[nxt]], device=loaded.device), past_key_values=cache,
                                       use_cache=True).last_hidden_state[:, -1]
        per_pos = cache.clip_per_position()
        elems = 2 * loaded.info["num_layers"] * loaded.info["num_kv_heads"] * loaded.info["head_dim"]
        clip_prompt = float(per_pos[:prompt].sum()) / (prompt * elems) if per_pos is not None else 0.0
        decoded = per_pos[prompt:] if per_pos is not None else None
        clip_decode = float(decoded.sum()) / (decoded.numel() * elems) if decoded is not None and decoded.numel() else 0.0
        half = max(1, len(kls) // 2)
        results[choice.name] = {"prompt_tokens": prompt, "decode_steps": steps, "clip_rate_prompt": clip_prompt,
                                "clip_rate_decode": clip_decode, "kl_decode_first_half": sum(kls[:half]) / half,
                                "kl_decode_second_half": sum(kls[half:]) / max(1, len(kls) - half),
                                "kl_per_step": kls}
    return results


def scale_reuse_summary(scales: KVScales, runs: dict[str, dict], lengths: list[int]) -> dict:
    """Calibrated amax (short prompts) vs amax observed over the long text, and clipping by position."""
    out: dict[str, Any] = {"scales_source": scales.source, "formats": {}}
    for name, run in runs.items():
        clip = run.get("clip")
        if not clip:
            continue
        layers = clip["layers"]
        k_ratio = [x["k_observed_amax"] / x["k_limit"] for x in layers if x["k_limit"] > 0]
        v_ratio = [x["v_observed_amax"] / x["v_limit"] for x in layers if x["v_limit"] > 0]
        per_pos = run.get("clip_positions")
        buckets = []
        if per_pos is not None:
            edges = [0] + [n for n in lengths if n <= per_pos.shape[0]]
            for a, b in zip(edges, edges[1:], strict=False):
                kl = run["metrics"]["kl"][a: b - 1]
                buckets.append({"from": a, "to": b, "clipped_elements": int(per_pos[a:b].sum()),
                                "kl_mean": float(kl.mean()) if kl.numel() else 0.0})
        out["formats"][name] = {
            "layers_exceeding_range_k": sum(1 for r in k_ratio if r > 1), "layers_exceeding_range_v":
                sum(1 for r in v_ratio if r > 1), "max_observed_over_range_k": max(k_ratio, default=0.0),
            "max_observed_over_range_v": max(v_ratio, default=0.0), "by_position": buckets}
    return out


# ----------------------------------------------------------------------------- driver


def _write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(path)


def _scales_key(scales: KVScales) -> str:
    return hashlib.sha256(json.dumps([scales.k_amax, scales.v_amax]).encode()).hexdigest()[:12]


class _Progress:
    """A rich progress bar (or nothing) over the probe's work items."""

    def __init__(self, enabled: bool, total: int):
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]probe[/] {task.description}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
            self.bar.start()
            self.task = self.bar.add_task("starting", total=total)

    def step(self, text: str, advance: int = 0) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=text, advance=advance)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_probe(recipe: Recipe, output: Path | None = None, settings: ProbeSettings | None = None) -> Path:
    """Run (or resume) the sweep and write probe.json, probe.md and plots into `output`."""
    from trtkv.probe_results import default_probe_dir, write_outputs

    settings = settings or default_settings(recipe)
    out = Path(output) if output else default_probe_dir(recipe)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    choices = [parse_format(f) for f in settings.formats]
    static = [c for c in choices if c.static]
    work = len(choices) + len(choices) * len(settings.needle_lengths) + (1 if static else 0) + 2
    bar = _Progress(settings.progress, work)
    try:
        bar.step("loading the model")
        loaded = load_model(recipe, settings)
        bar.step("calibrating static scales (short prompts)", 1)
        scales = probe_scales(recipe, loaded, settings, out)
        skey = _scales_key(scales)
        n = max(settings.lengths)
        ref_hidden: torch.Tensor | None = None
        ref_bytes: dict = {}
        records, runs, timings = [], {}, {}
        bar.step("reference pass (fp16 KV)", 1)
        for choice in choices:
            cached = _cached_records(out, loaded.key, skey, choice, settings.lengths)
            if cached is not None:
                records += cached
                bar.step(f"{choice.name}: cached", 1)
                continue
            if ref_hidden is None:
                ref_hidden, ref_bytes = reference_hidden(loaded, n, out)
            bar.step(f"{choice.name}: {n}-token pass")
            run = run_format(loaded, choice, scales, n, ref_hidden)
            runs[choice.name] = run
            timings[choice.name] = run["seconds"]
            recs = [length_record(loaded, choice, run, length, ref_bytes) for length in settings.lengths]
            _save_run(out, loaded.key, skey, choice, run, recs)
            records += recs
            bar.step(f"{choice.name}: done", 1)
        needles = {}
        for choice in choices:
            for length in settings.needle_lengths:
                bar.step(f"needle {choice.name} @ {length}")
                needles[(choice.name, length)] = _needle_cached(out, loaded, choice, scales, skey, length, settings)
                bar.step(f"needle {choice.name} @ {length}: done", 1)
        _attach_needles(records, needles, settings)
        decode = {}
        if static:
            bar.step("scale reuse through decode steps")
            decode = _decode_cached(out, loaded, static, scales, skey, settings)
            bar.step("scale reuse: done", 1)
        runs_for_reuse = {c.name: runs.get(c.name) or _load_run(out, loaded.key, skey, c) for c in static}
        reuse = scale_reuse_summary(scales, {k: v for k, v in runs_for_reuse.items() if v}, settings.lengths)
        reuse["decode"] = decode
        curves = {c.name: _kl_curve(runs.get(c.name) or _load_run(out, loaded.key, skey, c)) for c in choices}
        bar.step("writing report", 1)
        doc = _document(recipe, loaded, settings, scales, records, needles, reuse, timings, started)
        write_outputs(out, doc, scales.stats.to_markdown() if scales.stats else None, curves)
    finally:
        bar.close()
    return out


def _cache_path(out: Path, choice: FormatChoice, suffix: str) -> Path:
    return out / "cache" / f"{choice.name}{suffix}"


def _cached_records(out: Path, key: str, skey: str, choice: FormatChoice, lengths: list[int]) -> list[dict] | None:
    recs = []
    for length in lengths:
        path = _cache_path(out, choice, f"_{length}.json")
        if not path.is_file():
            return None
        doc = json.loads(path.read_text())
        if doc.get("key") != key or (choice.static and doc.get("scales") != skey):
            return None
        recs.append(doc["record"])
    return recs


def _save_run(out: Path, key: str, skey: str, choice: FormatChoice, run: dict, recs: list[dict]) -> None:
    keep = {k: v for k, v in run.items() if k != "metrics"}
    torch.save({"key": key, "scales": skey, "run": keep, "metrics": run["metrics"]}, _cache_path(out, choice, ".pt"))
    for rec in recs:
        _write_json(_cache_path(out, choice, f"_{rec['context_len']}.json"),
                    {"key": key, "scales": skey, "record": rec})


def _load_run(out: Path, key: str, skey: str, choice: FormatChoice) -> dict | None:
    path = _cache_path(out, choice, ".pt")
    if not path.is_file():
        return None
    doc = torch.load(path, weights_only=False)
    if doc.get("key") != key or (choice.static and doc.get("scales") != skey):
        return None
    return {**doc["run"], "metrics": doc["metrics"]}


def _kl_curve(run: dict | None, window: int = 256) -> list[float] | None:
    """KL averaged over consecutive windows of positions (error vs position)."""
    if not run:
        return None
    kl = run["metrics"]["kl"].double()
    return [float(kl[i: i + window].mean()) for i in range(0, kl.numel(), window)]


def _needle_cached(out: Path, loaded: Loaded, choice: FormatChoice, scales: KVScales, skey: str, length: int,
                   settings: ProbeSettings) -> dict:
    path = _cache_path(out, choice, f"_needle_{length}.json")
    params = [loaded.key, skey if choice.static else "", settings.needle_depths, settings.needle_seeds]
    if path.is_file():
        doc = json.loads(path.read_text())
        if doc.get("params") == params:
            return doc["result"]
    result = needle_trials(loaded, choice, scales, length, settings.needle_depths, settings.needle_seeds)
    _write_json(path, {"params": params, "result": result})
    return result


def _decode_cached(out: Path, loaded: Loaded, static: list[FormatChoice], scales: KVScales, skey: str,
                   settings: ProbeSettings) -> dict:
    prompt = min(settings.decode_prompt, max(settings.lengths))
    path = out / "cache" / "decode.json"
    params = [loaded.key, skey, [c.name for c in static], prompt, settings.decode_steps]
    if path.is_file():
        doc = json.loads(path.read_text())
        if doc.get("params") == params:
            return doc["result"]
    result = decode_experiment(loaded, static, scales, prompt, settings.decode_steps)
    _write_json(path, {"params": params, "result": result})
    return result


def _attach_needles(records: list[dict], needles: dict, settings: ProbeSettings) -> None:
    for rec in records:
        res = needles.get((rec["format"], rec["context_len"]))
        if res:
            rec["needle_accuracy"] = res["accuracy"]
            rec["needle_by_depth"] = res["by_depth"]
            rec["needle_seeds"] = settings.needle_seeds


def _document(recipe: Recipe, loaded: Loaded, settings: ProbeSettings, scales: KVScales, records: list[dict],
              needles: dict, reuse: dict, timings: dict, started: float) -> dict:
    import transformers

    needle_rows = [{"format": f, "context_len": n, **{k: v for k, v in r.items() if k != "trials"}}
                   for (f, n), r in needles.items()]
    return {
        "recipe": recipe.name, "model": {"source": recipe.model.source, **loaded.info},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(time.time() - started, 1),
        "versions": {"trtkv": trtkv_version, "torch": torch.__version__, "transformers": transformers.__version__},
        "settings": {"formats": settings.formats, "lengths": settings.lengths, "needle_lengths": settings.needle_lengths,
                     "needle_depths": settings.needle_depths, "needle_seeds": settings.needle_seeds,
                     "decode_prompt": settings.decode_prompt, "decode_steps": settings.decode_steps},
        "reference": REFERENCE, "method_version": METHOD_VERSION,
        "scales": scales.to_probe_json(),
        "records": records, "needles": needle_rows, "scale_reuse": reuse, "pass_seconds": timings,
        "kv_stats": scales.stats.to_dict() if scales.stats else None,
        "threads": os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads(),
    }
