"""Numbers and logs trtkv reads back from servers and tools (a served engine's KV pool from vLLM's
/metrics, SGLang's /get_server_info, TensorRT-LLM's and the reference runtime's log lines;
aiconfigurator's estimates): the one place where each such value is checked for type and range as
it enters, and where a server's log is read, bounded. A bad value is a ReadBackError: one line
naming its source, the field and what was wrong, never a traceback and never a figure trtkv prints.
"""

from __future__ import annotations

import math
import os
import re
import selectors
import stat
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtkv.core.errors import TrtkvError

# A served KV pool on one GPU: at most 2**40 tokens and 2**50 bytes (1 PiB) — far above any GPU's
# or host's memory, so only a damaged or hostile answer is refused.
MAX_POOL_TOKENS = 1 << 40
MAX_POOL_BYTES = 1 << 50
MAX_LOG_BYTES = 4 << 20  # the tail of a server log read back (its startup lines and the pool's)
_WHOLE = re.compile(r"\d{1,20}|\d{1,3}(?:,\d{3}){1,6}")
_REAL = re.compile(r"\d{1,15}(?:\.\d{1,8})?")


class ReadBackError(TrtkvError):
    """A value a server, a tool or a log reported that trtkv refuses: names its source."""

    def __init__(self, source: str, problem: str) -> None:
        self.source, self.problem = source, problem
        super().__init__(f"{source}: {problem}; the value is not used")


def whole(value: Any, source: str, name: str, high: int, low: int = 0) -> int:
    """`value` as an integer within low..high (a JSON integer or decimal digits); ReadBackError
    naming `source` and `name` otherwise."""
    if isinstance(value, str) and _WHOLE.fullmatch(value):
        value = int(value.replace(",", ""))
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReadBackError(source, f"{name} {_shown(value)} is not a whole number")
    if not low <= value <= high:
        raise ReadBackError(source, f"{name} {_shown(value)} is outside {low:,}..{high:,}")
    return value


def real(value: Any, source: str, name: str, high: float, low: float = 0.0) -> float:
    """`value` as a finite float within low..high (a JSON number or plain decimal text);
    ReadBackError naming `source` and `name` otherwise."""
    if isinstance(value, str) and _REAL.fullmatch(value):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReadBackError(source, f"{name} {_shown(value)} is not a number")
    if isinstance(value, int) and abs(value) > 1 << 64:
        raise ReadBackError(source, f"{name} {_shown(value)} is outside {low:g}..{high:g}")
    number = float(value)
    if not math.isfinite(number):
        raise ReadBackError(source, f"{name} {_shown(value)} is not a finite number")
    if not low <= number <= high:
        raise ReadBackError(source, f"{name} {_shown(value)} is outside {low:g}..{high:g}")
    return number


def log_tail(path: Path, source: str, max_bytes: int = MAX_LOG_BYTES) -> str:
    """The last `max_bytes` of the server log `path` as text ('' when there is none); a symbolic
    link, a FIFO, a device or a folder is a ReadBackError naming `source` (nothing is read from
    it)."""
    flags = (
        os.O_RDONLY
        | os.O_NONBLOCK
        | os.O_NOCTTY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        if path.is_symlink():
            raise ReadBackError(source, f"{path} is a symbolic link (not followed)") from None
        raise ReadBackError(source, f"{path}: cannot open ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise ReadBackError(source, f"{path} is not a regular file")
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - max_bytes))
        return fh.read(max_bytes).decode(errors="replace")


def tool_answer(
    argv: Sequence[str], stdin: bytes, max_bytes: int, timeout_s: float, env: dict[str, str]
) -> tuple[int, bytes, str]:
    """Run `argv` with `stdin`: (exit status, stdout, the last 800 characters of stderr). stdout is
    read as it comes, at most `max_bytes` + 1 bytes (stderr: its last 4 KiB kept): more, or no exit
    within `timeout_s`, kills the tool and raises ReadBackError naming it."""
    source = " ".join(Path(a).name for a in argv)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
    except OSError as exc:
        raise ReadBackError(source, f"cannot start ({exc.strerror})") from None
    deadline = time.monotonic() + timeout_s
    try:
        out, err = _bounded_output(proc, stdin, max_bytes, (deadline, timeout_s), source)
        code = proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise ReadBackError(source, f"took longer than {timeout_s:.0f} s (ended)") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return code, out, err.decode(errors="replace")[-800:]


def _bounded_output(
    proc: subprocess.Popen[bytes],
    stdin: bytes,
    max_bytes: int,
    until: tuple[float, float],
    source: str,
) -> tuple[bytes, bytes]:
    """(stdout, stderr's tail) until both end: stdout at most max_bytes (ReadBackError past it or
    past the deadline); `stdin` is written by a helper thread so a tool that answers before
    reading cannot block."""
    if proc.stdin is None or proc.stdout is None or proc.stderr is None:  # Popen(PIPE) sets them
        raise ReadBackError(source, "started without its pipes")

    def feed(pipe: Any = proc.stdin) -> None:
        try:
            pipe.write(stdin)
            pipe.close()
        except OSError:  # the tool exited or closed its input: its answer says why
            pass

    threading.Thread(target=feed, daemon=True).start()
    out, err = bytearray(), bytearray()
    deadline, timeout_s = until
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, out)
        sel.register(proc.stderr.fileno(), selectors.EVENT_READ, err)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReadBackError(source, f"took longer than {timeout_s:.0f} s (stopped)")
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                key.data.extend(chunk)
                if len(out) > max_bytes:
                    raise ReadBackError(
                        source, f"answer larger than {max_bytes:,} bytes (stopped reading, ended)"
                    )
                del err[:-4096]
    return bytes(out), bytes(err)


def _shown(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 128:
        return f"(an integer of {value.bit_length()} bits)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
