"""Errors meant for users: each names what is wrong and what to do next."""

from __future__ import annotations


class TrtkvError(Exception):
    """Base of every error the CLI prints without a traceback (exit code 2)."""

    exit_code = 2

    @staticmethod
    def listing(problems: list[str]) -> str:
        """`N problem(s):` and a `  - ` line each: how each error collecting problems lists them."""
        body = "\n".join(f"  - {p}" for p in problems)
        return f"{len(problems)} problem(s):\n{body}"


class RecipeError(TrtkvError):
    """A recipe that cannot be read or does not validate; carries every problem found."""

    def __init__(self, problems: list[str], header: str = "Recipe is not valid") -> None:
        self.problems = list(problems)
        super().__init__(f"{header}, found {self.listing(self.problems)}")


class StageError(TrtkvError):
    """A pipeline stage that could not run or failed; the message says why and what next."""


class ToolError(StageError):
    """An external tool (trtllm-build, tritonserver, ...) exited non-zero."""


# errno -> what it means and the next step, for the one line an OS fault becomes (trtkv.cli.main)
_OS_NEXT = {
    "EROFS": (
        "the file system is read-only",
        "write elsewhere (--output, TRTKV_HOME, TRTKV_ENGINES or "
        "TRTKV_TRITON_REPO), or remount it read-write",
    ),
    "ENOSPC": (
        "no space left on the device",
        "free space there (`df -h` on that folder), or write elsewhere (--output, TRTKV_ENGINES)",
    ),
    "EDQUOT": (
        "the disk quota is exhausted",
        "free space in your quota, or write elsewhere (--output, TRTKV_ENGINES)",
    ),
    "ENAMETOOLONG": (
        "a name is longer than the file system allows (255 bytes per name)",
        "use a shorter --output or recipe name",
    ),
    "EACCES": (
        "permission denied",
        "check the owner and mode (`ls -ld` on that folder), or write elsewhere",
    ),
    "EPERM": (
        "operation not permitted",
        "check the owner and mode (`ls -ld` on that folder), or write elsewhere",
    ),
    "ENOENT": ("no such file or folder", "check the path (a folder removed while trtkv ran?)"),
    "EMFILE": ("too many open files", "raise the limit (`ulimit -n`)"),
    "EIO": ("an input/output error of the device", "check the disk (`dmesg`)"),
}


def os_error_line(exc: OSError) -> str:
    """One line for an OS fault: the path, what the error means, and the next step."""
    import errno as _errno

    name = _errno.errorcode.get(exc.errno or 0, "")
    meaning, step = _OS_NEXT.get(name, (exc.strerror or str(exc), "check the path and the disk"))
    where = (
        " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
        or "a file operation"
    )
    return f"{where}: {meaning} ({name or type(exc).__name__}). Next: {step}."
