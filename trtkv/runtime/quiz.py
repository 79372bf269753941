"""Measurement: the quantized-KV greedy answers vs unquantized ones on the shipped quiz (`python -m
trtkv.runtime`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from trtkv.runtime.engine import ReferenceRuntime
from trtkv.runtime.errors import RequestError

# ---------------------------------------------------------------------------------------------
# Measurement: quantized-KV greedy answers vs unquantized ones on the shipped quiz
# (the bench's quiz prompt and scoring, trtkv.runtime.quiz_patterns, so the figures compare with
# `trtkv bench`)


def quiz_answers(
    runtime: ReferenceRuntime, items: list[dict[str, str]], max_tokens: int = 10
) -> list[str]:
    """Greedy answers (first line, stripped) to the bench's few-shot capital-city prompt of each
    item."""
    from trtkv.runtime import quiz_patterns as quiz

    if runtime.tokenizer is None:
        raise RequestError("quiz answers need the tokenizer.")
    newline = runtime.tokenizer("\n", add_special_tokens=False)["input_ids"]
    answers = []
    for item in items:
        prompt = quiz.few_shot_prompt(quiz.render(item["question"]))
        ids = runtime.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out = runtime.generate(ids, max_tokens=max_tokens, stop_words=[newline])
        answers.append(
            str(runtime.tokenizer.decode(out, skip_special_tokens=True))
            .strip()
            .split("\n")[0]
            .strip()
        )
    return answers


def quiz_agreement(
    runtime: ReferenceRuntime, items: list[dict[str, str]], max_tokens: int = 10
) -> dict[str, Any]:
    """How often the runtime's KV format gives the same greedy quiz answer as an unquantized KV
    cache (+ accuracy)."""
    from trtkv.runtime import quiz_patterns as quiz

    quantized = quiz_answers(runtime, items, max_tokens)
    baseline = quiz_answers(runtime.with_kv_format("none"), items, max_tokens)
    same = [a == b for a, b in zip(quantized, baseline, strict=True)]
    fmt = runtime.kv_format
    return {
        "kv_format": fmt,
        "items": len(items),
        "agree": sum(same),
        "agreement": sum(same) / max(1, len(items)),
        "accuracy": {
            fmt: sum(
                quiz.is_correct(it["answer"], a) for it, a in zip(items, quantized, strict=True)
            )
            / max(1, len(items)),
            "none": sum(
                quiz.is_correct(it["answer"], b) for it, b in zip(items, baseline, strict=True)
            )
            / max(1, len(items)),
        },
        "differences": [
            {"question": quiz.render(it["question"]), fmt: a, "none": b}
            for it, a, b, s in zip(items, quantized, baseline, same, strict=True)
            if not s
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m trtkv.runtime ENGINE_DIR [--items N]`: print the quiz agreement of the engine's KV format."""  # noqa: E501
    import argparse
    import time

    from trtkv.core.texts import quiz_items

    parser = argparse.ArgumentParser(prog="python -m trtkv.runtime", description=main.__doc__)
    parser.add_argument("engine_dir", type=Path)
    parser.add_argument("--items", type=int, default=0, help="first N quiz items (0 = all)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    items = quiz_items()
    items = items[: args.items] if args.items else items
    start = time.time()
    runtime = ReferenceRuntime.load(args.engine_dir, threads=args.threads)
    result = quiz_agreement(runtime, items)
    result["seconds"] = round(time.time() - start, 1)
    acc = result["accuracy"]
    print(
        f"{result['kv_format']} KV vs unquantized KV: {result['agree']}/{result['items']} greedy "
        f"quiz answers agree ({100 * result['agreement']:.1f}%); quiz accuracy "
        f"{acc[result['kv_format']]:.3f} vs {acc['none']:.3f}; {result['seconds']} s"
    )
    for d in result["differences"][:20]:
        print(f"  {d['question']}: {d[result['kv_format']]!r} vs {d['none']!r}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
