"""trtkv.core.files.read_capped on files that are not regular files."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.core.files import NotReadable, read_capped


def test_a_directory_is_not_readable_not_an_oserror(tmp_path: Path) -> None:
    """On main os.fdopen raised IsADirectoryError before the regular-file check could answer."""
    with pytest.raises(NotReadable, match="a directory, not a regular file"):
        read_capped(tmp_path, 10, "recipe file")


def test_a_regular_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 11)
    assert read_capped(path, 11) == b"x" * 11
    with pytest.raises(NotReadable, match="larger than 10 bytes"):
        read_capped(path, 10)
