"""RULER's four task families, for trtkv.bench.tasks.ruler_gen: their templates and answer prefixes
(FAMILIES), the words they draw (wonderwords' lists), and the text of one item per family for a
given haystack size (niah, variable tracking, common words, frequent words). Which of RULER's files
each follows: trtkv.bench.tasks.ruler_gen.
"""

from __future__ import annotations

import math
import random
import string
import uuid
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from trtkv.core.errors import ToolError, TrtkvError

# RULER's docker/requirements.txt names wonderwords unpinned; this is its latest
WONDERWORDS = "wonderwords==3.0.1"

Encode = Callable[[str], Sequence[int]]
Made = tuple[str, str, list[str]]  # input (up to the answer prefix), answer prefix, references

# scripts/data/synthetic/constants.py: (template, answer prefix, tokens_to_generate) per task
# family; RULER's prepare.py appends the answer prefix to the template ('base' model template: the
# task template unchanged)
FAMILIES: dict[str, tuple[str, str, int]] = {
    "niah": (
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
        "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are "
        "all the special magic {type_needle_v} for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are",
        128,
    ),
    "variable_tracking": (
        "Memorize and track the chain(s) of variable assignment hidden in the following "
        "text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in "
        "the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
        "variables are assigned the value {query}, they are: ",
        30,
    ),
    "common_words_extraction": (
        "Below is a numbered list of words. In these words, some appear more often than others. "
        "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most "
        "common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:",
        120,
    ),
    "freq_words_extraction": (
        "Read the following coded text and track the frequency of each coded word. Find the three "
        "most frequently appeared coded words. {context}\nQuestion: Do not provide any "
        "explanation. Please ignore the dots '....'. What are the three most frequently appeared "
        "words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
        50,
    ),
}

# niah.py, vt
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."  # niah.py
VT_ICL_TOKENS = 500  # variable_tracking.py main(): the one-shot example is fitted to 500 tokens


class RulerError(TrtkvError):
    """A RULER item that cannot be made (a length too short for the task, a task name unknown)."""


def seeded_rng(*parts: object) -> random.Random:
    """A generator seeded by a string (sha512 of it: the same stream in every process and Python
    version >= 3.2)."""
    return random.Random(":".join(str(p) for p in parts))


@lru_cache(maxsize=1)
def wordlists() -> dict[str, list[str]]:
    """wonderwords' noun, adjective and verb lists, read as RULER reads them (one word a line,
    right-stripped)."""
    try:
        from importlib.resources import files

        import wonderwords.assets  # noqa: F401
    except ImportError as exc:
        raise ToolError(
            "RULER's niah_single_1, niah_multikey_2 and cwe draw RULER's words from the "
            f"wonderwords package, which is not installed. Next: pip install '{WONDERWORDS}'."
        ) from exc
    folder = files("wonderwords.assets")
    return {
        name: [w.rstrip() for w in folder.joinpath(f"{name}list.txt").read_text().splitlines()]
        for name in ("noun", "adjective", "verb")
    }


@lru_cache(maxsize=1)
def _niah_word_parts() -> tuple[list[str], list[str]]:
    """niah.py's keys are `adjective-noun`; picking each part uniformly is picking a pair uniformly
    (6 M of them)."""
    w = wordlists()
    return sorted(set(w["adjective"])), sorted(set(w["noun"]))


@lru_cache(maxsize=1)
def cwe_words() -> list[str]:
    w = wordlists()
    return sorted(set(w["noun"] + w["adjective"] + w["verb"]))


# --------------------------------------------------------------------------------------------------
# niah


def _needle_value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":  # niah.py generate_random_number: 7 digits
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        adjs, nouns = _niah_word_parts()
        return f"{rng.choice(adjs)}-{rng.choice(nouns)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def niah(args: dict[str, Any], n: int, rng: random.Random) -> Made:
    k_type, v_type = args["k"], args["v"]
    keys: list[str] = []
    values: list[list[str]] = []
    needles: list[str] = []
    for _ in range(max(args["num_k"], args["num_q"])):
        key = _needle_value(k_type, rng)
        while key in keys:
            key = _needle_value(k_type, rng)
        keys.append(key)
        values.append([_needle_value(v_type, rng) for _ in range(args["num_v"])])
        needles += [NEEDLE.format(type_needle_v=v_type, key=key, value=v) for v in values[-1]]
    rng.shuffle(needles)
    if args["haystack"] == "noise":
        sentences = [NOISE] * n
    # distractor needles; unlike RULER, none repeats a needle's key or value (so each answer occurs
    # once)
    else:
        taken = set(keys) | {v for vs in values for v in vs}
        sentences = []
        while len(sentences) < n:
            key, value = _needle_value(k_type, rng), _needle_value(v_type, rng)
            if key not in taken and value not in taken:
                sentences.append(NEEDLE.format(type_needle_v=v_type, key=key, value=value))
    for pos, needle in zip(
        sorted(rng.sample(range(n), len(needles)), reverse=True), needles, strict=True
    ):
        sentences.insert(pos, needle)
    picked = rng.sample(range(len(keys)), args["num_q"])
    queries = [keys[i] for i in picked]
    answers = [v for i in picked for v in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, prefix, _ = FAMILIES["niah"]
    type_v = v_type
    if args["num_q"] * args["num_v"] == 1:  # niah.py: one answer reads in the singular
        for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template, prefix = template.replace(old, new), prefix.replace(old, new)
        type_v = v_type[:-1]
    fill = {"type_needle_v": type_v, "query": query}
    return template.format(context="\n".join(sentences), **fill), prefix.format(**fill), answers


# --------------------------------------------------------------------------------------------------
# variable tracking


def _names(rng: random.Random, count: int, letters: int, avoid: Sequence[str] = ()) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in out and name not in avoid:
            out.append(name)
    return out


def _vt_text(n: int, positions: Sequence[int], names: Sequence[str], value: str) -> tuple[str, str]:
    """variable_tracking.py's noise haystack: the chain's lines inserted at sorted positions among
    `n` noise lines."""
    chain = [f"VAR {names[0]} = {value}"] + [
        f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(len(names) - 1)
    ]
    sentences = [NOISE] * n
    for j, pos in enumerate(positions):
        sentences.insert(pos + j, chain[j])
    template, prefix, _ = FAMILIES["variable_tracking"]
    fill = {"query": value, "num_v": len(names)}
    return template.format(context="\n".join(sentences), **fill), prefix.format(**fill)


def _vt_value(rng: random.Random) -> str:
    # numpy's randint(10000, 99999): the upper bound excluded
    return str(rng.randrange(10000, 99999))


class VariableTracking:
    """vt: one 4-hop chain among noise lines, after a one-shot example of the task fitted to 500
    tokens."""

    def __init__(self, args: dict[str, Any], encode: Encode, seed: int) -> None:
        self.hops = args["num_hops"]

        # the example: 3-letter names, value 12345 while it is fitted, then new names and a new
        # value per item (variable_tracking.py randomize_icl) at the same noise lines and positions
        def layout(n: int) -> tuple[list[int], list[str]]:
            rng = seeded_rng(seed, "vt-icl", n)
            return sorted(rng.sample(range(n), self.hops + 1)), _names(rng, self.hops + 1, 3)

        def fits(n: int) -> bool:
            positions, names = layout(n)
            return len(encode("".join(_vt_text(n, positions, names, "12345")))) <= VT_ICL_TOKENS

        self.icl_n = largest_fit(fits, 5)
        self.icl_positions = layout(self.icl_n)[0]

    def __call__(self, n: int, rng: random.Random) -> Made:
        names = _names(rng, self.hops + 1, 5)
        value = _vt_value(rng)
        icl_value = _vt_value(rng)
        while icl_value == value:
            icl_value = _vt_value(rng)
        icl_names = _names(rng, self.hops + 1, 3)
        icl = (
            "".join(_vt_text(self.icl_n, self.icl_positions, icl_names, icl_value))
            + " "
            + " ".join(icl_names)
            + "\n"
        )
        text, prefix = _vt_text(n, sorted(rng.sample(range(n), self.hops + 1)), names, value)
        return icl + "\n" + text, prefix, names


# --------------------------------------------------------------------------------------------------
# common and frequent words


def cwe(args: dict[str, Any], length: int, n: int, rng: random.Random) -> Made:
    """common_words_extraction.py: a numbered list where 10 words repeat more often, after a
    one-shot example."""
    words = cwe_words()
    # RULER then draws from json/english_words.json (a Git LFS file trtkv does not ship)
    if n > len(words):
        raise RulerError(f"cwe: {n} distinct words asked, wonderwords has {len(words)}")
    num_cw = args["num_cw"]

    def example(count: int, common_repeats: int, uncommon_repeats: int) -> tuple[str, list[str]]:
        chosen = rng.sample(words, count)
        common, uncommon = chosen[:num_cw], chosen[num_cw:]
        listed = common * common_repeats + uncommon * uncommon_repeats
        rng.shuffle(listed)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common

    template, prefix, _ = FAMILIES["common_words_extraction"]
    short = length < 4096  # RULER's repeats below 4096 tokens
    shots = []
    for _ in range(args["num_fewshot"]):
        ctx, common = example(20, 3, 1) if short else example(40, 10, 3)
        shots.append(
            template.format(context=ctx)
            + prefix
            + " "
            + " ".join(f"{i + 1}. {w}" for i, w in enumerate(common))
        )
    ctx, answer = example(n, 6, 1) if short else example(n, args["freq_cw"], args["freq_ucw"])
    return "\n".join(shots) + "\n" + template.format(context=ctx), prefix, answer


def _zeta(alpha: float) -> float:
    """Riemann zeta for alpha > 1 (scipy.special.zeta in RULER): a partial sum and its
    Euler-Maclaurin tail."""
    if alpha == 2.0:
        return math.pi**2 / 6
    big = 1000
    return (
        sum(k**-alpha for k in range(1, big))
        + big ** (1 - alpha) / (alpha - 1)
        + big**-alpha / 2
        + alpha * big ** (-alpha - 1) / 12
    )


def fwe(args: dict[str, Any], vocab_size: int, n: int, rng: random.Random) -> Made:
    """freq_words_extraction.py: coded words drawn with Zipf counts; the most frequent is '...'
    (noise)."""
    wordlen, alpha = args["coded_wordlen"], args["alpha"]
    vocab: set[str] = set()
    while len(vocab) < vocab_size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=wordlen)))
    ranked = sorted(vocab)
    rng.shuffle(ranked)
    ranked[0] = "..."
    z = _zeta(alpha)
    coded = [w for k, w in enumerate(ranked, start=1) for _ in range(int(n * k**-alpha / z))]
    rng.shuffle(coded)
    template, prefix, _ = FAMILIES["freq_words_extraction"]
    return template.format(context=" ".join(coded)), prefix, ranked[1:4]


# --------------------------------------------------------------------------------------------------
# the largest haystack that fits (vt's one-shot example here, every task in
# trtkv.bench.tasks.ruler_gen.generate)


def largest_fit(fits: Callable[[int], bool], lowest: int, highest: int | None = None) -> int:
    """The largest haystack size that fits, by bisection as RULER's binary search; the upper bound
    doubles until it no longer fits (RULER guesses 3x an estimate, which the one-shot examples'
    tokens can make too small)."""
    if not fits(lowest):
        return 0
    lo, hi = lowest, 2 * lowest
    while (highest is None or hi < highest) and fits(hi):
        lo, hi = hi, 2 * hi
    hi = hi if highest is None else min(hi, highest)
    if hi > lo and fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
