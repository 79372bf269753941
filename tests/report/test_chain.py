"""The chain runner (`trtkv demo` / `compare`): order, stop at the first failure, and the server always stopped."""

from __future__ import annotations

import pytest

from trtkv.core.errors import StageError
from trtkv.report.chain import CHAIN, require_success, run_chain


def fake_runner(fail: str | None = None, code: int = 2):  # noqa: ANN201
    calls: list[str] = []

    def run(cmd: list[str]) -> int:
        verb = cmd[3]
        calls.append(verb)
        return code if verb == fail else 0

    return run, calls


def test_all_steps_then_stop() -> None:
    run, calls = fake_runner()
    result = run_chain("smollm2_fp8kv", ["bench.num_requests=2"], runner=run, log=lambda _: None)
    assert calls == [*CHAIN, "stop"]
    assert result.failed is None
    require_success(result)


@pytest.mark.parametrize("fail", ["bench", "repo", "serve"])
def test_failure_stops_the_chain_and_still_stops_the_server(fail: str) -> None:
    run, calls = fake_runner(fail)
    result = run_chain("smollm2_fp8kv", runner=run, log=lambda _: None)
    assert calls[-1] == "stop", "the server is stopped even when a step fails"
    assert calls[:-1] == list(CHAIN[: CHAIN.index(fail) + 1])
    assert result.failed == fail
    with pytest.raises(StageError, match=f"failed at `{fail}`"):
        require_success(result)


def test_breached_thresholds_still_write_the_report_then_fail() -> None:
    run, calls = fake_runner("bench", code=1)
    result = run_chain("smollm2_fp8kv", runner=run, log=lambda _: None)
    assert calls == [*CHAIN, "stop"]
    assert result.failed == "bench (thresholds breached)"


def test_a_backend_without_a_triton_repository_skips_repo() -> None:
    """vLLM serves the HF export itself: `trtkv repo` would refuse it, so `trtkv compare` of vLLM recipes skips it."""
    run, calls = fake_runner()
    said: list[str] = []
    result = run_chain("smollm2_fp8kv_vllm", runner=run, log=said.append)
    assert calls == [v for v in CHAIN if v != "repo"] + ["stop"] and result.failed is None
    assert any("repo smollm2_fp8kv_vllm: skipped" in s for s in said)
