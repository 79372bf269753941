"""The measured phases of `trtkv bench`, in the order trtkv.bench.runner runs them: the latency
levels (a concurrency sweep or one request rate), the input-length sweep (`--sweep-input`) and the
accuracy tasks (prepared, then run at bench.accuracy_concurrency), each phase shown as progress
bars."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trtkv.bench.load.levels import ClientRun, LevelSpec, Sweep
from trtkv.bench.load.loadgen import Interrupted, Job, run_concurrency
from trtkv.bench.load.prompts import latency_prompts, long_text, prompt_tokens
from trtkv.bench.tasks import accuracy as acc_tasks
from trtkv.bench.tasks import ruler
from trtkv.bench.transport.client import Endpoint, SamplingParams
from trtkv.bench.transport.endpoints import session_factory
from trtkv.contracts.bench_doc import RequestRecord
from trtkv.core import paths
from trtkv.core.errors import TrtkvError
from trtkv.core.progress import Progress
from trtkv.recipe import Recipe

# --------------------------------------------------------------------------------------------------
# Progress


class BenchProgress(Progress):
    """The bench's phases as progress bars (trtkv.core.progress); `phase` returns a per-request
    callback."""

    def phase(self, name: str, total: int) -> Callable[[RequestRecord], None]:
        return self.task(name, total).callback()


# --------------------------------------------------------------------------------------------------
# Phases


def _latency_jobs(
    prompts: Sequence[str],
    isl: Sequence[int],
    phase: str,
    level: str,
    start: int,
    count: int,
    max_tokens: int,
) -> list[Job]:
    jobs = []
    for k in range(count):
        i = (start + k) % len(prompts)
        rec = RequestRecord(f"{level}-{phase}-{start + k}", phase, level, i, isl[i], max_tokens)
        jobs.append(Job(rec, prompts[i], SamplingParams(max_tokens=max_tokens)))
    return jobs


def _levels(recipe: Recipe) -> list[tuple[str, float, str]]:
    """(label, value, mode) per level: a concurrency sweep, or one request rate."""
    if recipe.bench.request_rate:
        return [(f"rate={recipe.bench.request_rate:g}/s", recipe.bench.request_rate, "rate")]
    return [(f"concurrency={c}", float(c), "concurrency") for c in recipe.bench.concurrency]


def run_latency(
    recipe: Recipe,
    ep: Endpoint,
    tokenizer: Any,
    progress: BenchProgress,
    records: list[RequestRecord],
    by_level: dict[str, list[RequestRecord]],
    clients: dict[str, ClientRun],
    workers: int | None,
    prefix: dict[str, Any] | None = None,
) -> None:
    """Warm-up then measured requests at each level, each level's sessions kept from its warm-up
    into its measured phase (trtkv.bench.load.levels: in this process or on worker processes);
    `records`, `by_level` and `clients` fill as levels finish (or stop). With bench.prefix's
    workload the measured requests are its sessions instead (run_prefix_levels), `prefix` filling
    with each level's hit rates."""
    b = recipe.bench
    if b.prefix.enabled and prefix is not None and not b.request_rate:
        from trtkv.bench.load.prefix_levels import run_prefix_levels

        run_prefix_levels(recipe, ep, tokenizer, progress.phase, records, by_level, prefix)
        return
    prompts = latency_prompts(tokenizer, b.num_requests, b.input_tokens)
    isl = [prompt_tokens(tokenizer, p) for p in prompts]

    def make_jobs(label: str, phase: str, start: int, count: int) -> list[Job]:
        tokens = b.output_tokens
        if phase == "warmup" and b.warmup_output_tokens:
            tokens = b.warmup_output_tokens
        return _latency_jobs(prompts, isl, phase, label, start, count, tokens)

    sweep = Sweep(ep, make_jobs, workers, progress.phase, records, by_level, progress.log)
    try:
        for label, value, mode in _levels(recipe):
            conc = int(value) if mode == "concurrency" else max(1, round(value))
            warm = max(b.warmup_requests, conc) if b.warmup_requests else 0
            sweep.run(LevelSpec(label, mode, value, warm, b.num_requests, b.request_timeout_s))
    finally:
        clients.update(sweep.clients)


def run_sweep(
    recipe: Recipe,
    ep: Endpoint,
    tokenizer: Any,
    progress: BenchProgress,
    records: list[RequestRecord],
    lengths: Sequence[int],
    by_length: dict[int, dict[str, list[RequestRecord]]],
    clients: dict[int, dict[str, ClientRun]],
    workers: int | None,
) -> None:
    """The latency levels once per input length (`--sweep-input`), each length's levels on
    run_latency's Sweep (sessions kept from warm-up to measured phase, worker processes as --workers
    decides); `by_length` and `clients` fill as lengths finish (or stop)."""
    for n in lengths:
        at_n = recipe.model_copy(
            update={"bench": recipe.bench.model_copy(update={"input_tokens": n})}
        )
        by_length[n], clients[n] = {}, {}
        mark = len(records)
        try:
            run_latency(at_n, ep, tokenizer, progress, records, by_length[n], clients[n], workers)
        finally:
            # one label per length, so requests.csv and the AIPerf exports stay apart
            for rec in records[mark:]:
                rec.level = f"input={n} {rec.level}"
                rec.request_id = f"input{n}-{rec.request_id}"


def build_tasks(
    recipe: Recipe,
    tokenizer: Any,
    names: Sequence[str],
    golden_prompts: int,
    log: Callable[[str], None],
) -> tuple[list[acc_tasks.Task], dict[str, dict[str, Any]]]:
    """The accuracy tasks asked for; one that cannot be prepared is reported (not run), never
    silently skipped."""
    from trtkv.core.texts import quiz_items

    tasks: list[acc_tasks.Task] = []
    failed: dict[str, dict[str, Any]] = {}
    b = recipe.bench
    for name in names:
        try:
            if name == "quiz":
                tasks.append(acc_tasks.quiz_task(tokenizer, quiz_items(), b.quiz_items))
            elif name == "golden":
                from trtkv.checkpoints.models import resolve_model_dir

                prompts = latency_prompts(tokenizer, golden_prompts, b.input_tokens)
                path = paths.recipe_output_dir(recipe.name) / "golden.json"
                tasks.append(
                    acc_tasks.golden_task(
                        tokenizer,
                        prompts,
                        b.output_tokens,
                        path,
                        resolve_model_dir(recipe),
                        log=log,
                    )
                )
            elif name == "needle":
                tasks.append(
                    acc_tasks.needle_task(
                        tokenizer,
                        long_text(),
                        b.needle_context_lengths,
                        recipe.probe.needle_depths,
                        recipe.build.max_seq_len,
                    )
                )
            elif name == "ruler":
                tasks.append(
                    ruler.ruler_task(
                        tokenizer,
                        b.ruler_lengths,
                        b.ruler_samples,
                        recipe.build.max_input_len,
                        recipe.build.max_seq_len,
                    )
                )
        except TrtkvError as exc:
            failed[name] = {"error": str(exc)}
    return tasks, failed


def run_accuracy(
    recipe: Recipe,
    ep: Endpoint,
    tasks: list[acc_tasks.Task],
    progress: BenchProgress,
    records: list[RequestRecord],
) -> dict[str, list[RequestRecord]]:
    factory = session_factory(ep)
    # not the sweep's: batched answers differ on most engines
    conc = recipe.bench.accuracy_concurrency
    out: dict[str, list[RequestRecord]] = {}
    for task in tasks:
        done = progress.phase(f"accuracy {task.name}", len(task.jobs))
        try:
            recs = run_concurrency(factory, task.jobs, conc, recipe.bench.request_timeout_s, done)
        except Interrupted as stop:
            records.extend(stop.records)
            raise
        records.extend(recs)
        out[task.name] = recs
    return out
