"""The measurements: static scales, passes of the model with a quantized cache, needle retrieval and
the scale-reuse experiment through decode steps; the metrics of each pass are
trtkv.probe.metrics'."""

from __future__ import annotations

import hashlib
import json
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
from trtkv.kvcache.formats import KVFormat
from trtkv.kvcache.names import KIVI_RESIDUAL, FormatChoice, parse_format
from trtkv.kvcache.scales import KVScales, calibrate_scales, load_kv_scales
from trtkv.probe.attention import attending
from trtkv.probe.metrics import finish_runs, head_positions, logprobs
from trtkv.probe.needles import feed_text
from trtkv.probe.passes import feed
from trtkv.probe.setup import Loaded, ProbeSettings, write_json
from trtkv.probe.window import WindowedKVCache, sliding_window
from trtkv.recipe import layout

if TYPE_CHECKING:
    from trtkv.recipe import Recipe


# ----------------------------------------------------------------------------- scales


def probe_scales(recipe: Recipe, loaded: Loaded, settings: ProbeSettings, out: Path) -> KVScales:
    """Static scales: --scales file, else the calibrate stage's kv_scales.json, else a short
    calibration pass.

    The K/V statistics and fp8_affine's bias and amax (collected as ModelOpt does,
    trtkv.kvcache.affine) always come from the short calibration pass (cached in
    out/cache/calibration.json, keyed by the collector's source too).
    """
    import inspect

    from trtkv.core.texts import load_texts
    from trtkv.kvcache.affine import AffineCalibration, AffineCollector
    from trtkv.kvcache.stats import KVStats, LayerKVStats

    cal = recipe.calibration
    num_samples, seq_len = min(cal.num_samples, 16), min(cal.seq_len, 256)
    cache_file = out / "cache" / "calibration.json"
    collector = hashlib.sha256(inspect.getsource(AffineCollector).encode()).hexdigest()[:12]
    ckey = hashlib.sha256(
        json.dumps([loaded.key, cal.dataset, num_samples, seq_len, cal.seed, collector]).encode()
    ).hexdigest()[:16]
    own: KVScales | None = None
    if cache_file.is_file():
        doc = json.loads(cache_file.read_text())
        # older files lack the per-head amaxes
        if doc.get("key") == ckey and "engine_variants" in doc:
            st = doc["stats"]
            stats = KVStats(
                layers=[LayerKVStats(**x) for x in st["layers"]],
                tokens=st["tokens"],
                head_dim=st["head_dim"],
                kv_heads=st["kv_heads"],
                outlier_factor=st["outlier_factor"],
            )
            affine = AffineCalibration.from_dict(doc["affine"]) if doc.get("affine") else None
            own = KVScales(
                k_amax=doc["k_amax"],
                v_amax=doc["v_amax"],
                source=doc["source"],
                stats=stats,
                info=doc.get("info", {}),
                affine=affine,
                **doc.get("engine_variants", {}),
            )
    if own is None:
        texts = load_texts(cal.dataset)
        own = calibrate_scales(
            loaded.model,
            loaded.tokenizer,
            texts,
            num_samples=num_samples,
            seq_len=seq_len,
            batch_size=min(cal.batch_size, 4),
            seed=cal.seed,
        )
        stats_dict = own.stats.to_dict() if own.stats else {}
        write_json(
            cache_file,
            {
                "key": ckey,
                "k_amax": own.k_amax,
                "v_amax": own.v_amax,
                "source": own.source,
                "info": own.info,
                "stats": stats_dict,
                "affine": own.affine.to_dict() if own.affine else None,
                "engine_variants": {
                    "k_head_amax": own.k_head_amax,
                    "v_head_amax": own.v_head_amax,
                    "k_rotated_amax": own.k_rotated_amax,
                },
            },
        )
    path = settings.scales_path or KVScalesFile.path(layout.checkpoint_dir(recipe))
    if settings.scales_path is not None or path.is_file():
        given = load_kv_scales(path, loaded.model.config.num_hidden_layers)
        given.stats = own.stats
        # fp8_affine: kv_scales.json has no bias; its bias and amax are this pass's
        given.affine = own.affine
        # fp8_attn_head, nvfp4_rotate: too
        given.k_head_amax, given.v_head_amax = own.k_head_amax, own.v_head_amax
        given.k_rotated_amax = own.k_rotated_amax
        return given
    return own


# ----------------------------------------------------------------------------- running the model


def make_cache(
    loaded: Loaded,
    choice: FormatChoice,
    scales: KVScales,
    record_positions: bool = False,
    keep_layers: list[int] | None = None,
    keep_format: KVFormat | None = None,
) -> QuantizedKVCache:
    """The probe's cache for `choice`; keep_layers are stored in keep_format (per-layer KV
    precision)."""
    ks, vs = scales.for_format(choice)
    cls = cache_class(loaded.model.config)
    return cls(
        loaded.model.config,
        choice,
        ks,
        vs,
        record_positions=record_positions,
        keep_layers=keep_layers or (),
        keep_format=keep_format or KVFormat.BF16,
    )


def cache_class(config) -> type[QuantizedKVCache]:  # noqa: ANN001
    """WindowedKVCache for a model with sliding-window layers (each keeps its window only), else
    QuantizedKVCache."""
    return WindowedKVCache if sliding_window(config) else QuantizedKVCache


def chunk_for(choice: FormatChoice) -> int | None:
    """Chunk size that makes prefill match decode (KIVI's window), None for one pass."""
    return KIVI_RESIDUAL if choice.base in (KVFormat.KIVI4, KVFormat.KIVI2) else None


def reference_hidden(
    loaded: Loaded, n: int, out: Path, positions: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict]:
    """Hidden states of the reference (fp16 cache) over the first n text tokens (cached); at
    `positions` only when given (a windowed model's sampled LM-head rows: its last layer runs at
    those rows only)."""
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
            if (
                positions is not None
                and doc.get("n") == n
                and isinstance(kept, torch.Tensor)
                and torch.equal(kept, positions.cpu())
            ):
                return doc["hidden"].to(loaded.device), doc["bytes"]
    choice = parse_format(loaded.reference)
    cache = cache_class(loaded.model.config)(loaded.model.config, choice)
    ids = torch.tensor([loaded.text_ids[:n]], device=loaded.device)
    t0, c0 = time.time(), time.process_time()
    # needles: asked on the way (a windowed model)
    hidden, needles = feed_text(loaded, ids, cache, None, positions)
    info = {
        "bytes_per_token": cache.bytes_per_token(),
        "stored_bytes": cache.stored_bytes(),
        "seconds": round(time.time() - t0, 1),
        "cpu_seconds": round(time.process_time() - c0, 1),
        **({"needles": needles} if needles is not None else {}),
    }
    hidden = hidden[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {} if positions is None else {"n": n, "positions": positions.cpu()}
    torch.save({"key": loaded.key, "hidden": hidden.cpu(), "bytes": info, **extra}, path)
    return hidden, info


def run_format(
    loaded: Loaded,
    choice: FormatChoice,
    scales: KVScales,
    n: int,
    ref_hidden: torch.Tensor,
    defer_head: bool = False,
    mode: str = CACHE_ONLY,
) -> dict:
    """One pass of the text through the format's cache: per-position metrics, clipping, bytes. On a
    windowed model ref_hidden may hold the sampled rows only
    (reference_hidden(positions=head_positions(...))): the pass then runs its last layer at those
    rows only. `defer_head`: the run keeps its hidden states at the metric rows ("hidden", None for
    the reference) and finish_runs computes every pending run's metrics with one shared reference
    head. `mode`: the attention numerics (trtkv.probe.attention); an engine mode's pass asks no
    needles."""
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
                hidden, needles = (
                    feed(loaded.model, ids, cache, chunk, positions if sampled else None),
                    None,
                )
        hidden = hidden[0] if sampled else hidden[0, : n - 1]
        if needles is not None:
            run["needles"] = needles
        clip_pos = cache.clip_per_position()
        run.update(
            {
                "clip": cache.clip_stats() if choice.static else None,
                "clip_positions": None if clip_pos is None else clip_pos.cpu(),
                "bytes_per_token": cache.bytes_per_token(),
                "stored_bytes": cache.stored_bytes(),
                "residual_bytes": cache.residual_bytes(),
                "quantized_tokens": cache.quantized_tokens(),
            }
        )
    run["hidden"], run["positions"] = hidden, positions
    if not defer_head:
        finish_runs(loaded, {choice.name: run}, ref_hidden, n)
    run["seconds"] = round(time.time() - t0, 1) if hidden is not None else 0.0
    run["cpu_seconds"] = round(time.process_time() - c0, 1) if hidden is not None else 0.0
    return run


# ----------------------------------------------------------------------------- needle


def needle_trials(
    loaded: Loaded,
    choice: FormatChoice,
    scales: KVScales,
    length: int,
    depths: list[float],
    seeds: int,
    keep_layers: list[int] | None = None,
    keep_format: KVFormat | None = None,
) -> dict:
    """Passkey retrieval at each depth: accuracy over `seeds` random passkeys (teacher-forced greedy
    check); keep_layers: those layers' KV in keep_format (per-layer KV precision)."""
    tok = loaded.tokenizer
    by_depth: dict[str, float] = {}
    details = []
    for depth in depths:
        rng = random.Random(f"{length}-{depth}")
        keys = [str(rng.randint(10000, 99999)) for _ in range(seeds)]
        seqs = []
        for key in keys:
            needle = tok(
                f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n",
                add_special_tokens=False,
            ).input_ids
            tail = tok(
                f"\nWhat is the pass key? The pass key is {key}", add_special_tokens=False
            ).input_ids
            digits = tok(key, add_special_tokens=False).input_ids
            if tail[-len(digits) :] != digits:  # tokenizers that merge the digits with the space
                digits = tail[-len(digits) :]
            hay = length - len(needle) - len(tail) + 1
            if hay < 8:
                raise TrtkvError(f"needle length {length} is too short for the passkey text.")
            pos = int(round(hay * depth))
            seqs.append(
                (
                    loaded.haystack_ids[:pos],
                    needle + loaded.haystack_ids[pos:hay] + tail[:-1],
                    digits,
                )
            )
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
    return {
        "by_depth": by_depth,
        "accuracy": sum(by_depth.values()) / len(by_depth),
        "trials": details,
    }


# ----------------------------------------------------------------------------- scale reuse through
# decode


def decode_experiment(
    loaded: Loaded, formats: list[FormatChoice], scales: KVScales, prompt: int, steps: int
) -> dict:
    """Static scales from short prompts, applied to a long prompt and then token-by-token decode
    steps."""
    ids = torch.tensor([loaded.text_ids[:prompt]], device=loaded.device)
    ref_cache = cache_class(loaded.model.config)(loaded.model.config, loaded.reference)
    ref_steps, tokens = [], []
    with torch.inference_mode():
        h = feed(loaded.model, ids, ref_cache, None, positions=torch.tensor([ids.shape[1] - 1]))[
            :, -1
        ]
        for _ in range(steps):
            lp = logprobs(loaded.model, h)[0]
            ref_steps.append(lp)
            nxt = int(lp.argmax())
            tokens.append(nxt)
            h = loaded.model.model(
                input_ids=torch.tensor([[nxt]], device=loaded.device),
                past_key_values=ref_cache,
                use_cache=True,
            ).last_hidden_state[:, -1]
    results = {}
    for choice in formats:
        cache = make_cache(loaded, choice, scales, record_positions=True)
        kls = []
        with torch.inference_mode():
            h = feed(loaded.model, ids, cache, None, positions=torch.tensor([ids.shape[1] - 1]))[
                :, -1
            ]
            for i, nxt in enumerate(tokens):
                lq = logprobs(loaded.model, h)[0]
                kls.append(float((ref_steps[i].exp() * (ref_steps[i] - lq)).sum().clamp(min=0)))
                h = loaded.model.model(
                    input_ids=torch.tensor([[nxt]], device=loaded.device),
                    past_key_values=cache,
                    use_cache=True,
                ).last_hidden_state[:, -1]
        per_pos = cache.clip_per_position()
        elems = (
            2 * loaded.info["num_layers"] * loaded.info["num_kv_heads"] * loaded.info["head_dim"]
        )
        clip_prompt = (
            float(per_pos[:prompt].sum()) / (prompt * elems) if per_pos is not None else 0.0
        )
        decoded = per_pos[prompt:] if per_pos is not None else None
        clip_decode = (
            float(decoded.sum()) / (decoded.numel() * elems)
            if decoded is not None and decoded.numel()
            else 0.0
        )
        half = max(1, len(kls) // 2)
        results[choice.name] = {
            "prompt_tokens": prompt,
            "decode_steps": steps,
            "clip_rate_prompt": clip_prompt,
            "clip_rate_decode": clip_decode,
            "kl_decode_first_half": sum(kls[:half]) / half,
            "kl_decode_second_half": sum(kls[half:]) / max(1, len(kls) - half),
            "kl_per_step": kls,
        }
    return results
