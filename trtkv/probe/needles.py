"""Needles of a windowed model's probe, asked from the KL pass itself: every needle of every
(length, depth, seed) is written into the ONE text each format's pass runs over, each with its own
key and value (RULER's niah_multikey), the cache is copied where each needle length's prompt ends
(causal: the first p tokens' cache of the long pass is the cache of those p tokens) and each
question of that length runs as a short suffix on the copy."""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field

import torch

from trtkv.core.errors import TrtkvError
from trtkv.probe.passes import feed

COLORS = [
    "red",
    "blue",
    "green",
    "yellow",
    "purple",
    "orange",
    "silver",
    "golden",
    "black",
    "white",
    "brown",
    "pink",
]
ANIMALS = [
    "fox",
    "owl",
    "cat",
    "horse",
    "whale",
    "tiger",
    "eagle",
    "frog",
    "wolf",
    "bear",
    "otter",
    "crane",
]
# tokens of text between the needles of one (length, depth): its seeds sit one after another
SEED_GAP = 16


@dataclass
class Needle:
    """One key-value needle: its tokens, where it starts in the pass, its question (fed) and the
    answer digits."""

    length: int
    depth: float
    name: str
    value: str
    ids: list[int]
    question: list[int]
    digits: list[int]
    position: int = -1


@dataclass
class NeedlePlan:
    """The needles written into the pass and, per needle length, the tokens of the pass its
    questions follow."""

    needles: list[Needle]
    prefix_end: dict[int, int] = field(default_factory=dict)

    def describe(self) -> list:
        """What the cached results depend on (the cache key's part)."""
        return [[n.length, n.depth, n.name, n.value, n.position] for n in self.needles] + [
            sorted(self.prefix_end.items())
        ]


def plan_needles(tokenizer, lengths: list[int], depths: list[float], seeds: int) -> list[Needle]:  # noqa: ANN001
    """`seeds` needles per (length, depth), each with a distinct key ("the red fox") and a 5-digit
    value."""
    count = len(lengths) * len(depths) * seeds
    if count > len(COLORS) * len(ANIMALS):
        raise TrtkvError(
            f"needles: {len(lengths)} lengths x {len(depths)} depths x {seeds} seeds = {count} "
            f"needles, more than the {len(COLORS) * len(ANIMALS)} distinct keys. Next: fewer "
            "probe.needle_seeds."
        )
    names = [f"{c} {a}" for a in ANIMALS for c in COLORS]
    random.Random("needle-keys").shuffle(names)
    values: set[str] = set()
    out: list[Needle] = []
    for length in sorted(lengths):
        for depth in depths:
            rng = random.Random(f"{length}-{depth}")
            for _ in range(seeds):
                value = str(rng.randint(10000, 99999))
                while value in values:
                    value = str(rng.randint(10000, 99999))
                values.add(value)
                name = names[len(out)]
                ids = tokenizer(
                    f"\nThe pass key of the {name} is {value}. Remember it. {value} is the pass "
                    f"key of the {name}.\n",
                    add_special_tokens=False,
                ).input_ids
                tail = tokenizer(
                    f"\nWhat is the pass key of the {name}? The pass key of the {name} is {value}",
                    add_special_tokens=False,
                ).input_ids
                digits = tokenizer(value, add_special_tokens=False).input_ids
                if (
                    tail[-len(digits) :] != digits
                ):  # tokenizers that merge the digits with the space
                    digits = tail[-len(digits) :]
                out.append(Needle(length, depth, name, value, ids, tail[:-1], digits))
    return out


def place_needles(
    text: list[int], needles: list[Needle], total: int
) -> tuple[list[int], NeedlePlan]:
    """The pass's `total` tokens: `text` with every needle inserted at its depth of its length's
    prompt (a later one where an earlier needle is in the way); a length's questions follow its
    first prefix_end tokens (prefix + question <= length)."""
    ends = {
        n.length: n.length - max(len(m.question) for m in needles if m.length == n.length)
        for n in needles
    }
    group: dict[tuple[int, float], list[Needle]] = {}
    for nd in needles:
        group.setdefault((nd.length, nd.depth), []).append(nd)
    targets = []
    # the seeds of one depth: SEED_GAP tokens of text between them
    for (length, depth), same in group.items():
        step = max(len(n.ids) for n in same) + SEED_GAP
        span = ends[length] - max(len(n.ids) for n in same) - (len(same) - 1) * step
        base = int(round(max(0, span) * depth))
        targets += [(base + k * step, nd) for k, nd in enumerate(same)]
    out: list[int] = []
    used = 0
    for target, nd in sorted(targets, key=lambda t: t[0]):
        take = max(0, target - len(out))
        out += text[used : used + take]
        used += take
        nd.position = len(out)
        out += nd.ids
        if nd.position + len(nd.ids) > ends[nd.length]:
            raise TrtkvError(
                f"needle length {nd.length}: {sum(m.length == nd.length for m in needles)} needles "
                f"of ~{len(nd.ids)} tokens do not fit before its question. Next: longer "
                "--needle-lengths."
            )
    out += text[used : used + max(0, total - len(out))]
    if len(out) < total or max(ends) > total:
        raise TrtkvError(
            f"needles: the pass has {len(out)} tokens, the needle lengths need {max(ends)} of "
            f"{total}."
        )
    return out[:total], NeedlePlan(needles, ends)


def feed_text(
    loaded,
    ids: torch.Tensor,
    cache,
    chunk: int | None,  # noqa: ANN001
    positions: torch.Tensor | None,
) -> tuple[torch.Tensor, dict | None]:
    """passes.feed over ids [1, T], stopping where each needle length's prompt ends to ask its
    needles on a copy of the cache (trtkv.probe.needles.ask); (hidden states as feed returns them,
    the needle results or None)."""
    plan = loaded.needles
    if plan is None:
        return feed(loaded.model, ids, cache, chunk, positions), None
    total = ids.shape[1]
    cuts = sorted({p for p in plan.prefix_end.values() if p <= total})
    outs, results, start = [], {}, 0
    asked = {"seconds": 0.0, "cpu_seconds": 0.0}
    for end in sorted({*cuts, total}):
        if end > start:
            seg = (
                None
                if positions is None
                else positions[(positions >= start) & (positions < end)] - start
            )
            outs.append(feed(loaded.model, ids[:, start:end], cache, chunk, seg))
            start = end
        for length in (n for n, p in plan.prefix_end.items() if p == end):
            t0, c0 = time.time(), time.process_time()
            results[length] = ask(
                loaded, cache, chunk, [n for n in plan.needles if n.length == length]
            )
            asked["seconds"] += time.time() - t0
            asked["cpu_seconds"] += time.process_time() - c0
    for res in results.values():
        # all lengths' questions of this pass
        res.update({k: round(v, 2) for k, v in asked.items()})
    return torch.cat(outs, dim=1), results


def ask(loaded, cache, chunk: int | None, needles: list[Needle]) -> dict:  # noqa: ANN001
    """Each needle's question on its own copy of `cache`, its answer digits teacher-forced and
    checked greedily; accuracy per depth over the seeds, as measure.needle_trials reports it."""
    hits: dict[float, list[bool]] = {}
    details: dict[float, dict] = {}
    for nd in needles:
        trial = copy.deepcopy(cache)
        width, n_dig = len(nd.question), len(nd.digits)
        q = torch.tensor([nd.question], device=loaded.device)
        with torch.inference_mode():
            hidden = feed(
                loaded.model, q, trial, chunk, positions=torch.arange(width - n_dig, width)
            )
            pred = loaded.model.lm_head(hidden[:, -n_dig:]).argmax(-1)[0].cpu().tolist()
        del trial
        hits.setdefault(nd.depth, []).append(pred == nd.digits)
        row = details.setdefault(
            nd.depth, {"depth": nd.depth, "passkeys": [], "keys": [], "positions": [], "hits": []}
        )
        row["passkeys"].append(nd.value)
        row["keys"].append(nd.name)
        row["positions"].append(nd.position)
        row["hits"].append(pred == nd.digits)
    by_depth = {f"{d:g}": sum(h) / len(h) for d, h in hits.items()}
    return {
        "by_depth": by_depth,
        "accuracy": sum(by_depth.values()) / len(by_depth),
        "trials": [details[d] for d in sorted(details)],
        "method": "shared_haystack",
    }
