"""Runs inside a side venv (vLLM's, SGLang's): imports the modules named on its command line once, then forks a fresh
child for every script the tests send, so each script keeps its own process (argv, stdin, environment, exit status)
without paying the engine's import again. Standard library only; started by tests/support/side_python.py.

Protocol: one JSON request per line on stdin ({"argv", "stdin", "stdout", "stderr", "env", "cwd"}: file paths for the
three streams); the server answers {"pid": child} when it forks and {"rc": exit status} when the child ends."""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback
import types


def _child(request: dict, replies: int) -> None:
    os.close(replies)
    stdin = os.open(request["stdin"] or os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the child's own streams until it exits
    sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    if request["env"] is not None:
        os.environ.clear()
        os.environ.update(request["env"])
    if request["cwd"]:
        os.chdir(request["cwd"])
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-c":  # as `python -c CODE ARGS...`
            sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
            main = types.ModuleType("__main__")  # a real __main__, as `python -c` has (pydantic resolves names there)
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:  # as `python SCRIPT ARGS...`
            sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - reported as python would, with its exit status
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    for name in sys.argv[1:]:
        importlib.import_module(name)
    replies = os.dup(1)
    os.dup2(2, 1)  # stray prints of the server itself never reach the reply channel
    out = os.fdopen(replies, "w", buffering=1)
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, replies)
        out.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
