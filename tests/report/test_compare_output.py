"""`trtkv compare` replaces engines/compare/ (or --output) only when the new report is complete and only if trtkv
made the old one (issue 48): before, the default folder was written in place, file by file, with no ownership check,
so an interrupted compare left a new compare.md beside an old compare.png, and a recipe named `compare`
(engines/compare/) had compare's files written into it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtkv.core.errors import StageError
from trtkv.report import compare


def _fake_write(fail: bool):  # type: ignore[no-untyped-def]
    def write(_recipes: object, _plans: object, _results: object, out: Path) -> Path:
        (out / "compare.md").write_text("new\n")
        (out / "compare.json").write_text("[]\n")
        if fail:
            raise KeyboardInterrupt  # stopped half-way, before the plot
        (out / "compare.png").write_bytes(b"new")
        return out / "compare.md"
    return write


def test_an_interrupted_compare_keeps_the_previous_report_whole(engines_tmp: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    old = engines_tmp / "compare"
    old.mkdir(parents=True)
    for name in compare.COMPARE_FILES:  # an earlier compare's folder (no owner file: before 2026-12)
        (old / name).write_text("old\n")
    out = compare.compare_output(None)
    monkeypatch.setattr(compare, "write_compare", _fake_write(fail=True))
    with pytest.raises(KeyboardInterrupt):
        compare.write_compare_folder([], [], [], out)
    assert {p.name: p.read_text() for p in old.iterdir()} == {n: "old\n" for n in compare.COMPARE_FILES}
    assert [p.name for p in engines_tmp.iterdir()] == ["compare"]  # no temporary folder left
    monkeypatch.setattr(compare, "write_compare", _fake_write(fail=False))
    md = compare.write_compare_folder([], [], [], compare.compare_output(None))
    assert md.read_text() == "new\n" and (old / "compare.png").read_bytes() == b"new"
    assert json.loads((old / ".trtkv-owner").read_text())["stage"] == "compare"
    assert compare.compare_output(None) == old  # its own folder: replaced again next time


def test_a_folder_trtkv_did_not_write_is_refused_before_any_work(engines_tmp: Path) -> None:
    """A recipe named `compare` has its stage folders in engines/compare/: never compare's to replace."""
    (engines_tmp / "compare" / "checkpoint").mkdir(parents=True)
    (engines_tmp / "compare" / "checkpoint" / "manifest.json").write_text('{"stage": "calibrate"}')
    with pytest.raises(StageError, match="trtkv did not write"):
        compare.compare_output(None)
    mine = engines_tmp.parent / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    with pytest.raises(StageError, match="trtkv did not write"):
        compare.compare_output(mine)
    assert (mine / "notes.txt").read_text() == "mine\n"
