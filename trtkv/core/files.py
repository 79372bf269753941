"""Reading files trtkv did not write (a model's config.json, records another process may have
damaged) without trusting them: a regular file only, opened with O_NONBLOCK (a FIFO swapped in never
blocks), at most the cap + 1 bytes read (`/dev/zero` behind a symlink ends at the cap), and JSON
parsed strictly (no NaN or Infinity, bounded nesting and number length, so no RecursionError and no
5000-digit integer reaches int()).

Errors are NotReadable with the problem and the next step; each caller names its file kind.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError

MAX_JSON_DEPTH = 64  # nested objects/arrays: a model config needs 4, a trtkv record 6
# digits, sign, point and exponent of one JSON number (an int64 has 19 digits)
MAX_NUMBER_CHARS = 40
NO_SUCH_FILE = "no such file"


class NotReadable(Exception):
    """A file that is not what its reader expects; `problem` and `next_step` are said to the
    user."""

    def __init__(self, problem: str, next_step: str) -> None:
        self.problem, self.next_step = problem, next_step
        super().__init__(problem)


def kind(mode: int) -> str:
    """What a file that is not a regular file is (a directory, a FIFO, ...)."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_capped(path: Path, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes`; NotReadable otherwise (missing, a
    FIFO, a device, a directory, unreadable, larger than the cap). The check is made on the opened
    descriptor (fstat), so a file swapped between a check and the read cannot slip through."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise NotReadable(NO_SUCH_FILE, f"check the path of the {what}") from None
    except (ValueError, TypeError):
        raise NotReadable("not a valid file name", "fix the path") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotReadable("symlink loop", "point the link at a real file") from None
        raise NotReadable(
            f"cannot open: {exc.strerror}", "check the file and its permissions"
        ) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # before fdopen, which raises IsADirectoryError on a directory
        os.close(fd)
        raise NotReadable(f"{kind(mode)}, not a regular file", f"name the {what} itself")
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise NotReadable(
                f"cannot read: {exc.strerror}", "check the file and the disk"
            ) from None
    if len(data) > max_bytes:
        raise NotReadable(
            f"larger than {max_bytes:,} bytes (the cap for a {what})",
            f"check this is the {what} you meant",
        )
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (a number must be finite)")


def _finite(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} overflows a float")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    return int(text)


def _depth_ok(text: str, max_depth: int) -> int | None:
    """None when no object/array nests deeper than `max_depth`, else the offset where it does
    (strings skipped)."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return i
        elif ch in "]}":
            depth -= 1
    return None


def strict_json(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON strictly: UTF-8, no NaN/Infinity, finite floats, numbers of at most
    MAX_NUMBER_CHARS characters, nesting of at most `max_depth`; ValueError saying what is wrong
    (json.JSONDecodeError is one)."""
    # UnicodeDecodeError is a ValueError
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    deep = _depth_ok(text, max_depth)
    if deep is not None:
        raise ValueError(f"nested deeper than {max_depth} levels (at character {deep})")
    return json.loads(
        text, parse_constant=_refuse_constant, parse_float=_finite, parse_int=_bounded_int
    )


def read_json(path: Path, max_bytes: int, what: str = "JSON file") -> Any:
    """read_capped + strict_json; NotReadable for either."""
    data = read_capped(path, max_bytes, what)
    try:
        return strict_json(data)
    except ValueError as exc:
        raise NotReadable(f"not readable JSON ({_one_line(exc)})", f"replace the {what}") from None


def json_object(path: Path, missing: str, max_bytes: int = 64 * 1024 * 1024) -> dict[str, Any]:
    """The JSON object in `path` (read_json); StageError naming the file and the problem, with
    `missing` as the next step where there is no such file."""
    try:
        data = read_json(path, max_bytes, path.name)
    except NotReadable as exc:
        if exc.problem == NO_SUCH_FILE:
            raise StageError(f"{path}: missing. Next: {missing}.") from None
        raise StageError(f"{path}: {exc.problem}. Next: {exc.next_step}.") from None
    if not isinstance(data, dict):
        raise StageError(f"{path}: expected a JSON object, got {type(data).__name__}.")
    return data


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError raised inside without a file name (a write or close on a full disk names none)
    gets `path`, so the one error line the CLI prints says where
    (trtkv.core.errors.os_error_line)."""
    try:
        yield
    except OSError as exc:
        if (
            exc.filename is None
            and exc.errno is not None
            and not isinstance(exc, (BrokenPipeError, TimeoutError))
        ):
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
