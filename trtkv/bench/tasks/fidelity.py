"""The `fidelity` task: does the served quantized KV cache do what its format predicts, per context
length?

For each length L in bench.fidelity_lengths (default: the probe's lengths up to
build.max_input_len), N documents (bench.fidelity_documents) of exactly L tokens cut from the
evaluation text are sent; the server returns a greedy continuation of G tokens
(bench.fidelity_tokens) with its log-probs (trtkv.bench.tasks.fidelity_served). The reference, the
recipe's 16-bit weights in transformers with an unquantized cache, and the prediction, the served
weights with the recipe's KV format stored by trtkv.kvcache with kv_scales.json as the engine
applies them, are both teacher-forced on prefix + served tokens (trtkv.bench.tasks.fidelity_score,
cached). The figures against the reference, their bootstrap intervals and the verdict rule are
trtkv.bench.tasks.fidelity_verdict's (docs/fidelity.md explains them); a length worse than its
format predicts is an SLO breach (fidelity.worse_lengths<=0, exit 1). This module runs the task.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trtkv.bench.tasks.fidelity_score import TOP_K, CachedScorer, Served
from trtkv.bench.tasks.fidelity_verdict import (
    AS_PREDICTED,
    BOOTSTRAP,
    NOT_MEASURED,
    RULE,
    WORSE,
    bootstrap,
    judge,
    length_summary,
    notes,
    predicted_rows,
    served_rows,
)
from trtkv.core.errors import StageError, TrtkvError
from trtkv.kvcache.formats import UNQUANTIZED
from trtkv.measures.stats import CONFIDENCE
from trtkv.recipe import Recipe

if TYPE_CHECKING:
    # its module loads tritonclient; the annotations only name the type
    from trtkv.bench.transport.client import Endpoint

LIKELY_CAUSES = [
    "scales not loaded: the engine runs a default scale (1.0, or none) instead of the "
    "checkpoint's calibrated one",
    "scale convention: amax written where amax/448 (or its reciprocal) is read, K/V scales shared "
    "vs separate, a clamp to >= 1.0 or its absence",
    "backend kernel: an attention backend that drops, doubles or misplaces the descale for this "
    "cache dtype",
]


def default_lengths(recipe: Recipe) -> list[int]:
    """bench.fidelity_lengths, else the probe's lengths up to build.max_input_len (at least the
    smallest one)."""
    if recipe.bench.fidelity_lengths:
        return sorted(set(recipe.bench.fidelity_lengths))
    cap = recipe.build.max_input_len
    lengths = [n for n in recipe.probe.lengths if n <= cap]
    return sorted(set(lengths)) or [min(min(recipe.probe.lengths), cap)]


def documents(tokenizer: Any, length: int, count: int) -> list[str]:
    """`count` prompts of exactly `length` tokens from consecutive stretches of the evaluation
    text."""
    return nested_documents(tokenizer, [length], count)[length]


def nested_documents(tokenizer: Any, lengths: Sequence[int], count: int) -> dict[int, list[str]]:
    """Per length, `count` prompts of exactly that many tokens; document i of every length is cut
    from the start of the same stretch of text (the longest length's i-th), so shorter ones are
    prefixes the scorers re-use."""
    from trtkv.bench.load.prompts import cut_to_tokens, latency_prompts

    longest = max(lengths)
    base = latency_prompts(tokenizer, count, longest)
    out: dict[int, list[str]] = {}
    for n in lengths:
        try:
            cut = [p if n == longest else cut_to_tokens(tokenizer, p, n) for p in base]
        # a stretch that cannot be cut to exactly n tokens: this length's own stretches (no sharing)
        except StageError:
            cut = latency_prompts(tokenizer, count, n)
        out[n] = list(dict.fromkeys(cut))
    return out


# ----------------------------------------------------------------------------- the task


def _serve_all(
    request: Callable[[str, list[int]], Served],
    tokenizer: Any,
    jobs: list[tuple[int, int, str]],
    concurrency: int,
) -> list[Served]:
    """Every (length, document) request, `concurrency` in flight (bench.accuracy_concurrency: 1
    unless the engine's answers do not depend on its batch)."""
    ids = [list(tokenizer.encode(prompt, add_special_tokens=True)) for _, _, prompt in jobs]
    if concurrency <= 1:
        return [request(prompt, x) for (_, _, prompt), x in zip(jobs, ids, strict=True)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda j: request(jobs[j][2], ids[j]), range(len(jobs))))


def run_fidelity(
    recipe: Recipe,
    request: Callable[[str, list[int]], Served],
    tokenizer: Any,
    reference: CachedScorer,
    prediction: CachedScorer,
    lengths: Sequence[int],
    docs: int,
    tokens: int,
    reproduce: str,
    log: Callable[[str], None] = print,
    concurrency: int = 1,
    prefill: Any = None,
    drift_mode: str = "cache_only",
) -> dict[str, Any]:
    """Send every length's documents, re-score them (one document's lengths together: shared
    prefixes), judge; with `prefill` (the engine's prompt log-probs), also its prefill-vs-decode
    drift (trtkv.bench.tasks.fidelity_drift)."""
    t0 = time.time()
    table: dict[int, dict[str, Any]] = {}
    failed, total, errors = 0, 0, []
    timing = {"documents": 0.0, "serve": 0.0, "reference": 0.0, "predicted": 0.0}
    measured = []
    for length in lengths:
        if length + tokens > recipe.build.max_seq_len or length > recipe.build.max_input_len:
            table[length] = {
                "length": length,
                "documents": 0,
                "verdict": NOT_MEASURED,
                "worse_metrics": [],
                "note": f"{length} > build.max_input_len {recipe.build.max_input_len} or {length} "
                f"+ {tokens} > build.max_seq_len {recipe.build.max_seq_len}",
            }
        else:
            measured.append(length)
    jobs: list[tuple[int, int, str]] = []  # (length, document index, prompt)
    if measured:
        for length, prompts in nested_documents(tokenizer, measured, docs).items():
            jobs += [(length, i, p) for i, p in enumerate(prompts)]
    timing["documents"] = time.time() - t0
    t = time.time()
    answers = _serve_all(request, tokenizer, jobs, concurrency)
    timing["serve"] = time.time() - t
    skipped = {n: {"failed": 0, "not_aligned": 0} for n in measured}
    by_doc: dict[int, list[tuple[int, Served]]] = {}
    for (length, i, _), served in zip(jobs, answers, strict=True):
        total += 1
        if served.error is not None or not served.ids:
            kind = (
                "not_aligned"
                if served.error and served.error.startswith("not aligned")
                else "failed"
            )
            skipped[length][kind] += 1
            failed += kind == "failed"
            errors.append(f"length {length}: {served.error or 'empty continuation'}")
            continue
        by_doc.setdefault(i, []).append((length, served))
    rows: dict[int, list[Any]] = {n: [] for n in measured}
    for i in sorted(by_doc):
        group = by_doc[i]
        t = time.time()
        preds = prediction.score_nested([(s, None) for _, s in group])
        timing["predicted"] += time.time() - t
        # the reference's log-probs at the served and the predicted top-k (for the KLs)
        t = time.time()
        wants = [
            None if s.top is None else [set(a) | set(b) for a, b in zip(s.top, p.top, strict=True)]
            for (_, s), p in zip(group, preds, strict=True)
        ]
        refs = reference.score_nested([(s, w) for (_, s), w in zip(group, wants, strict=True)])
        timing["reference"] += time.time() - t
        for (length, s), p, r in zip(group, preds, refs, strict=True):
            rows[length].append((served_rows(s, r), predicted_rows(s, p, r)))
    for length in measured:
        table[length] = length_summary(length, rows[length], skipped[length])
        log(
            f"fidelity: length {length}: {table[length]['verdict']} ({len(rows[length])} documents)"
        )
    served_by_length: dict[int, list[Served]] = {}
    for group in by_doc.values():
        for length, s in group:
            served_by_length.setdefault(length, []).append(s)
    drift = drift_table(prefill, prediction, drift_mode, dict(sorted(served_by_length.items())))
    reference.save()
    prediction.save()
    ordered = [table[n] for n in lengths]
    worse = [r["length"] for r in ordered if r["verdict"] != AS_PREDICTED]
    judged = [r for r in ordered if r.get("top1_agreement")]
    agreeing = sum(round(r["top1_agreement"]["served"]["value"] * r["tokens"]) for r in judged)
    tokens_judged = sum(r["tokens"] for r in judged)
    pooled = [row for n in measured for row in rows[n] if "top1_agreement" in row[0]]
    accuracy_ci = (
        bootstrap(
            [s["top1_agreement"] for s, _ in pooled], [p["top1_agreement"] for _, p in pooled]
        )["served"]["ci"]
        if pooled
        else None
    )
    out: dict[str, Any] = {
        "verdict": WORSE
        if any(r["verdict"] == WORSE for r in ordered)
        else (NOT_MEASURED if worse else AS_PREDICTED),
        "worse_lengths": len(worse),
        "lengths_judged_worse": worse,
        # results.md's generic row: the served engine's top-1 agreement with the reference over
        # every judged token with its bootstrap interval over every (length, document) row (a
        # document's lengths share their text, so with several lengths this interval is on the
        # narrow side; each length's own is in the table)
        "accuracy": agreeing / tokens_judged if tokens_judged else 0.0,
        "accuracy_ci": accuracy_ci,
        "correct": agreeing,
        "total": tokens_judged,
        "requests": total,
        "failed": failed,
        "table": ordered,
        "reference": reference.info,
        "prediction": prediction.info,
        "settings": {
            "lengths": list(lengths),
            "documents_per_length": docs,
            "tokens": tokens,
            "top_k": TOP_K,
            "confidence": CONFIDENCE,
            "bootstrap_resamples": BOOTSTRAP,
            "rule": RULE,
            "concurrency": concurrency,
        },
        # reference/predicted include their model loads (*_load); *_computed: documents not found in
        # the cache
        "seconds": {k: round(v, 1) for k, v in timing.items()}
        | {
            "reference_load": round(reference.load_seconds, 1),
            "predicted_load": round(prediction.load_seconds, 1),
            "total": round(time.time() - t0, 1),
            "reference_computed": reference.computed,
            "predicted_computed": prediction.computed,
        },
        "errors": errors[:10],
        "notes": notes(ordered) + drift_notes(drift),
        "prefill_decode_drift": drift,
    }
    if worse:
        out["likely_causes"] = LIKELY_CAUSES
        out["reproduce"] = reproduce
    return out


def drift_table(
    prefill: Any, prediction: CachedScorer, mode: str, served_by_length: dict[int, list[Served]]
) -> dict[str, Any]:
    """The prefill-vs-decode drift per length (served vs predicted, bootstrap intervals; judged
    where the recipe's attention mode predicts a drift), or why it was not measured
    (trtkv.bench.tasks.fidelity_drift)."""
    from trtkv.bench.tasks.fidelity_drift import measure

    if prefill is None:
        return {
            "measured": False,
            "why": "the endpoint returns no prompt log-probs (OpenAI completions with echo: "
            "vLLM; not Triton's ensemble)",
        }
    rows, errors = measure(prefill, prediction, mode, served_by_length)
    table = []
    for length, pairs in rows.items():
        row: dict[str, Any] = {"length": length, "documents": len(pairs)}
        if pairs:
            fig = bootstrap([a for a, _ in pairs], [b for _, b in pairs])
            row.update(served=fig["served"], predicted=fig["predicted"])
            if mode == "cache_only":
                row["verdict"] = (
                    "not judged: cache-only attention predicts 0; the served figure is the "
                    "engine's noise"
                )
            else:
                worse, margin = judge("mean_abs_dlogp", fig)
                row.update(
                    margin=margin, verdict="worse than predicted" if worse else "as predicted"
                )
        table.append(row)
    return {"measured": True, "attention": mode, "table": table, "errors": errors[:10]}


def drift_notes(drift: dict[str, Any]) -> list[str]:
    """results.md lines of the prefill-vs-decode drift (trtkv.bench.tasks.fidelity_drift)."""
    if not drift.get("measured"):
        return [f"prefill vs decode: not measured ({drift.get('why', '')})"]
    out = []
    for r in drift["table"]:
        if not r.get("served"):
            out.append(f"prefill vs decode, length {r['length']}: no documents")
            continue
        lo, hi = r["served"]["ci"]
        out.append(
            f"prefill vs decode, length {r['length']} ({r['documents']} docs, "
            f"{drift['attention']}): mean |dlogp| served {r['served']['value']:.4f} [{lo:.4f}, "
            f"{hi:.4f}] vs predicted {r['predicted']['value']:.4f}; {r['verdict']}"
        )
    return out


def fidelity_entry(
    recipe: Recipe, ep: Endpoint, tokenizer: Any, log: Callable[[str], None]
) -> dict[str, Any]:
    """The fidelity task's results.json entry as `trtkv bench` records it, or the reason it could
    not run."""
    try:
        return fidelity_task(recipe, ep, tokenizer, log, reproduce_command(recipe, ep))
    except TrtkvError as exc:
        return {"error": str(exc)}


def fidelity_task(
    recipe: Recipe, ep: Endpoint, tokenizer: Any, log: Callable[[str], None], reproduce: str
) -> dict[str, Any]:
    """The task as `trtkv bench` runs it: scorers cached in engines/<recipe>/fidelity/."""
    from trtkv.bench.tasks.fidelity_score import prediction_scorer, reference_scorer
    from trtkv.bench.tasks.fidelity_served import prefill_requester, requester
    from trtkv.checkpoints.models import resolve_model_dir
    from trtkv.recipe.engine_attention import recipe_mode
    from trtkv.recipe.layout import fidelity_dir

    if recipe.kv_format in UNQUANTIZED:
        raise TrtkvError(
            f"fidelity: recipe {recipe.name} has an unquantized KV cache (quantization.kv_cache "
            f"{recipe.quantization.kv_cache.value}); the task compares a quantized cache with its "
            "format."
        )
    b = recipe.bench
    folder = fidelity_dir(recipe)
    request = requester(ep, recipe, tokenizer, b.fidelity_tokens, b.request_timeout_s)
    return run_fidelity(
        recipe,
        request,
        tokenizer,
        reference_scorer(resolve_model_dir(recipe), folder),
        prediction_scorer(recipe, folder, log),
        default_lengths(recipe),
        b.fidelity_documents,
        b.fidelity_tokens,
        reproduce,
        log,
        b.accuracy_concurrency,
        prefill_requester(ep, b.request_timeout_s),
        recipe_mode(recipe)[0],
    )


def reproduce_command(recipe: Recipe, ep: Endpoint) -> str:
    lengths = ",".join(str(n) for n in default_lengths(recipe))
    return (
        f"trtkv bench {recipe.name} --tasks fidelity --no-latency --url {ep.url} --protocol "
        f"{ep.protocol.value} bench.fidelity_lengths=[{lengths}]"
    )
