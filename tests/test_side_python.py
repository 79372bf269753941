"""The fork server the side-venv tests share (tests/support/side_python.py) behaves as `subprocess.run` would."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import side_python

PY = sys.executable


def test_a_script_gets_its_argv_stdin_environment_and_exit_status(tmp_path) -> None:
    code = "import os, sys; print(sys.argv[1:], sys.stdin.read(), os.environ.get('X')); sys.exit(3)"
    done = side_python.run([PY, "-c", code, "a", "b"], input="in", env={"X": "1"}, preload=["json"])
    assert (done.returncode, done.stdout) == (3, "['a', 'b'] in 1\n")
    script = tmp_path / "s.py"
    script.write_text("import sys; print(__name__, sys.argv); raise ValueError('boom')")
    done = side_python.run([PY, str(script), "z"], preload=["json"])
    assert done.returncode == 1 and done.stdout == f"__main__ {[str(script), 'z']}\n" and "ValueError: boom" in done.stderr


def test_each_script_has_its_own_process_and_a_hung_one_is_killed() -> None:
    first = side_python.run([PY, "-c", "import os; print(os.getpid())"], preload=["json"])
    second = side_python.run([PY, "-c", "import os; print(os.getpid())"], preload=["json"])
    assert first.stdout != second.stdout
    with pytest.raises(subprocess.TimeoutExpired):
        side_python.run([PY, "-c", "import time; time.sleep(60)"], timeout=1, preload=["json"])
    assert side_python.run([PY, "-c", "print('after')"], preload=["json"]).stdout == "after\n"


def test_an_import_time_environment_gets_a_fresh_interpreter() -> None:
    done = side_python.run([PY, "-c", "import os; print(os.environ['TRITON_INTERPRET'])"],
                           env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin"}, preload=["json"])
    assert done.stdout == "1\n"


def test_code_runs_in_a_real_main_module() -> None:
    code = "import sys; x = 1; print(sys.modules['__main__'].x, __name__)"
    assert side_python.run([PY, "-c", code], preload=["json"]).stdout == "1 __main__\n"
