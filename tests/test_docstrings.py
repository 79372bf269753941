"""No docstring or comment in trtkv/ cites a document that does not exist (a facts.md, numbered 'contracts')."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"\b(?:docs/[\w./-]+\.md|[\w-]+\.md)\b")
GONE = re.compile(r"\bcontract[ -]\d\b|\bfacts\.md\b")  # "contract 1" and "contract-1" alike


def test_every_cited_document_exists() -> None:
    missing, gone = [], []
    for path in sorted((ROOT / "trtkv").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        gone += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in GONE.finditer(text)]
        for m in CITED.finditer(text):
            name = m.group(0)
            if name.startswith("docs/") and not (ROOT / name).is_file():
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not gone, gone
    assert not missing, missing


def test_the_gone_pattern_sees_both_spellings() -> None:
    assert [m.group(0) for m in GONE.finditer("the contract-1 file, contract 2, contracts 3")] == \
        ["contract-1", "contract 2"]
