"""Text for calibration and evaluation: shipped `.jsonl` under calibration_data/, or the user's own
files."""

from __future__ import annotations

import glob
import json
from pathlib import Path

from trtkv.core import paths
from trtkv.core.errors import StageError

CALIB_DEFAULT = "calibration_data/calib/*.jsonl"
# long natural text, disjoint from calibration
EVAL_LONG_TEXT = "calibration_data/eval/kjv_nt.jsonl"
QUIZ = "calibration_data/eval/quiz_capitals.jsonl"


def resolve_files(pattern: str, field: str = "calibration.dataset") -> list[Path]:
    """A file, a folder (its .jsonl/.txt files) or a glob; relative to the project root."""
    base = Path(pattern).expanduser()
    if not base.is_absolute():
        base = paths.project_root() / base
    if base.is_dir():
        files = sorted([*base.rglob("*.jsonl"), *base.rglob("*.txt")])
    elif any(ch in str(base) for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(base), recursive=True))
    else:
        files = [base] if base.is_file() else []
    files = [f for f in files if f.suffix in (".jsonl", ".txt") and f.is_file()]
    if not files:
        raise StageError(
            f"{field} {pattern!r}: no .jsonl or .txt files found at {base}. "
            'Next: point it at a .jsonl file of {"text": ...} lines, a .txt file, a folder or a '
            "glob."
        )
    return files


def read_texts(files: list[Path]) -> list[str]:
    """Records from .jsonl (`text` field) and .txt (paragraphs separated by blank lines)."""
    texts: list[str] = []
    for path in files:
        if path.suffix == ".jsonl":
            for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise StageError(
                        f"{path}:{lineno}: not valid JSON ({exc.msg}). Next: one JSON object per "
                        "line."
                    ) from exc
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise StageError(
                        f'{path}:{lineno}: expected an object with a string "text" field.'
                    )
                texts.append(record["text"])
        else:
            texts += [
                p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()
            ]
    if not texts:
        raise StageError(f"{', '.join(map(str, files))}: no text records found.")
    return texts


def load_texts(pattern: str, field: str = "calibration.dataset") -> list[str]:
    return read_texts(resolve_files(pattern, field))


def eval_long_text() -> list[str]:
    """Long natural text for probing and needle haystacks (never used for calibration)."""
    return load_texts(EVAL_LONG_TEXT, field="evaluation text")


def quiz_items() -> list[dict[str, str]]:
    path = paths.project_root() / QUIZ
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
