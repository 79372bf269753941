"""RULER in the probe: the bench's own RULER items answered greedily in-process with each probed
format's quantized KV cache and the 16-bit reference, scored with the bench's own rule, so
long-context retrieval is measured before serving on exactly the items `trtkv bench --tasks ruler`
sends.

Items: a RulerPlan made by trtkv.bench.tasks.ruler.probe_plan (the bench imports the probe, never
the other way): the bench's generator, tokenizer, encoder and seed, at bench.ruler_lengths with
bench.ruler_samples unless the CLI narrows them (an item depends only on seed, task, length, index
and tokenizer, so fewer samples are the bench's first items). Prompt ids are the server's: `input +
answer_prefix` with special tokens. Scoring: the plan's (the bench's summarize and string_match_all,
Wilson intervals).

Generation: prefill through the format's cache (every query attends the quantized K/V, as elsewhere
in the probe), then greedy decode one token at a time through the same cache, up to RULER's tokens
to generate, stopping at EOS. Two savings that change no score: items of one (task, length) that
share a token prefix (niah_single_1's noise haystack) prefill it once per format and copy the cache;
and decoding stops once every reference is in the text (string_match_all can only grow as text is
added), so a stored prediction may be shorter than the served one. Answers are cached per item under
cache/ruler_<format>.json, keyed by the format, its scales and the prompt. Imports of torch stay
inside functions: trtkv.measures.probe_results renders the section without torch.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.contracts.ruler import RulerPlan
from trtkv.core.errors import TrtkvError

if TYPE_CHECKING:
    from trtkv.contracts.probe_doc import ProbeDoc
    from trtkv.kvcache.names import FormatChoice
    from trtkv.kvcache.scales import KVScales
    from trtkv.probe.setup import Loaded

METHOD = 1  # bump when a cached answer would change (prompt ids, decoding, stopping)
MIN_SHARED_PREFIX = 32  # tokens: a shorter common prefix is not worth a cache copy


def item_id(item: Any) -> str:
    return f"{item.task}@{item.length}#{item.index}"


def _digest(ids: Sequence[int], item: Any) -> str:
    text = json.dumps([METHOD, list(ids), item.max_tokens, item.outputs])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def common_prefix(id_lists: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix every list shares, leaving each at least one token of its own to
    feed."""
    if len(id_lists) < 2:
        return 0
    first, n = id_lists[0], min(len(x) for x in id_lists) - 1
    for other in id_lists[1:]:
        k = 0
        while k < n and other[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


def greedy(
    loaded: Loaded,
    cache: Any,
    ids: Sequence[int],
    chunk: int | None,
    item: Any,
    tokenizer: Any,
    ends: set[int],
    match: Callable[[str, Sequence[str]], float],
) -> dict[str, Any]:
    """Feed `ids` (the prompt's tokens not yet in `cache`) and decode greedily: the prediction, why
    it stopped, tokens."""
    import torch

    from trtkv.probe.passes import feed

    model, device = loaded.model, loaded.device
    generated: list[int] = []
    text, stop = "", "max_tokens"
    with torch.inference_mode():
        hidden = feed(model, torch.tensor([list(ids)], device=device), cache, chunk)[:, -1]
        for step in range(item.max_tokens):
            nxt = int(model.lm_head(hidden).argmax(-1)[0])
            if nxt in ends:
                stop = "eos"
                break
            generated.append(nxt)
            text = tokenizer.decode(generated, skip_special_tokens=True)
            if match(text, item.outputs) == 1.0:
                stop = "all_found"
                break
            if step + 1 < item.max_tokens:
                hidden = feed(model, torch.tensor([[nxt]], device=device), cache, chunk)[:, -1]
    return {"prediction": text, "stop": stop, "generated": len(generated)}


def answer_group(
    loaded: Loaded,
    choice: FormatChoice,
    scales: KVScales,
    group: list[tuple[Any, list[int]]],
    tokenizer: Any,
    ends: set[int],
    match: Callable[[str, Sequence[str]], float],
) -> tuple[list[dict[str, Any]], int]:
    """Answers for items of one (task, length) through fresh caches of `choice`; a shared token
    prefix is prefilled once and its cache copied per item. Returns the answers and the prefix
    tokens shared."""
    from trtkv.probe.measure import chunk_for, make_cache
    from trtkv.probe.passes import feed

    chunk = chunk_for(choice)
    shared = common_prefix([ids for _, ids in group])
    base = None
    if shared >= MIN_SHARED_PREFIX:
        import torch

        base = make_cache(loaded, choice, scales)
        feed(loaded.model, torch.tensor([group[0][1][:shared]], device=loaded.device), base, chunk)
    else:
        shared = 0
    answers = []
    for item, ids in group:
        cache = copy.deepcopy(base) if base is not None else make_cache(loaded, choice, scales)
        t0 = time.time()
        answers.append(
            {
                **greedy(loaded, cache, ids[shared:], chunk, item, tokenizer, ends, match),
                "seconds": round(time.time() - t0, 2),
            }
        )
    return answers, shared


def run_ruler(
    out: Path,
    plan: RulerPlan,
    loaded: Loaded,
    choices: Sequence[FormatChoice],
    scales: KVScales,
    keys: Callable[[FormatChoice], list[str]],
    max_positions: int | None,
    step: Callable[[str, int], None] = lambda text, advance: None,
) -> dict[str, Any]:
    """Every format's answers to the plan's items (cached per item), scored per format: probe.json's
    `ruler`."""
    from trtkv.probe.setup import write_json

    reference = loaded.reference

    items, notes, tokenizer, lengths = plan.items, plan.notes, plan.tokenizer, plan.lengths
    if not items:
        raise TrtkvError(
            f"RULER lengths {list(lengths)}: no item could be made ({'; '.join(notes)}). "
            f"Next: longer --ruler-lengths, e.g. 2048."
        )
    prompt_ids = [list(tokenizer.encode(item.prompt, add_special_tokens=True)) for item in items]
    limit = max_positions
    if limit and any(
        len(ids) + it.max_tokens > limit for ids, it in zip(prompt_ids, items, strict=True)
    ):
        raise TrtkvError(
            f"RULER items at lengths {list(lengths)} plus special tokens exceed the model's "
            f"{limit} positions. Next: a shorter --ruler-lengths."
        )
    from trtkv.runtime import eos_ids

    ends = set(eos_ids(loaded.model.config, tokenizer))  # where the reference runtime stops
    groups: dict[tuple[str, int], list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault((item.task, item.length), []).append(i)
    formats: dict[str, Any] = {}
    for choice in choices:
        path = out / "cache" / f"ruler_{choice.name}.json"
        params = keys(choice)
        stored: dict[str, Any] = {}
        if path.is_file():
            doc = json.loads(path.read_text())
            stored = doc.get("answers", {}) if doc.get("params") == params else {}
        t0, fresh, shared_total = time.time(), 0, 0
        for (task, length), idx in groups.items():
            todo = [i for i in idx if _digest(prompt_ids[i], items[i]) not in stored]
            if not todo:
                continue
            step(f"RULER {choice.name} {task} @ {length}", 0)
            answers, shared = answer_group(
                loaded,
                choice,
                scales,
                [(items[i], prompt_ids[i]) for i in todo],
                tokenizer,
                ends,
                plan.match,
            )
            for i, answer in zip(todo, answers, strict=True):
                stored[_digest(prompt_ids[i], items[i])] = answer
            fresh += len(todo)
            shared_total += shared
            # after each group: an interrupted run resumes
            write_json(path, {"params": params, "answers": stored})
        got = [stored[_digest(ids, item)] for ids, item in zip(prompt_ids, items, strict=True)]
        summary = plan.summarize(items, [a["prediction"] for a in got])
        rows = [
            {
                "id": item_id(it),
                "score": r["score"],
                "prediction": a["prediction"],
                "stop": a["stop"],
                "generated": a["generated"],
            }
            for it, r, a in zip(items, summary.pop("items"), got, strict=True)
        ]
        formats[choice.name] = {
            **summary,
            "items": rows,
            "answered": fresh,
            "shared_prefix_tokens": shared_total,
            # cached ones too
            "seconds": round(sum(a.get("seconds", 0.0) for a in got), 1),
            "wall_seconds": round(time.time() - t0, 1),
            "generated_tokens": sum(a["generated"] for a in got),
        }
        step(f"RULER {choice.name}: done", 1)
    return {
        "ruler_commit": plan.commit,
        "seed": plan.seed,
        "metric": "string_match_all",
        "confidence": plan.confidence,
        "tasks": list(plan.tasks),
        "lengths": list(lengths),
        "samples": plan.samples,
        "tokenizer": str(plan.tokenizer_dir),
        "reference": reference,
        "notes": notes,
        "items": [
            {
                "id": item_id(it),
                "task": it.task,
                "length": it.length,
                "index": it.index,
                "input_tokens": it.input_tokens,
                "prompt_tokens": len(ids),
                "max_tokens": it.max_tokens,
                "outputs": it.outputs,
                "prompt_sha256": hashlib.sha256(it.prompt.encode()).hexdigest()[:16],
            }
            for it, ids in zip(items, prompt_ids, strict=True)
        ],
        "formats": formats,
        "below_reference": below_reference(formats, reference),
    }


def below_reference(formats: dict[str, Any], reference: str) -> list[dict[str, Any]]:
    """(format, task, length) cells whose interval lies wholly below the reference's: the only
    differences called."""
    ref = formats.get(reference)
    if not ref:
        return []
    out = []
    for name, doc in formats.items():
        if name == reference:
            continue
        for length, block in doc["by_length"].items():
            for task, cell in block["tasks"].items():
                other = ref["by_length"].get(length, {}).get("tasks", {}).get(task)
                if other and cell["interval"][1] < other["interval"][0]:
                    out.append(
                        {
                            "format": name,
                            "task": task,
                            "length": int(length),
                            "score": cell["score"],
                            "reference_score": other["score"],
                        }
                    )
    return out


def markdown_section(doc: ProbeDoc) -> list[str]:
    """probe.md's RULER table: format x length rows, one column per task (score and Wilson
    interval), the average."""
    r = doc.ruler
    if r is None or not r.formats:
        return []
    tasks = r.tasks
    lines = [
        "## RULER (long-context retrieval, the bench's items)",
        "",
        f"RULER (NVIDIA/RULER {r.ruler_commit[:12]}) tasks {', '.join(tasks)} at lengths "
        f"{r.lengths}, {r.samples} items per task and length, seed {r.seed}, the bench's "
        f"tokenizer ({r.tokenizer}): the items `trtkv bench --tasks ruler` sends. Greedy "
        f"through each format's cache (decode-side view, as above); score {r.metric} in "
        f"percent, [{r.confidence:.0%} Wilson interval of the mean].",
        "",
        "| format | length | " + " | ".join(tasks) + " | average | seconds |",
        "|---|---:|" + "---:|" * (len(tasks) + 2),
    ]
    for name, f in r.formats.items():
        for length, block in f.by_length.items():
            cells = [
                f"{c.score:.1f} [{c.interval[0]:.2f}, {c.interval[1]:.2f}]" if c else "-"
                for c in map(block.tasks.get, tasks)
            ]
            lines.append(
                f"| {name} | {length} | "
                + " | ".join(cells)
                + f" | {block.average:.1f} | {f.seconds:.0f} |"
            )
    below = r.below_reference
    lines += [""] + (
        [
            "- Below the reference (intervals separate): "
            + "; ".join(
                f"{b.format} {b.task} @ {b.length} ({b.score:.1f} vs {b.reference_score:.1f})"
                for b in below
            )
        ]
        if below
        else ["- No format's interval lies below the reference's in any cell."]
    )
    lines += [f"- Not run: {n}" for n in r.notes]
    return lines + [""]


def summary_lines(doc: ProbeDoc) -> list[str]:
    """`trtkv probe`'s printed RULER lines: per format and length, the average over the tasks."""
    return [
        f"  RULER {name:>11} @ {length:>5}: average {block.average:.1f} over "
        f"{len(block.tasks)} tasks"
        for name, f in (doc.ruler.formats if doc.ruler else {}).items()
        for length, block in f.by_length.items()
    ]
