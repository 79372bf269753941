"""Regenerate the recipe reference in README.md from the pydantic schema (tests check it is current)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtkv.recipe import reference_markdown  # noqa: E402

START, END = "<!-- recipe-reference:start -->", "<!-- recipe-reference:end -->"


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{reference_markdown()}\n{END}{tail}")
    print(f"updated {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
