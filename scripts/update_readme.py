"""Regenerate the generated parts of README.md: the recipe reference (from the pydantic schema) and the version
matrix (from trtkv/data/trtllm_versions.json). Tests check both are current."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtkv.recipe import reference_markdown  # noqa: E402
from trtkv.versions import table_markdown  # noqa: E402

SECTIONS = {"recipe-reference": reference_markdown, "version-matrix": table_markdown}


def fill(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    for name, make in SECTIONS.items():
        text = fill(text, name, make())
    readme.write_text(text)
    print(f"updated {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
