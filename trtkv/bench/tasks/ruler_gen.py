"""RULER's synthetic long-context tasks that need no download, written for trtkv from RULER's own
definitions.

Source: NVIDIA/RULER at RULER_COMMIT. Templates, answer prefixes and tokens to generate:
scripts/data/synthetic/ constants.py; task arguments: scripts/synthetic.yaml; haystacks, needles and
length fitting: scripts/data/synthetic/ niah.py, variable_tracking.py, common_words_extraction.py,
freq_words_extraction.py; the answer prefix sent after the input: scripts/pred/call_api.py. The
words are RULER's: wonderwords' noun, adjective and verb lists. Where trtkv differs from RULER
(random streams, a guard against distractor collisions, the search's upper bound) is in
docs/ruler.md. The families' templates, words and the text of one item are
trtkv.bench.tasks.ruler_families; this module holds the task table, the item and the fitting of
items to a length (generate).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from trtkv.bench.tasks.ruler_families import (
    FAMILIES,
    Encode,
    Made,
    RulerError,
    VariableTracking,
    cwe,
    cwe_words,
    fwe,
    largest_fit,
    niah,
    seeded_rng,
)

RULER_COMMIT = "c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a"
RULER_SEED = 42  # scripts/data/prepare.py --random_seed default

# scripts/synthetic.yaml: the tasks RULER generates without a download (no essay haystack, no QA
# data set)
TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "niah_single_1": (
        "niah",
        {"haystack": "noise", "k": "words", "v": "numbers", "num_k": 1, "num_v": 1, "num_q": 1},
    ),
    "niah_multikey_2": (
        "niah",
        {"haystack": "needle", "k": "words", "v": "numbers", "num_k": 1, "num_v": 1, "num_q": 1},
    ),
    "niah_multikey_3": (
        "niah",
        {"haystack": "needle", "k": "uuids", "v": "uuids", "num_k": 1, "num_v": 1, "num_q": 1},
    ),
    "vt": ("variable_tracking", {"num_chains": 1, "num_hops": 4}),
    "cwe": (
        "common_words_extraction",
        {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10, "num_fewshot": 1},
    ),
    "fwe": ("freq_words_extraction", {"alpha": 2.0, "coded_wordlen": 6}),
}
MAX_RETRIES = 100


@dataclass
class RulerItem:
    """One RULER sample, JSON-serialisable: the prompt is `input + answer_prefix`, as RULER's
    call_api.py sends it."""

    task: str
    # the target: prompt tokens + the task's tokens to generate <= length (RULER's max_seq_length)
    length: int
    index: int
    seed: int
    input: str
    answer_prefix: str
    outputs: list[str]
    # tokens of input + answer_prefix with the tokenizer the item was made for (no special tokens)
    input_tokens: int
    max_tokens: int  # RULER's tokens_to_generate
    # noise sentences, distractor needles, distinct words or coded words of the haystack
    haystack_units: int

    @property
    def prompt(self) -> str:
        return self.input + self.answer_prefix

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RulerItem:
        return cls(**data)


# --------------------------------------------------------------------------------------------------
# Fitting the length


def generate(
    task: str, length: int, count: int, encode: Encode, seed: int = RULER_SEED
) -> list[RulerItem]:
    """`count` items of `task` whose prompt tokens + tokens to generate fit `length`, as RULER fits
    them: the largest haystack that fits, then per item that size, made smaller while the item's own
    draw does not fit."""
    if task not in TASKS:
        raise RulerError(
            f"RULER task {task!r} is not one trtkv makes; allowed: {', '.join(TASKS)}."
        )
    family, args = TASKS[task]
    max_tokens = FAMILIES[family][2]

    def tokens(made: Made) -> int:
        return len(encode(made[0] + made[1]))

    make: Callable[[int, random.Random], Made]
    if family == "niah":
        make, step = (lambda n, rng: niah(args, n, rng)), 5 if length < 4096 else 25
    elif family == "variable_tracking":
        make, step = VariableTracking(args, encode, seed), 5 if length < 4096 else 10
    elif family == "common_words_extraction":
        make, step = (lambda n, rng: cwe(args, length, n, rng)), 10
    else:
        budget = length - max_tokens
        vocab_size, step = budget // 50, budget // 32
        if vocab_size < 4 or step < 1:
            raise RulerError(
                f"fwe at {length} tokens: too short (RULER's vocabulary is (length - {max_tokens}) "
                f"// 50 words, at least 4 needed: length >= {200 + max_tokens})."
            )
        make = lambda n, rng: fwe(args, vocab_size, n, rng)  # noqa: E731

    measured: dict[int, int] = {}

    def fit_tokens(n: int) -> int:
        if n not in measured:
            measured[n] = tokens(make(n, seeded_rng(seed, task, length, "fit", n))) + max_tokens
        return measured[n]

    def fits(n: int) -> bool:
        return fit_tokens(n) <= length

    # freq_words_extraction.py: grow by `step` from budget // 6 while the text
    if family == "freq_words_extraction":
        units = (length - max_tokens) // 6  # is shorter than the budget, then step back once
        while fit_tokens(units) < length:
            units += step
        units -= step
    else:
        highest = len(cwe_words()) if family == "common_words_extraction" else None
        units = largest_fit(fits, step, highest)
        if highest is not None and units == highest and fits(highest):
            raise RulerError(
                f"cwe at {length} tokens needs more than the {highest} distinct words of "
                "wonderwords (RULER then draws from json/english_words.json, which trtkv does not "
                "ship)."
            )
    if units < step:
        raise RulerError(
            f"{task} at {length} tokens: too short for RULER's smallest haystack ({step} units) "
            f"and {max_tokens} tokens to generate. Next: a longer length in bench.ruler_lengths."
        )
    # RULER steps an item that does not fit back by its search step (5-25 units); trtkv by one unit
    # (fwe: RULER's step, 1/32 of the budget), so items sit closer to the length, never above it
    retry_step = step if family == "freq_words_extraction" else 1
    items = []
    for index in range(count):
        n = units
        for attempt in range(MAX_RETRIES):
            made = make(n, seeded_rng(seed, task, length, index, attempt))
            used = tokens(made)
            if used + max_tokens <= length:
                break
            n = max(step, n - retry_step)
        else:
            raise RulerError(
                f"{task} at {length} tokens: item {index} did not fit in {MAX_RETRIES} draws."
            )
        items.append(
            RulerItem(
                task, length, index, seed, made[0], made[1], list(made[2]), used, max_tokens, n
            )
        )
    return items
