"""Running external tools: argument lists only, output streamed to a log file and the console."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

from trtkv.errors import ToolError


def quote(cmd: Sequence[str]) -> str:
    return shlex.join([str(c) for c in cmd])


def tail(path: Path, lines: int = 30) -> str:
    try:
        with path.open(errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError:
        return ""


def run_logged(
    cmd: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    echo: bool = True,
    hint: str = "",
) -> None:
    """Run `cmd`, copying its output to `log_path` (and the console); raise ToolError with the log tail on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    with log_path.open("w") as log:
        log.write(f"$ {quote(cmd)}\n")
        log.flush()
        try:
            proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env=full_env, cwd=cwd, text=True, bufsize=1)
        except FileNotFoundError as exc:
            raise ToolError(f"{cmd[0]}: not found on PATH ({exc}). Next: install it or fix PATH.") from exc
        stream = proc.stdout
        if stream is None:  # pragma: no cover - PIPE always gives a stream
            raise ToolError(f"{cmd[0]}: no output stream")
        try:
            for line in stream:
                log.write(line)
                if echo:
                    sys.stdout.write(line)
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait(timeout=30)
            raise
    if code != 0:
        msg = (f"{cmd[0]} exited with code {code}.\ncommand: {quote(cmd)}\nlog: {log_path}\n"
               f"--- last lines of the log ---\n{tail(log_path)}")
        if hint:
            msg += f"\nhint: {hint}"
        raise ToolError(msg)
