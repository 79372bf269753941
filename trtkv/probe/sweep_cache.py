"""The sweep's cache under <probe>/cache/: the keys of a cached result (the model's, a format's
numerics, an attention mode's definition, the static scales a format reads) and the cached passes,
needles, decode experiment and drift, each read back when its key still matches and measured (then
written) otherwise."""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Callable
from pathlib import Path

import torch

from trtkv.kvcache.attention_modes import CACHE_ONLY, load_attention
from trtkv.kvcache.names import FormatChoice
from trtkv.kvcache.quant import numerics_key
from trtkv.kvcache.scales import KVScales
from trtkv.probe.measure import chunk_for, decode_experiment, make_cache, needle_trials
from trtkv.probe.setup import Loaded, ProbeSettings, write_json


def format_key(key: str, choice: FormatChoice, mode: str = CACHE_ONLY) -> str:
    """The model key extended by the format's numerics (and an engine mode's: its kernels' table
    rows and the source of trtkv.kvcache.attention): a changed definition invalidates its cached
    results."""
    base = f"{key}:{numerics_key(choice)}"
    return base if mode == CACHE_ONLY else f"{base}:{mode_key(mode)}"


def mode_key(mode: str) -> str:
    """A hash of an attention mode's definition: its kernels as the table types them and the
    numerics' source."""
    import inspect

    from trtkv.kvcache import attention, attention_hook

    parts = [
        repr(load_attention().mode(mode)),
        inspect.getsource(attention),
        inspect.getsource(attention_hook),
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def scales_key(scales: KVScales, *choices: FormatChoice) -> str:
    """The static scales' key for `choices`: amax per layer, fp8_affine's amax and bias where
    calibrated, and the amaxes only some formats read (fp8_attn_head's per head, nvfp4_rotate's
    rotated K) when one of them is among `choices` (every other format's key is unchanged, so its
    cached results stay valid)."""
    affine = scales.affine.to_dict() if scales.affine is not None else None
    parts: list = [scales.k_amax, scales.v_amax, affine]
    extra = {c.name: amaxes for c in choices if (amaxes := scales.format_amaxes(c)) is not None}
    if extra:
        parts.append(extra)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def job_tag(choice: FormatChoice, mode: str) -> str:
    """A job's name in the cache folder and timings: the format, `@mode` under an engine attention
    mode."""
    return choice.name if mode == CACHE_ONLY else f"{choice.name}@{mode}"


def _cache_path(out: Path, choice: FormatChoice | str, suffix: str) -> Path:
    return out / "cache" / f"{choice if isinstance(choice, str) else choice.name}{suffix}"


def cached_records(
    out: Path, key: str, skey: str, choice: FormatChoice, lengths: list[int], tag: str | None = None
) -> list[dict] | None:
    recs = []
    for length in lengths:
        path = _cache_path(out, tag or choice, f"_{length}.json")
        if not path.is_file():
            return None
        doc = json.loads(path.read_text())
        if doc.get("key") != key or (choice.static and doc.get("scales") != skey):
            return None
        recs.append(doc["record"])
    return recs


def save_run(
    out: Path,
    key: str,
    skey: str,
    choice: FormatChoice,
    run: dict,
    recs: list[dict],
    tag: str | None = None,
) -> None:
    keep = {k: v for k, v in run.items() if k != "metrics"}
    torch.save(
        {"key": key, "scales": skey, "run": keep, "metrics": run["metrics"]},
        _cache_path(out, tag or choice, ".pt"),
    )
    for rec in recs:
        write_json(
            _cache_path(out, tag or choice, f"_{rec['context_len']}.json"),
            {"key": key, "scales": skey, "record": rec},
        )


def load_run(out: Path, key: str, skey: str, choice: FormatChoice) -> dict | None:
    path = _cache_path(out, choice, ".pt")
    if not path.is_file():
        return None
    try:  # tensors, numbers and strings only: a cache file never runs code
        doc = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError):
        return None  # written by an older trtkv (or damaged): measured again
    if (
        not isinstance(doc, dict)
        or doc.get("key") != key
        or (choice.static and doc.get("scales") != skey)
    ):
        return None
    return {**doc["run"], "metrics": doc["metrics"]}


def needle_cached(
    out: Path,
    loaded: Loaded,
    choice: FormatChoice,
    scales: KVScales,
    skey: str,
    length: int,
    settings: ProbeSettings,
) -> dict:
    path = _cache_path(out, choice, f"_needle_{length}.json")
    params = [
        format_key(loaded.key, choice),
        skey if choice.static else "",
        settings.needle_depths,
        settings.needle_seeds,
    ]
    depths, seeds = settings.needle_depths, settings.needle_seeds
    return _cached(
        path, params, lambda: needle_trials(loaded, choice, scales, length, depths, seeds)
    )


def _pass_needles_params(loaded: Loaded, choice: FormatChoice, skey: str) -> list:
    return [format_key(loaded.key, choice), skey if choice.static else "", "kl_pass"]


def save_pass_needles(
    out: Path, loaded: Loaded, choice: FormatChoice, skey: str, found: dict[int, dict]
) -> None:
    """The needles one KL pass asked, one file per length (as needle_cached writes them)."""
    for length, result in found.items():
        write_json(
            _cache_path(out, choice, f"_needle_{length}.json"),
            {"params": _pass_needles_params(loaded, choice, skey), "result": result},
        )


def pass_needles_cached(
    out: Path, loaded: Loaded, choice: FormatChoice, skey: str, lengths: list[int]
) -> dict[int, dict] | None:
    """The needles a cached KL pass asked, every length, or None (that pass runs again)."""
    found: dict[int, dict] = {}
    for length in lengths:
        path = _cache_path(out, choice, f"_needle_{length}.json")
        doc = json.loads(path.read_text()) if path.is_file() else {}
        if doc.get("params") != _pass_needles_params(loaded, choice, skey):
            return None
        found[length] = doc["result"]
    return found


def decode_cached(
    out: Path,
    loaded: Loaded,
    static: list[FormatChoice],
    scales: KVScales,
    skey: str,
    settings: ProbeSettings,
) -> dict:
    prompt = min(settings.decode_prompt, max(settings.lengths))
    path = out / "cache" / "decode.json"
    params = [
        loaded.key,
        skey,
        [format_key("", c) for c in static],
        [c.name for c in static],
        prompt,
        settings.decode_steps,
    ]
    steps = settings.decode_steps
    return _cached(path, params, lambda: decode_experiment(loaded, static, scales, prompt, steps))


def drift_cached(
    out: Path,
    loaded: Loaded,
    choice: FormatChoice,
    mode: str,
    scales: KVScales,
    skey: str,
    settings: ProbeSettings,
) -> dict:
    """The prefill-vs-decode drift of `choice` under `mode` (trtkv.probe.attention.drift),
    cached."""
    from trtkv.probe.attention import drift

    prompt = min(settings.decode_prompt, max(settings.lengths) - settings.decode_steps - 1)
    path = _cache_path(out, job_tag(choice, mode), "_drift.json")
    params = [
        format_key(loaded.key, choice, mode),
        skey if choice.static else "",
        prompt,
        settings.decode_steps,
    ]

    def measure() -> dict:
        kernels = load_attention().mode(mode)
        head_dim = loaded.info["head_dim"]
        if not (
            kernels.drifts(head_dim)
            or (loaded.info.get("sliding_window") and kernels.drifts(head_dim, True))
        ):
            return {
                "format": choice.name,
                "attention": mode,
                "prompt_tokens": prompt,
                "decode_steps": settings.decode_steps,
                "mean_abs_dlogp": 0.0,
                "max_abs_dlogp": 0.0,
                "kl_mean": 0.0,
                "top1_agreement": 1.0,
                "exact_zero": True,
                "note": f"prefill and decode kernels compute alike at head_dim {head_dim}: "
                "0 by construction (the pass is not run)",
            }
        return {
            "format": choice.name,
            **drift(
                loaded,
                lambda: make_cache(loaded, choice, scales),
                mode,
                prompt,
                settings.decode_steps,
                chunk_for(choice) or loaded.prefill_chunk,
            ),
        }

    return _cached(path, params, measure)


def _cached(path: Path, params: list, measure: Callable[[], dict]) -> dict:
    """The result cached at `path` for these `params`, else `measure()`'s, written there."""
    doc = json.loads(path.read_text()) if path.is_file() else {}
    if doc.get("params") == params:
        return doc["result"]
    result = measure()
    write_json(path, {"params": params, "result": result})
    return result
