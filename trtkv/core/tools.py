"""Running external tools: argument lists only, output streamed to a log file and the console."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from trtkv.core.errors import ToolError
from trtkv.core.process import stop_process_group


def quote(cmd: Sequence[str]) -> str:
    return shlex.join([str(c) for c in cmd])


def tail(path: Path, lines: int = 30) -> str:
    try:
        with path.open(errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError:
        return ""


# how long output may keep coming after the tool exited (grandchildren holding the pipe)
READER_GRACE_S = 2.0


def run_logged(
    cmd: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    echo: bool = True,
    hint: str = "",
    timeout_s: float | None = None,
    stop_grace_s: float = 10.0,
) -> None:
    """Run `cmd`, copying its output to `log_path` (and the console); raise ToolError with the log
    tail on failure.

    The child leads its own process group. Whenever this function returns or raises (failure,
    Ctrl-C, timeout, any error) the group is ended: SIGTERM, then SIGKILL after `stop_grace_s`, so
    no grandchild (e.g. an MPI worker) is left behind.
    Output is decoded as UTF-8, invalid bytes shown as replacement characters.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    argv = [str(c) for c in cmd]
    with log_path.open("w", encoding="utf-8") as log:
        log.write(f"$ {quote(argv)}\n")
        log.flush()
        proc = _start(argv, full_env, cwd)
        reader = threading.Thread(target=_copy_lines, args=(proc, log, echo), daemon=True)
        reader.start()
        try:
            code: int | None = proc.wait(timeout=timeout_s)
            reader.join(timeout=READER_GRACE_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_process_group(proc, stop_grace_s)
            reader.join(timeout=READER_GRACE_S)
    if code is None:
        raise ToolError(
            f"{argv[0]} did not finish within {timeout_s} s and was stopped.\ncommand: "
            f"{quote(argv)}\nlog: {log_path}\n--- last lines of the log ---\n{tail(log_path)}"
        )
    if code != 0:
        msg = (
            f"{argv[0]} exited with code {code}.\ncommand: {quote(argv)}\nlog: {log_path}\n"
            f"--- last lines of the log ---\n{tail(log_path)}"
        )
        if hint:
            msg += f"\nhint: {hint}"
        raise ToolError(msg)


def _start(argv: list[str], env: dict[str, str], cwd: Path | None) -> subprocess.Popen[str]:
    """Popen in a new session with text output (UTF-8, errors replaced); exec failures as
    ToolError."""
    try:
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise ToolError(
            f"{argv[0]}: not found ({exc.strerror}). Next: install it or fix PATH"
            f"{'' if cwd is None else f' (and check that {cwd} exists)'}."
        ) from exc
    except PermissionError as exc:
        raise ToolError(
            f"{argv[0]}: permission denied ({exc.strerror}). Next: make it executable (chmod +x) "
            "or check that PATH names the right program."
        ) from exc
    except OSError as exc:
        raise ToolError(
            f"{argv[0]}: could not be started ({exc.strerror or exc}). Next: check that it is a "
            "program for this machine (architecture, `#!` interpreter line)."
        ) from exc


def _copy_lines(proc: subprocess.Popen[str], log: TextIO, echo: bool) -> None:
    """Copy the child's output to the log (and the console) until the pipe closes or the log is
    closed."""
    stream = proc.stdout
    if stream is None:  # pragma: no cover - PIPE always gives a stream
        return
    try:
        for line in stream:
            log.write(line)
            if echo:
                sys.stdout.write(line)
    except ValueError:  # the log was closed: run_logged gave up waiting for the rest of the output
        return
