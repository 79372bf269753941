"""When a started server is ready: each frontend's readiness endpoint (tritonserver's, or /health of
the OpenAI servers), waiting for it while the process lives (trtkv.serving.serve), and the error
that shows the server log's error lines and tail when it dies or times out.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from trtkv.contracts.artifacts import ServerRecord
from trtkv.core.errors import ToolError
from trtkv.core.process import wait_http_ready
from trtkv.core.tools import quote, tail

HARMLESS = ("CUDA", "Cuda", "cuda", "NVML", "GPU")


def log_errors(path: Path, limit: int = 10) -> str:
    """The server log's error lines (E...), leaving out the CUDA/NVML noise of a CPU-only
    machine."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [
        ln
        for ln in lines
        if (ln.startswith("E") and ln[1:5].isdigit() or ln.startswith("error:"))
        and not any(word in ln for word in HARMLESS)
    ]
    return "\n".join(errors[-limit:])


def _failure(headline: str, info: ServerRecord) -> ToolError:
    errors = log_errors(Path(info.log))
    text = f"{headline}\ncommand: {quote(info.command)}\nlog: {info.log}\n"
    if errors:
        text += f"--- errors in the log ---\n{errors}\n"
    return ToolError(text + f"--- last lines of the log ---\n{tail(Path(info.log), 15)}")


# the frontend vLLM's records carry (trtkv.backends' OpenAIServer.name; tests start a stand-in)
VLLM = "vllm"
READY_PATHS = {"tritonserver": "/v2/health/ready"}
# every OpenAI-compatible server trtkv runs (vLLM, trtllm-serve) answers here
OPENAI_READY_PATH = "/health"


def ready_path(name: str) -> str:
    """The readiness endpoint of a frontend."""
    return READY_PATHS.get(name, OPENAI_READY_PATH)


def frontend(info: ServerRecord) -> str:
    """Which server the record is about: tritonserver, or trtllm-serve (OpenAI-compatible,
    `--trtllm-serve`)."""
    return info.frontend


def wait_ready(info: ServerRecord, proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    """Seconds until the readiness endpoint answers 200; ToolError with the log tail when the server
    dies or times out."""
    name = frontend(info)
    seconds = wait_http_ready(
        f"{info.http_url}{ready_path(name)}", lambda: proc.poll() is None, timeout_s
    )
    if seconds is not None:
        return seconds
    code = proc.poll()
    if code is not None:
        raise _failure(f"{name} exited with code {code} while starting.", info)
    raise _failure(
        f"{name} was not ready after {timeout_s:.0f} s (recipe triton.startup_timeout_s).", info
    )
