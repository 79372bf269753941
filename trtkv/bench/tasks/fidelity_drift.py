"""The fidelity task's prefill-vs-decode comparison against the served engine (issue 40): the engine
decodes a continuation (its decode kernel: the log-probs the fidelity request returns), then scores
the same prompt + continuation in one prefill (`echo`, where the engine returns prompt log-probs:
vLLM), and |decode - prefill| per continuation token is its drift. The prediction is the same drift
under the attention numerics the recipe's engine computes
(trtkv.recipe.engine_attention.recipe_mode): for
cache-only attention it is 0 by construction, so the served figure is the engine's own kernel noise
and no verdict is drawn; for an FP8 attention mode it is computed on the prediction's model
(trtkv.kvcache.attention_hook, one pass with the decode kernel from the prompt's end on, one
without) and the served drift is judged by the task's rule
(trtkv.bench.tasks.fidelity_verdict.judge)."""

from __future__ import annotations

from collections.abc import Callable

from trtkv.bench.tasks.fidelity_score import CachedScorer, Served

Prefill = Callable[[list[int]], tuple[list[float] | None, str | None]]


def served_rows(prefill: Prefill, served: Served) -> tuple[list[float] | None, str | None]:
    """|decode - prefill| log-prob of each served continuation token, or why not."""
    values, error = prefill(list(served.prefix_ids) + list(served.ids))
    if values is None:
        return None, error
    tail = values[len(served.prefix_ids) - 1 :]
    if len(tail) != len(served.ids):
        return None, f"prefill log-probs for {len(tail)} of {len(served.ids)} continuation tokens"
    return [abs(d - p) for d, p in zip(served.logprobs, tail, strict=True)], None


def predicted_rows(prediction: CachedScorer, mode_name: str, served: Served) -> list[float]:
    """The prediction's drift on the same tokens under `mode_name` (0 for cache-only attention, by
    construction)."""
    import torch

    from trtkv.kvcache.attention_hook import EngineRun, engine_attention, q_scales_for
    from trtkv.kvcache.attention_modes import CACHE_ONLY, load_attention

    if mode_name == CACHE_ONLY:
        return [0.0] * len(served.ids)
    model, new_cache = prediction.model()
    mode = load_attention().mode(mode_name)
    ids = torch.tensor([list(served.prefix_ids) + list(served.ids)])
    p0, n = len(served.prefix_ids), len(served.ids)
    sides = []
    for decode_from in (None, p0):  # one prefill; the continuation through the decode kernel
        cache = new_cache()
        with (
            torch.inference_mode(),
            engine_attention(model, EngineRun(mode, cache, decode_from, q_scales_for(cache, mode))),
        ):
            hidden = model.model(
                input_ids=ids, past_key_values=cache, use_cache=True
            ).last_hidden_state
            lp = torch.log_softmax(model.lm_head(hidden[0, p0 - 1 : p0 - 1 + n]).float(), -1)
        sides.append(lp.gather(-1, ids[0, p0 : p0 + n].unsqueeze(-1)).squeeze(-1))
    return [float(x) for x in (sides[1] - sides[0]).abs()]


def measure(
    prefill: Prefill | None,
    prediction: CachedScorer,
    mode_name: str,
    served_by_length: dict[int, list[Served]],
) -> tuple[dict[int, list[tuple[list[float], list[float]]]], list[str]]:
    """Per length, (served rows, predicted rows) of every document the engine scored, and why others
    were not (trtkv.bench.tasks.fidelity.drift_table turns them into figures)."""
    rows: dict[int, list[tuple[list[float], list[float]]]] = {}
    errors: list[str] = []
    for length, docs in served_by_length.items():
        rows[length] = []
        for s in docs:
            served, error = served_rows(prefill, s) if prefill is not None else (None, "no prefill")
            if served is None:
                errors.append(f"length {length}: {error}")
                continue
            rows[length].append((served, predicted_rows(prediction, mode_name, s)))
    return rows, errors
