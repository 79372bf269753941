"""Needles of a windowed model's probe: every (length, depth) from one haystack pass per format."""

from __future__ import annotations

import copy
import random

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.quant import FormatChoice
from trtkv.probe.measure import chunk_for, feed, make_cache


def shared_needles(loaded, choice: FormatChoice, scales, lengths: list[int], depths: list[float],  # noqa: ANN001
                   seeds: int) -> dict[int, dict]:
    """Passkey retrieval at every (length, depth) from ONE haystack prefix pass: all needles sit in the same
    haystack, so the cache before a needle at position p is the cache of haystack[:p]; it is copied at each needle
    position (ascending) and only the suffixes (needle, rest of the haystack, question) run per trial. Scored as
    measure.needle_trials does (teacher-forced greedy digits)."""
    tok = loaded.tokenizer
    tasks = []  # (prefix end, length, depth, [(suffix ids, digit ids)], keys)
    for length in lengths:
        for depth in depths:
            rng = random.Random(f"{length}-{depth}")
            keys = [str(rng.randint(10000, 99999)) for _ in range(seeds)]
            trials: list[tuple[list[int], list[int]]] = []
            pos = -1
            for key in keys:
                needle = tok(f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n",
                             add_special_tokens=False).input_ids
                tail = tok(f"\nWhat is the pass key? The pass key is {key}", add_special_tokens=False).input_ids
                digits = tok(key, add_special_tokens=False).input_ids
                if tail[-len(digits):] != digits:
                    digits = tail[-len(digits):]
                hay = length - len(needle) - len(tail) + 1
                if hay < 8:
                    raise TrtkvError(f"needle length {length} is too short for the passkey text.")
                pos = int(round(hay * depth)) if pos < 0 else pos  # one prefix per (length, depth), as before
                trials.append((needle + loaded.haystack_ids[pos:hay] + tail[:-1], digits))
            tasks.append((pos, length, depth, trials, keys))
    tasks.sort(key=lambda t: t[0])
    chunk = chunk_for(choice)
    cache = make_cache(loaded, choice, scales)
    fed = 0
    results: dict[int, dict] = {n: {"by_depth": {}, "trials": []} for n in lengths}
    for pos, length, depth, trials, keys in tasks:
        if pos > fed:
            feed(loaded.model, torch.tensor([loaded.haystack_ids[fed:pos]], device=loaded.device), cache, chunk)
            fed = pos
        with torch.inference_mode():
            trial_cache = copy.deepcopy(cache)
            if pos:
                trial_cache.batch_repeat_interleave(len(trials))
            hits = []
            widths = {len(s) for s, _ in trials}
            if len(widths) == 1:  # one batch: every suffix has the same length
                n_dig = len(trials[0][1])
                width = widths.pop()
                hidden = feed(loaded.model, torch.tensor([s for s, _ in trials], device=loaded.device), trial_cache,
                              chunk, positions=torch.arange(width - n_dig, width))  # the last layer at those only
                pred = loaded.model.lm_head(hidden).argmax(-1).cpu()
                hits = [pred[i].tolist() == trials[i][1] for i in range(len(trials))]
            else:
                raise TrtkvError(f"needle suffixes of unequal lengths {sorted(widths)} (the tokenizer merged digits).")
        res = results[length]
        res["by_depth"][f"{depth:g}"] = sum(hits) / len(hits)
        res["trials"].append({"depth": depth, "passkeys": keys, "hits": hits})
    for res in results.values():
        res["accuracy"] = sum(res["by_depth"].values()) / len(res["by_depth"])
        res["trials"].sort(key=lambda t: t["depth"])
    return results
