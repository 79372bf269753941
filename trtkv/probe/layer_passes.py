"""The passes of `trtkv probe --per-layer` (trtkv.probe.layers): one model pass per set of layers
kept in 16 bit at one length, cached under cache/per_layer/ (an interrupted run resumes from each
pass's hidden states, `.pt`), the new passes of one length scored together against ONE shared
reference LM head; passkey accuracy per kept set (a full-attention model); and the KV bytes a
sequence of the longest length holds per token (a sliding layer holds its window, as the planner
counts it: trtkv.recipe.attention).

On a sliding-window hybrid every pass is the sweep's window-aware pass (trtkv.probe.window) scored
at sampled LM-head rows: the rows of the longest length, and evenly spaced ones at the sweep length
(`rows_sweep`); a verification pass at the longest length scores both (`union`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trtkv.kvcache.formats import KVFormat, kv_bytes_per_token
from trtkv.kvcache.names import FormatChoice
from trtkv.kvcache.quant import numerics_key
from trtkv.probe.measure import chunk_for, make_cache, needle_trials
from trtkv.probe.metrics import head_metrics
from trtkv.probe.needles import feed_text
from trtkv.probe.passes import feed
from trtkv.probe.setup import Loaded, ProbeSettings, write_json
from trtkv.probe.window import SLIDING, layer_types, sliding_window
from trtkv.recipe.attention import AttentionKind, LayerAttention

# kept set -> (hidden, figures, its file)
Pending = dict[tuple[int, ...], tuple[torch.Tensor, dict[str, Any], Path]]


def per_layer_key(model_key: str, choice: FormatChoice, scales: Any, keep_fmt: KVFormat) -> str:
    """The key of this sweep's cached passes: the model, the numerics of the format and of the kept
    layers' format (numerics_key, as the sweep's cache is keyed) and the static scales; a changed
    format definition misses."""
    affine = scales.affine.to_dict() if getattr(scales, "affine", None) is not None else None
    parts = [
        model_key,
        choice.name,
        numerics_key(choice),
        numerics_key(keep_fmt),
        scales.k_amax,
        scales.v_amax,
        affine,
    ]
    extra = scales.format_amaxes(choice) if hasattr(scales, "format_amaxes") else None
    # fp8_attn_head's per-head, nvfp4_rotate's rotated-K amax (other formats' keys unchanged)
    if extra is not None:
        parts.append(extra)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


@dataclass
class LayerPasses:
    """One per-layer sweep's passes over a loaded model: `measure` (KL/top-1 per kept set),
    `needle`, `held`; the counts of passes run and read from the cache in `passes`."""

    loaded: Loaded
    choice: FormatChoice
    scales: Any
    keep_fmt: KVFormat
    settings: ProbeSettings
    sweep: int  # the sensitivity passes' length
    longest: int  # the verification passes' length
    cache_dir: Path
    ref: torch.Tensor  # the reference's hidden states (at `union` on a windowed model)
    rows_long: torch.Tensor | None = None  # a windowed model's scored rows at the longest length
    rows_sweep: torch.Tensor | None = None  # ... and at the sweep length
    union: torch.Tensor | None = None  # both (what a verification pass scores)
    log: Callable[[str], None] = print
    t_start: float = field(default_factory=time.time)
    passes: dict[str, int] = field(default_factory=lambda: {"run": 0, "cached": 0})

    def __post_init__(self) -> None:
        info, config = self.loaded.info, self.loaded.model.config
        self.n_layers = int(info["num_layers"])
        self.heads, self.dim = int(info["num_kv_heads"]), int(info["head_dim"])
        self.window = sliding_window(config)
        self.kinds = layer_types(config)
        self.sliding = [i for i, k in enumerate(self.kinds) if k == SLIDING]
        self.everything = list(range(self.n_layers))
        self.targets = torch.tensor(
            self.loaded.text_ids[1 : self.longest], device=self.loaded.device
        )
        self.skey = per_layer_key(self.loaded.key, self.choice, self.scales, self.keep_fmt)
        self.all_key = hashlib.sha256(
            json.dumps([self.loaded.key, numerics_key(self.keep_fmt)]).encode()
        ).hexdigest()[:16]

    def rows_at(self, n: int) -> torch.Tensor | None:
        """The rows a pass of `n` tokens scores: None (every row) on a full-attention model."""
        return None if not self.window else (self.union if n == self.longest else self.rows_sweep)

    def scored(self, pos: torch.Tensor, length: int) -> torch.Tensor:
        """The rows a length's figures average: KL@sweep over the sensitivity rows in every pass (so
        predicted and verified KL at the sweep length are over the same positions), the other
        lengths over the sweep's rows."""
        sel = pos < length - 1
        if self.window and self.rows_sweep is not None and self.rows_long is not None:
            sel &= torch.isin(pos, self.rows_sweep if length == self.sweep else self.rows_long)
        return sel

    def pass_path(self, keep: tuple[int, ...], n: int, rows: torch.Tensor | None) -> Path:
        """Cached pass: all-16-bit is the same pass for every format (keyed without it)."""
        parts: list[Any] = (
            [self.all_key, "all"] if list(keep) == self.everything else [self.skey, list(keep)]
        )
        parts += [n, None if rows is None else rows.tolist()]
        return (
            self.cache_dir / f"{hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]}.json"
        )

    def measure(self, keeps: list[list[int]], n: int) -> dict[tuple[int, ...], dict[str, Any]]:
        """KL/top-1 at every reported length <= n for the format with each `keep` in the model
        dtype: one pass each (cached; on a windowed model chunked, sliding layers windowed, the last
        layer at the scored rows only, and at the longest length the needles asked on the way), then
        ONE shared reference LM head for the new passes."""
        rows = self.rows_at(n)
        found: dict[tuple[int, ...], dict[str, Any]] = {}
        pending: Pending = {}
        for keep in keeps:
            key = tuple(sorted(keep))
            path = self.pass_path(key, n, rows)
            if key in found or key in pending:
                continue
            if path.is_file():
                self.passes["cached"] += 1
                found[key] = dict(json.loads(path.read_text()))
                continue
            # a pass whose head had not run yet (an interrupted run)
            partial = path.with_suffix(".pt")
            if partial.is_file():
                doc = torch.load(partial, weights_only=True)
                pending[key] = (doc["hidden"].to(self.loaded.device), dict(doc["res"]), path)
                continue
            hidden, res = self._run_pass(key, n, rows)
            partial.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"hidden": hidden.cpu(), "res": res}, partial)
            pending[key] = (hidden, res, path)
            if len(pending) % 10 == 0:
                self.log(
                    f"  {len(pending)} passes at {n} tokens run, {self.passes['cached']} from "
                    f"cache, {time.time() - self.t_start:.0f} s"
                )
        if pending:
            found.update(self._score(pending, n, rows))
        return found

    def _run_pass(
        self, key: tuple[int, ...], n: int, rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One pass of `n` tokens with the layers `key` kept: its hidden states at the scored rows,
        and its figures besides KL (bytes, time, the needles asked on the way, the uniform format's
        clip rate per layer)."""
        loaded, choice = self.loaded, self.choice
        t0, c0 = time.time(), time.process_time()
        cache = make_cache(
            loaded, choice, self.scales, keep_layers=list(key), keep_format=self.keep_fmt
        )
        ids = torch.tensor([loaded.text_ids[:n]], device=loaded.device)
        if self.window and n == self.longest:
            hidden, needles = feed_text(loaded, ids, cache, chunk_for(choice), rows)
        else:
            hidden, needles = feed(loaded.model, ids, cache, chunk_for(choice), rows), None
        hidden = hidden[0] if rows is not None else hidden[0, : n - 1]
        res: dict[str, Any] = {
            "keep": list(key),
            "bytes_per_token_formula": kv_bytes_per_token(
                self.n_layers, self.heads, self.dim, choice.base, list(key), self.keep_fmt
            ),
            "stored_bytes": cache.stored_bytes(),
            "tokens": n,
            "seconds": round(time.time() - t0, 1),
            "cpu_seconds": round(time.process_time() - c0, 1),
        }
        if needles:
            res["needles"] = {
                str(length): {"accuracy": r["accuracy"], "by_depth": r["by_depth"]}
                for length, r in needles.items()
            }
        if choice.static and not key:
            clip = cache.clip_stats()
            res["clip_by_layer"] = [
                (x["k_clip"] + x["v_clip"]) / x["elements"] if x["elements"] else 0.0
                for x in clip["layers"]
            ]
        del cache
        return hidden, res

    def _score(
        self, pending: Pending, n: int, rows: torch.Tensor | None
    ) -> dict[tuple[int, ...], dict[str, Any]]:
        """The new passes of `n` tokens through ONE reference LM head: KL and top-1 at each reported
        length <= n, written to each pass's file (its `.pt` removed)."""
        if rows is None or self.union is None:  # rows and union are set together (a windowed model)
            ref_rows, tgt, pos = self.ref[: n - 1], self.targets[: n - 1], torch.arange(n - 1)
        else:
            ref_rows, tgt, pos = (
                self.ref[torch.searchsorted(self.union, rows)],
                self.targets[rows.to(self.targets.device)],
                rows,
            )
        t0, c0 = time.time(), time.process_time()
        metrics = head_metrics(
            self.loaded.model, ref_rows, {str(k): h for k, (h, _, _) in pending.items()}, tgt
        )
        head_cpu = round((time.process_time() - c0) / len(pending), 1)
        found = {}
        for key, (_, res, path) in pending.items():
            m = metrics[str(key)]
            for length in sorted({self.sweep, self.longest, *self.settings.lengths}):
                if length <= n:
                    sel = self.scored(pos, length)
                    res[str(length)] = {
                        "kl": float(m["kl"][sel].double().mean()),
                        "top1": float(m["agree"][sel].double().mean()),
                    }
            res["head_cpu_seconds"] = head_cpu
            write_json(path, res)
            path.with_suffix(".pt").unlink(missing_ok=True)
            found[key] = res
            self.passes["run"] += 1
        self.log(f"  LM head for {len(pending)} passes at {n} tokens: {time.time() - t0:.0f} s")
        return found

    def needle(self, keep: list[int], length: int) -> float:
        """Passkey accuracy at `length` for the format with `keep` in the model dtype (cached; a
        full-attention model)."""
        s = self.settings
        params = [self.skey, "needle", sorted(keep), length, s.needle_depths, s.needle_seeds]
        path = (
            self.cache_dir / f"{hashlib.sha256(json.dumps(params).encode()).hexdigest()[:20]}.json"
        )
        if path.is_file():
            self.passes["cached"] += 1
            return float(json.loads(path.read_text())["accuracy"])
        res = needle_trials(
            self.loaded,
            self.choice,
            self.scales,
            length,
            s.needle_depths,
            s.needle_seeds,
            keep_layers=keep,
            keep_format=self.keep_fmt,
        )
        write_json(
            path, {"params": params, "accuracy": res["accuracy"], "by_depth": res["by_depth"]}
        )
        self.passes["run"] += 1
        return float(res["accuracy"])

    def held(self, keep: list[int] | None, per_token: float) -> float:
        """KV bytes one `longest`-token sequence holds, per token: a sliding layer holds its window
        only (the planner's per-layer accounting, trtkv.recipe.attention); = the per-token formula
        on a full-attention model."""
        if not self.window:
            return per_token
        layers = [
            LayerAttention(AttentionKind.SLIDING, self.window)
            if k == SLIDING
            else LayerAttention(AttentionKind.FULL)
            for k in self.kinds
        ]
        longest = self.longest
        # another uniform format (probe.json): its per-token bytes spread evenly over the layers
        if keep is None:
            return (
                sum(x.tokens_held(longest) for x in layers) * per_token / (self.n_layers * longest)
            )
        return (
            sum(
                x.tokens_held(longest)
                * kv_bytes_per_token(
                    1, self.heads, self.dim, self.keep_fmt if i in keep else self.choice.base
                )
                for i, x in enumerate(layers)
            )
            / longest
        )
