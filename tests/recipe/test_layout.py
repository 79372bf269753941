"""Stage folder names have one home, trtkv/recipe/layout.py: no other module joins a path with one of them."""

from __future__ import annotations

import ast
from pathlib import Path

from trtkv.recipe import layout

PACKAGE = Path(__file__).resolve().parents[2] / "trtkv"
NAMES = {layout.CHECKPOINT, layout.ENGINE, layout.SERVE, layout.BENCH, layout.FIDELITY, layout.PROBE, layout.REPORT,
         layout.TOKENIZER, layout.HF}


def spelled_joins(tree: ast.AST) -> list[int]:
    """Lines where `path / "<stage folder>"` is written with the name as a string."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant) and node.right.value in NAMES]


def test_the_check_sees_a_spelled_stage_folder() -> None:
    assert spelled_joins(ast.parse('out = root / "bench" / "x.json"\nok = root / layout.BENCH\n')) == [1]


def test_stage_folders_are_named_only_in_the_layout() -> None:
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             if "templates" not in path.parts and path != PACKAGE / "recipe" / "layout.py"
             for line in spelled_joins(ast.parse(path.read_text()))]
    assert found == []
