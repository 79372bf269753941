"""The KV pool a running engine reports is untrusted input (issue 48): each figure is checked for type and range where
it enters (trtkv.core.readback), the server log is read only as a file directly in the recipe's serve/ folder (never
through a symbolic link, bounded), and `trtkv bench` takes the pool only of the recorded server it measured, while that
server runs. A bad figure is one line naming its source in `trtkv status`, never a traceback or a nonsense figure."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trtkv.contracts.artifacts import ServerRecord
from trtkv.core import sessions
from trtkv.core.errors import TrtkvError
from trtkv.engines.reference import REFERENCE_POOL_LINE, reference_log_pool
from trtkv.engines.sglang import sglang_info_tokens
from trtkv.engines.trtllm import trtllm_log_pool
from trtkv.engines.vllm import vllm_log_tokens, vllm_metrics_blocks
from trtkv.plan import figures
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import serve_dir
from trtkv.serving import pool

GIB = 1024**3
TRTLLM_LINE = "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 16.05 GiB for max tokens in paged KV cache (263008)."


def _metrics(blocks: str, size: str = "16") -> str:
    return f'vllm:cache_config_info{{block_size="{size}",cache_dtype="fp8",num_gpu_blocks="{blocks}"}} 1.0\n'


BAD = [
    # (parser, input, source named in the error)
    (vllm_metrics_blocks, _metrics("-293"), "vLLM /metrics"),
    (vllm_metrics_blocks, _metrics("1e9"), "vLLM /metrics"),
    (vllm_metrics_blocks, _metrics("Infinity"), "vLLM /metrics"),
    (vllm_metrics_blocks, _metrics("9" * 30), "vLLM /metrics"),
    (vllm_metrics_blocks, _metrics("728", "0"), "vLLM /metrics"),
    (vllm_metrics_blocks, _metrics(str(1 << 39), "1024"), "vLLM /metrics"),
    (vllm_log_tokens, "INFO GPU KV cache size: ,,, tokens", "vLLM log"),
    (vllm_log_tokens, "INFO GPU KV cache size: " + "9" * 5000 + " tokens", "vLLM log"),
    (sglang_info_tokens, {"max_total_num_tokens": float("inf")}, "SGLang /get_server_info"),
    (sglang_info_tokens, {"max_total_num_tokens": float("nan")}, "SGLang /get_server_info"),
    (sglang_info_tokens, {"max_total_num_tokens": -263008}, "SGLang /get_server_info"),
    (sglang_info_tokens, {"max_total_num_tokens": 1.5}, "SGLang /get_server_info"),
    (sglang_info_tokens, {"max_total_num_tokens": True}, "SGLang /get_server_info"),
    (sglang_info_tokens, {"internal_states": [{"max_total_num_tokens": [1]}]}, "SGLang /get_server_info"),
    (trtllm_log_pool, TRTLLM_LINE.replace("16.05", "1.6.05"), "TensorRT-LLM log"),
    (trtllm_log_pool, TRTLLM_LINE.replace("16.05", "9" * 400), "TensorRT-LLM log"),
    (trtllm_log_pool, TRTLLM_LINE.replace("263008", "9" * 30), "TensorRT-LLM log"),
    (reference_log_pool, REFERENCE_POOL_LINE.format(bytes="9" * 40, batch=4, seq=8, per_token=1), "reference runtime"),
    (reference_log_pool, REFERENCE_POOL_LINE.format(bytes=10, batch=1 << 30, seq=1 << 30, per_token=1),
     "reference runtime"),
]


@pytest.mark.parametrize("parse, given, source", BAD, ids=[f"{p.__name__}-{i}" for i, (p, _, _) in enumerate(BAD)])
def test_a_bad_figure_is_refused_naming_its_source(parse: Any, given: Any, source: str) -> None:
    """Before: negative figures passed (status printed "served -4709.50 GiB"), Infinity raised OverflowError, a
    malformed number ValueError, a 400-digit GiB became inf, 30-digit counts passed."""
    with pytest.raises(TrtkvError) as err:
        parse(given)
    line = str(err.value)
    assert line.startswith(source) and "\n" not in line and "not used" in line, line


def test_good_figures_still_read() -> None:
    assert vllm_metrics_blocks(_metrics("728", "128")) == (728, 128)
    assert vllm_log_tokens("GPU KV cache size: 476,016 tokens") == 476016
    assert sglang_info_tokens({"max_total_num_tokens": 392920}) == 392920
    assert trtllm_log_pool(TRTLLM_LINE) == (16.05 * GIB, 263008)


class _Answer(http.server.BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def sglang_server() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("body", [b'{"max_total_num_tokens": Infinity}', b'{"max_total_num_tokens": -49000000}',
                                  b'{"max_total_num_tokens": NaN}', b"[" * 100000, b'"text"'])
def test_status_says_which_source_was_bad(sglang_server: http.server.HTTPServer, body: bytes) -> None:
    """What `trtkv status` prints for a running SGLang answering a bad /get_server_info. Before: Infinity crashed
    status (OverflowError), -49000000 tokens printed "served -4709.50 GiB"-style figures, deep nesting recursed."""
    _Answer.body = body
    recipe = load_recipe("llama70b_fp8kv_sglang")
    server = SimpleNamespace(client_host="127.0.0.1", http_port=sglang_server.server_address[1], log="")
    got = pool.compare(recipe, server, figures(recipe))  # type: ignore[arg-type]
    line = pool.describe(got)
    assert got["served_bytes_per_gpu"] is None and "served: not read: SGLang /get_server_info" in line, line
    assert "\n" not in line and "-" not in line.split("served:")[1].split("SGLang")[0]
    json.dumps(got, allow_nan=False)  # status --json stays JSON


def _live(folder: Path, **fields: Any) -> ServerRecord:
    """A record trtkv would prove: this test's own child process, with its start time."""
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    _LIVE.append(proc)
    return ServerRecord(pid=proc.pid, host="127.0.0.1", http_port=18000, grpc_port=18001, metrics_port=18002,
                        command=["sleep", "120"], log=str(folder / "server.log"), model_repository="x",
                        started_at="now", session_id=proc.pid, session_start=sessions.start_time(proc.pid),
                        **fields)


_LIVE: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _end_children() -> Iterator[None]:
    yield
    while _LIVE:
        proc = _LIVE.pop()
        proc.kill()
        proc.wait()


def test_the_log_is_read_only_inside_serve_and_never_through_a_link(engines_tmp: Path, tmp_path: Path) -> None:
    """Before: the read-back opened whatever path server.json named (outside serve/, through a symlink)."""
    recipe = load_recipe("llama70b_fp8kv_llmapi")
    folder = serve_dir(recipe)
    folder.mkdir(parents=True)
    outside = tmp_path / "elsewhere.log"
    outside.write_text(TRTLLM_LINE + "\n")
    record = _live(folder)
    good = pool.compare(recipe, record.model_copy(update={"log": str(folder / "server.log")}), figures(recipe))
    assert good["served_bytes_per_gpu"] is None  # no log yet: nothing read, nothing refused
    (folder / "server.log").write_text("x" * (5 << 20) + "\n" + TRTLLM_LINE + "\n")  # bounded: the tail is read
    assert pool.compare(recipe, record, figures(recipe))["served_tokens"] == 263008
    for name in (str(outside), str(folder / ".." / "serve" / ".." / "elsewhere.log")):
        got = pool.compare(recipe, record.model_copy(update={"log": name}), figures(recipe))
        assert got["served_bytes_per_gpu"] is None and "is not a file directly in" in got["source"], got
    (folder / "link.log").symlink_to(outside)
    got = pool.compare(recipe, record.model_copy(update={"log": str(folder / "link.log")}), figures(recipe))
    assert got["served_bytes_per_gpu"] is None and "symbolic link" in got["source"], got
    os.mkfifo(folder / "fifo.log")  # never opened blocking
    got = pool.compare(recipe, record.model_copy(update={"log": str(folder / "fifo.log")}), figures(recipe))
    assert got["served_bytes_per_gpu"] is None and "not a regular file" in got["source"], got


@pytest.mark.parametrize("url, read", [
    (None, True), ("127.0.0.1:18000", True), ("http://127.0.0.1:18000/", True), ("127.0.0.1:18001", True),
    ("127.0.0.1:180000", False), ("127.0.0.1:8000", False), ("10.0.0.18:18000", False),
    ("http://127.0.0.1:18000@10.0.0.5:9000", False), ("127.0.0.1:18000x", False), ("[::1]:18000", False),
])
def test_bench_reads_the_pool_of_the_recorded_server_it_measured(engines_tmp: Path, url: str | None,
                                                                 read: bool) -> None:
    """Before: any --url holding the recorded port's digits (`:180000`, `@...:18000`) took the recorded pool."""
    recipe = load_recipe("llama70b_fp8kv_llmapi")
    folder = serve_dir(recipe)
    folder.mkdir(parents=True)
    (folder / "server.log").write_text(TRTLLM_LINE + "\n")
    _live(folder).save(folder)
    got = pool.compare_at(recipe, url, figures(recipe))
    assert (got["served_tokens"] == 263008) is read, got
    if not read:
        assert "is not the recorded server" in got["source"], got


def test_bench_ignores_the_pool_of_a_dead_server(engines_tmp: Path) -> None:
    """Before: a recorded server that had exited (its pid gone or reused) still gave results.json its pool."""
    recipe = load_recipe("llama70b_fp8kv_llmapi")
    folder = serve_dir(recipe)
    folder.mkdir(parents=True)
    (folder / "server.log").write_text(TRTLLM_LINE + "\n")
    record = _live(folder)
    _LIVE[-1].kill()
    _LIVE[-1].wait()
    record.save(folder)
    got = pool.compare_at(recipe, "127.0.0.1:18000", figures(recipe))
    assert got["served_bytes_per_gpu"] is None and f"(pid {record.pid}) is not running" in got["source"], got
