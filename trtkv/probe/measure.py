"""The measurements: static scales, passes of the model with a quantized cache, per-length metrics, needle
retrieval and the scale-reuse experiment."""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trtkv.contracts.artifacts import KVScalesFile
from trtkv.core.errors import TrtkvError
from trtkv.kvcache.attention_modes import CACHE_ONLY
from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.formats import KVFormat, kv_bytes_per_token
from trtkv.kvcache.quant import KIVI_RESIDUAL, FormatChoice, parse_format
from trtkv.kvcache.scales import KVScales, calibrate_scales, load_kv_scales
from trtkv.probe.attention import attending
from trtkv.probe.needles import feed_text
from trtkv.probe.passes import feed
from trtkv.probe.setup import LOGIT_CHUNK, Loaded, ProbeSettings, semantics, write_json
from trtkv.probe.window import WindowedKVCache, sliding_window
from trtkv.recipe import layout

if TYPE_CHECKING:
    from trtkv.recipe import Recipe


# ----------------------------------------------------------------------------- scales


def probe_scales(recipe: Recipe, loaded: Loaded, settings: ProbeSettings, out: Path) -> KVScales:
    """Static scales: --scales file, else the calibrate stage's kv_scales.json, else a short calibration pass.

    The K/V statistics and fp8_affine's bias and amax (collected as ModelOpt does, trtkv.kvcache.affine) always come
    from the short calibration pass (cached in out/cache/calibration.json, keyed by the collector's source too).
    """
    import inspect

    from trtkv.core.texts import load_texts
    from trtkv.kvcache.affine import AffineCalibration, AffineCollector
    from trtkv.kvcache.stats import KVStats, LayerKVStats

    cal = recipe.calibration
    num_samples, seq_len = min(cal.num_samples, 16), min(cal.seq_len, 256)
    cache_file = out / "cache" / "calibration.json"
    collector = hashlib.sha256(inspect.getsource(AffineCollector).encode()).hexdigest()[:12]
    ckey = hashlib.sha256(json.dumps([loaded.key, cal.dataset, num_samples, seq_len, cal.seed, collector]
                                     ).encode()).hexdigest()[:16]
    own: KVScales | None = None
    if cache_file.is_file():
        doc = json.loads(cache_file.read_text())
        if doc.get("key") == ckey and "engine_variants" in doc:  # older files lack the per-head amaxes
            st = doc["stats"]
            stats = KVStats(layers=[LayerKVStats(**x) for x in st["layers"]], tokens=st["tokens"],
                            head_dim=st["head_dim"], kv_heads=st["kv_heads"], outlier_factor=st["outlier_factor"])
            affine = AffineCalibration.from_dict(doc["affine"]) if doc.get("affine") else None
            own = KVScales(k_amax=doc["k_amax"], v_amax=doc["v_amax"], source=doc["source"], stats=stats,
                           info=doc.get("info", {}), affine=affine, **doc.get("engine_variants", {}))
    if own is None:
        texts = load_texts(cal.dataset)
        own = calibrate_scales(loaded.model, loaded.tokenizer, texts, num_samples=num_samples, seq_len=seq_len,
                               batch_size=min(cal.batch_size, 4), seed=cal.seed)
        stats_dict = own.stats.to_dict() if own.stats else {}
        write_json(cache_file, {"key": ckey, "k_amax": own.k_amax, "v_amax": own.v_amax, "source": own.source,
                                 "info": own.info, "stats": stats_dict,
                                 "affine": own.affine.to_dict() if own.affine else None,
                                 "engine_variants": {"k_head_amax": own.k_head_amax, "v_head_amax": own.v_head_amax,
                                                     "k_rotated_amax": own.k_rotated_amax}})
    path = settings.scales_path or KVScalesFile.path(layout.checkpoint_dir(recipe))
    if settings.scales_path is not None or path.is_file():
        given = load_kv_scales(path, loaded.model.config.num_hidden_layers)
        given.stats = own.stats
        given.affine = own.affine  # fp8_affine: kv_scales.json has no bias; its bias and amax are this pass's
        given.k_head_amax, given.v_head_amax = own.k_head_amax, own.v_head_amax  # fp8_attn_head, nvfp4_rotate: too
        given.k_rotated_amax = own.k_rotated_amax
        return given
    return own


# ----------------------------------------------------------------------------- running the model


def make_cache(loaded: Loaded, choice: FormatChoice, scales: KVScales, record_positions: bool = False,
               keep_layers: list[int] | None = None, keep_format: KVFormat | None = None) -> QuantizedKVCache:
    """The probe's cache for `choice`; keep_layers are stored in keep_format (per-layer KV precision)."""
    ks, vs = scales.for_format(choice)
    cls = cache_class(loaded.model.config)
    return cls(loaded.model.config, choice, ks, vs, record_positions=record_positions,
               keep_layers=keep_layers or (), keep_format=keep_format or KVFormat.BF16)


def cache_class(config) -> type[QuantizedKVCache]:  # noqa: ANN001
    """WindowedKVCache for a model with sliding-window layers (each keeps its window only), else QuantizedKVCache."""
    return WindowedKVCache if sliding_window(config) else QuantizedKVCache


def chunk_for(choice: FormatChoice) -> int | None:
    """Chunk size that makes prefill match decode (KIVI's window), None for one pass."""
    return KIVI_RESIDUAL if choice.base in (KVFormat.KIVI4, KVFormat.KIVI2) else None


def _logprobs(model, hidden: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    logits = model.lm_head(hidden).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # as the model's own forward does (Gemma 2; None on Gemma 3)
        logits = torch.tanh(logits / cap) * cap
    return torch.log_softmax(logits, dim=-1)


def head_positions(loaded: Loaded, count: int) -> torch.Tensor | None:
    """Positions (of `count` predictions) where the LM head runs: every position for a full-attention model (as
    before), a uniform stride for a windowed one (its 262K-wide head would cost more than the model)."""
    samples = loaded.info.get("head_positions")
    if not samples or count <= samples:
        return None
    stride = -(-count // samples)
    return torch.arange(0, count, stride)


def position_metrics(model, ref_hidden: torch.Tensor, hidden: torch.Tensor, targets: torch.Tensor,  # noqa: ANN001
                     positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per position t (predicting token t+1): KL(ref || q), NLL under q and ref, top-1 agreement; at `positions`
    only when given (their indices are kept as "pos")."""
    if positions is not None:
        same = hidden is ref_hidden
        idx = positions.to(ref_hidden.device)
        ref_hidden, targets = ref_hidden[idx], targets.to(ref_hidden.device)[idx]
        hidden = ref_hidden if same else hidden[idx]
        return {**position_metrics(model, ref_hidden, hidden, targets), "pos": positions.cpu()}
    return head_metrics(model, ref_hidden, {"q": hidden}, targets)["q"]


def head_metrics(model, ref_hidden: torch.Tensor, hiddens: dict[str, torch.Tensor],  # noqa: ANN001
                 targets: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
    """position_metrics for several formats over the same rows: the reference's LM head and log-softmax run once per
    chunk of rows, shared by every format (a 262K-wide head costs as much as the rest of a pass)."""
    parts: dict[str, dict[str, list[torch.Tensor]]] = {k: {"kl": [], "nll_q": [], "nll_ref": [], "agree": []}
                                                       for k in hiddens}
    with torch.inference_mode():
        for s in range(0, targets.shape[0], LOGIT_CHUNK):
            e = min(s + LOGIT_CHUNK, targets.shape[0])
            lr = _logprobs(model, ref_hidden[s:e])
            t = targets[s:e].to(lr.device).unsqueeze(-1)
            nll_ref = -lr.gather(-1, t).squeeze(-1)
            top_ref = lr.argmax(-1)
            p_ref = lr.exp()  # shared too
            for name, hidden in hiddens.items():
                lq = lr if hidden is ref_hidden else _logprobs(model, hidden[s:e])
                acc = parts[name]
                acc["kl"].append((p_ref * (lr - lq)).sum(-1).clamp(min=0.0))
                acc["nll_q"].append(-lq.gather(-1, t).squeeze(-1))
                acc["nll_ref"].append(nll_ref)
                acc["agree"].append((top_ref == lq.argmax(-1)).float())
                del lq
            del lr, p_ref
    return {name: {k: torch.cat(v).cpu() for k, v in acc.items()} for name, acc in parts.items()}


def reference_hidden(loaded: Loaded, n: int, out: Path, positions: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, dict]:
    """Hidden states of the reference (fp16 cache) over the first n text tokens (cached); at `positions` only when
    given (a windowed model's sampled LM-head rows: its last layer runs at those rows only)."""
    path = out / "cache" / ("reference.pt" if positions is None else "reference_sampled.pt")
    if path.is_file():
        try:
            doc = torch.load(path, weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError):
            doc = {}  # damaged or from an older trtkv: measured again
        if isinstance(doc, dict) and doc.get("key") == loaded.key:
            if positions is None and doc["hidden"].shape[0] >= n:
                return doc["hidden"][:n].to(loaded.device), doc["bytes"]
            kept = doc.get("positions")
            if positions is not None and doc.get("n") == n and isinstance(kept, torch.Tensor) and torch.equal(
                    kept, positions.cpu()):
                return doc["hidden"].to(loaded.device), doc["bytes"]
    choice = parse_format(loaded.reference)
    cache = cache_class(loaded.model.config)(loaded.model.config, choice)
    ids = torch.tensor([loaded.text_ids[:n]], device=loaded.device)
    t0, c0 = time.time(), time.process_time()
    hidden, needles = feed_text(loaded, ids, cache, None, positions)  # needles: asked on the way (a windowed model)
    info = {"bytes_per_token": cache.bytes_per_token(), "stored_bytes": cache.stored_bytes(),
            "seconds": round(time.time() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1),
            **({"needles": needles} if needles is not None else {})}
    hidden = hidden[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {} if positions is None else {"n": n, "positions": positions.cpu()}
    torch.save({"key": loaded.key, "hidden": hidden.cpu(), "bytes": info, **extra}, path)
    return hidden, info


def run_format(loaded: Loaded, choice: FormatChoice, scales: KVScales, n: int, ref_hidden: torch.Tensor,
               defer_head: bool = False, mode: str = CACHE_ONLY) -> dict:
    """One pass of the text through the format's cache: per-position metrics, clipping, bytes. On a windowed model
    ref_hidden may hold the sampled rows only (reference_hidden(positions=head_positions(...))): the pass then runs
    its last layer at those rows only. `defer_head`: the run keeps its hidden states at the metric rows ("hidden",
    None for the reference) and finish_runs computes every pending run's metrics with one shared reference head.
    `mode`: the attention numerics (trtkv.probe.attention); an engine mode's pass asks no needles."""
    t0, c0 = time.time(), time.process_time()
    positions = head_positions(loaded, n - 1)
    sampled = positions is not None and ref_hidden.shape[0] == positions.numel()
    run: dict[str, Any] = {"clip": None, "clip_positions": None, "seconds": 0.0}
    if choice.name == loaded.reference and mode == CACHE_ONLY:
        hidden = None
    else:
        cache = make_cache(loaded, choice, scales, record_positions=choice.static)
        ids = torch.tensor([loaded.text_ids[:n]], device=loaded.device)
        chunk = chunk_for(choice) or loaded.prefill_chunk
        if mode == CACHE_ONLY:
            hidden, needles = feed_text(loaded, ids, cache, chunk, positions if sampled else None)
        else:
            with attending(loaded, mode, cache):
                hidden, needles = feed(loaded.model, ids, cache, chunk, positions if sampled else None), None
        hidden = hidden[0] if sampled else hidden[0, : n - 1]
        if needles is not None:
            run["needles"] = needles
        clip_pos = cache.clip_per_position()
        run.update({"clip": cache.clip_stats() if choice.static else None,
                    "clip_positions": None if clip_pos is None else clip_pos.cpu(),
                    "bytes_per_token": cache.bytes_per_token(), "stored_bytes": cache.stored_bytes(),
                    "residual_bytes": cache.residual_bytes(), "quantized_tokens": cache.quantized_tokens()})
    run["hidden"], run["positions"] = hidden, positions
    if not defer_head:
        finish_runs(loaded, {choice.name: run}, ref_hidden, n)
    run["seconds"] = round(time.time() - t0, 1) if hidden is not None else 0.0
    run["cpu_seconds"] = round(time.process_time() - c0, 1) if hidden is not None else 0.0
    return run


def finish_runs(loaded: Loaded, runs: dict[str, dict], ref_hidden: torch.Tensor, n: int) -> None:
    """Fill in "metrics" of the runs run_format(defer_head=True) left pending (their "hidden" at the metric rows):
    the reference's LM head runs once for all of them (head_metrics)."""
    pending = {k: r for k, r in runs.items() if "hidden" in r}
    if not pending:
        return
    targets = torch.tensor(loaded.text_ids[1:n], device=ref_hidden.device)
    positions = next(iter(pending.values()))["positions"]
    sampled = positions is not None and ref_hidden.shape[0] == positions.numel()
    ref = ref_hidden if sampled else ref_hidden[: n - 1]
    if positions is not None:
        idx = positions.to(ref.device)
        targets = targets[idx]
        if not sampled:  # dense hidden states, metrics at the sampled rows
            ref = ref[idx]
            for r in pending.values():
                r["hidden"] = None if r["hidden"] is None else r["hidden"][idx]
    hiddens = {k: ref if r["hidden"] is None else r["hidden"] for k, r in pending.items()}
    metrics = head_metrics(loaded.model, ref, hiddens, targets)
    for k, r in pending.items():
        r["metrics"] = metrics[k] if positions is None else {**metrics[k], "pos": positions.cpu()}
        del r["hidden"], r["positions"]


def length_record(loaded: Loaded, choice: FormatChoice, run: dict, n: int, ref_bytes: dict) -> dict:
    """The probe.json record of one format at context length n (from a pass over >= n tokens)."""
    q0 = (3 * n) // 4
    pos = run["metrics"].get("pos")
    if pos is None:
        m = {k: v[: n - 1].double() for k, v in run["metrics"].items()}
        last = m["kl"][q0:] if q0 < n - 1 else m["kl"]
    else:  # sampled positions (a windowed model's pass): those before n - 1
        keep = pos < n - 1
        m = {k: v[keep].double() for k, v in run["metrics"].items() if k != "pos"}
        late = pos[keep] >= q0
        last = m["kl"][late] if bool(late.any()) else m["kl"]
    ppl = math.exp(float(m["nll_q"].mean()))
    ppl_ref = math.exp(float(m["nll_ref"].mean()))
    info = loaded.info
    per_token_elems = 2 * info["num_layers"] * info["num_kv_heads"] * info["head_dim"]
    formula = kv_bytes_per_token(info["num_layers"], info["num_kv_heads"], info["head_dim"], choice.base)
    measured = run["bytes_per_token"] if "bytes_per_token" in run else ref_bytes["bytes_per_token"]  # the reference's
    rec = {"format": choice.name, "context_len": n, "kl_mean": float(m["kl"].mean()),
           "kl_last_quarter": float(last.mean()),
           "ppl": ppl, "ppl_ref": ppl_ref, "ppl_delta": ppl - ppl_ref,
           "top1_agreement": float(m["agree"].mean()), "needle_accuracy": None,
           "clip_rate": None, "k_clip_rate": None, "v_clip_rate": None,
           "kv_bytes_per_token": measured, "kv_bytes_per_token_formula": formula,
           "bytes_vs_formula": measured / formula if formula else None,
           "kv_semantics": semantics(choice), "positions": int(m["kl"].numel())}
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
                  seeds: int, keep_layers: list[int] | None = None, keep_format: KVFormat | None = None) -> dict:
    """Passkey retrieval at each depth: accuracy over `seeds` random passkeys (teacher-forced greedy check);
    keep_layers: those layers' KV in keep_format (per-layer KV precision)."""
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
        cache = make_cache(loaded, choice, scales, keep_layers=keep_layers, keep_format=keep_format)
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
    ref_cache = cache_class(loaded.model.config)(loaded.model.config, loaded.reference)
    ref_steps, tokens = [], []
    with torch.inference_mode():
        h = feed(loaded.model, ids, ref_cache, None, positions=torch.tensor([ids.shape[1] - 1]))[:, -1]
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
            h = feed(loaded.model, ids, cache, None, positions=torch.tensor([ids.shape[1] - 1]))[:, -1]
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
                kl = kl_between(run["metrics"], a, b - 1)
                buckets.append({"from": a, "to": b, "clipped_elements": int(per_pos[a:b].sum()),
                                "kl_mean": float(kl.mean()) if kl.numel() else 0.0})
        out["formats"][name] = {
            "layers_exceeding_range_k": sum(1 for r in k_ratio if r > 1), "layers_exceeding_range_v":
                sum(1 for r in v_ratio if r > 1), "max_observed_over_range_k": max(k_ratio, default=0.0),
            "max_observed_over_range_v": max(v_ratio, default=0.0), "by_position": buckets}
    return out




def kl_between(metrics: dict, a: int, b: int) -> torch.Tensor:
    """The KL values of positions a <= t < b (all positions, or the sampled ones in metrics["pos"])."""
    pos = metrics.get("pos")
    if pos is None:
        return metrics["kl"][a:b]
    return metrics["kl"][(pos >= a) & (pos < b)]
