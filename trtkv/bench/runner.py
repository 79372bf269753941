"""`trtkv bench` end to end: endpoint, workload, the measured phases (trtkv.bench.phases), SLOs,
result files."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtkv.backends import for_recipe
from trtkv.bench.load.levels import ClientRun, client_summary
from trtkv.bench.load.loadgen import Interrupted
from trtkv.bench.load.prompts import count_tokens, load_tokenizer, tokenizer_dir
from trtkv.bench.options import BenchOptions
from trtkv.bench.outputs import aiperf_export, results, results_files, slo
from trtkv.bench.phases import BenchProgress, build_tasks, run_accuracy, run_latency, run_sweep
from trtkv.bench.tasks import accuracy as acc_tasks
from trtkv.bench.transport.client import Endpoint
from trtkv.bench.transport.endpoints import check_endpoint
from trtkv.contracts import (
    BenchEndpoint,
    BenchLevel,
    BenchResults,
    BenchSLOs,
    BenchSweep,
    BenchWorkload,
    ClientSummary,
    KVPoolCheck,
    MetricStats,
    RequestRecord,
    ServerRecord,
    SLOVerdict,
    TaskScore,
    TimeOrigin,
    now_ns,
)
from trtkv.contracts.prefix import PrefixPrediction, with_prediction
from trtkv.core.errors import StageError, TrtkvError
from trtkv.measures import plots
from trtkv.measures.metrics import summarize_level
from trtkv.recipe import Protocol, Recipe
from trtkv.recipe.layout import bench_dir, serve_dir

SCHEMA = "trtkv.bench/1"  # results.json's "schema"
EXIT_SLO_FAILED = 1
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class ServedSide:
    """What the serving stage lends a benchmark of its server, handed in by `trtkv bench`
    (trtkv.cli.bench.served_side; the bench stage never imports trtkv.serving): `quiet(recipe, who,
    address)` asks the recipe's supervisor for no canaries while the block runs (yields whether it
    asked), `kv_pool(recipe, url)` reads the served KV pool back beside the planned one
    (results.json's "kv_pool"), `prefix_plan(recipe)` the plan's predicted prefix-cache hit rates
    (trtkv.contracts.PlanFigures.prefix: results.json's "prefix" levels carry them beside the
    server's)."""

    quiet: Callable[[Recipe, str, str | None], AbstractContextManager[bool]]
    kv_pool: Callable[[Recipe, str | None], dict[str, Any]]
    prefix_plan: Callable[[Recipe], PrefixPrediction | None] = lambda _recipe: None


def _unread_pool(_recipe: Recipe, _url: str | None) -> dict[str, Any]:
    return {"planned_bytes_per_gpu": None, "source": "not read: no server side", "warning": None}


# a library caller that hands in nothing: no quiet request, no pool read back
UNSERVED = ServedSide(
    quiet=lambda _recipe, _who, _address: nullcontext(False), kv_pool=_unread_pool
)


@dataclass
class BenchOutcome:
    exit_code: int
    output: Path
    results: dict[str, Any]


# --------------------------------------------------------------------------------------------------
# Endpoint


def resolve_endpoint(
    recipe: Recipe, url: str | None, protocol: Protocol | None, model: str
) -> Endpoint:
    """--url, else engines/<recipe>/serve/server.json, else the recipe's triton host and port."""
    proto = protocol or recipe.bench.protocol
    if url:
        text = url.split("://", 1)[-1].rstrip("/")
        if ":" not in text:
            raise TrtkvError(
                f"--url {url!r}: expected HOST:PORT, e.g. 127.0.0.1:8001 (gRPC) or :8000 (HTTP)."
            )
        return Endpoint(text, proto, model, source="--url")
    folder = serve_dir(recipe)
    try:
        info = ServerRecord.load(folder)
    except StageError as exc:
        raise TrtkvError(f"{exc} Or pass --url HOST:PORT.") from exc
    if info is not None:
        port = info.grpc_port if proto is Protocol.GRPC else info.http_port
        return Endpoint(
            f"{info.client_host}:{port}", proto, model, source=str(ServerRecord.path(folder))
        )
    port = recipe.triton.grpc_port if proto is Protocol.GRPC else recipe.triton.http_port
    return Endpoint(f"{recipe.triton.host}:{port}", proto, model, source="recipe triton.host/port")


# --------------------------------------------------------------------------------------------------
# Run


def count_response_tokens(tokenizer: Any, records: Sequence[RequestRecord]) -> dict[str, int]:
    """Fill each record's per-response token counts; compare their sum with the whole text's
    count."""
    equal, diffs = 0, []
    for rec in records:
        rec.response_tokens = [count_tokens(tokenizer, t) for t in rec.response_texts]
        if rec.ok:
            diff = rec.output_tokens() - count_tokens(tokenizer, rec.text)
            diffs.append(abs(diff))
            equal += diff == 0
    return {"requests": len(diffs), "equal": equal, "max_abs_diff": max(diffs, default=0)}


def _normalize(records: Sequence[RequestRecord], t0: int) -> None:
    for rec in records:
        if rec.send_ns > 0:
            rec.send_ns -= t0
        rec.response_ns = [t - t0 for t in rec.response_ns]
        if rec.end_ns is not None:
            rec.end_ns -= t0


def run_bench(recipe: Recipe, opts: BenchOptions, served: ServedSide = UNSERVED) -> BenchOutcome:
    """The whole benchmark; results are written even when an SLO fails, and when interrupted into
    `partial_dir(output)`, never over the last complete run's."""
    from trtkv.contracts.outputs import check_output
    from trtkv.contracts.stage import run_stage, tool_versions

    output = opts.output or bench_dir(recipe)
    # before measuring: a folder it may not replace is refused at once (also where an interrupted
    # run's partial results go)
    check_output(output, "bench", recipe.name)
    check_output(partial_dir(output), "bench", recipe.name, "partial results folder")
    slos = slo.parse_all(recipe.bench.thresholds, opts.slos, opts.allow_failures)
    goodput = aiperf_export.parse_goodput(opts.goodput)
    openai = (opts.protocol or recipe.bench.protocol) is Protocol.OPENAI
    # the model: --model; for OpenAI the one the server lists; for Triton the recipe's layout's
    # (ensemble/tensorrt_llm)
    repo = for_recipe(recipe).repo  # None: no Triton repository (the backend's own OpenAI server)
    model = opts.model or ("" if openai or repo is None else repo.interface.model)
    endpoint = resolve_endpoint(recipe, opts.url, opts.protocol, model)
    endpoint.endpoint_type = opts.endpoint_type
    ep = check_endpoint(endpoint)
    tokenizer = load_tokenizer(tokenizer_dir(recipe))
    task_names = [t.value for t in (recipe.bench.tasks if opts.tasks is None else opts.tasks)]
    slos = slo.with_fidelity(slos, task_names)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    wall0, t0, origin_unix_ns = time.time(), now_ns(), time.time_ns()
    records: list[RequestRecord] = []
    by_level: dict[str, list[RequestRecord]] = {}
    clients: dict[str, ClientRun] = {}
    by_length: dict[int, dict[str, list[RequestRecord]]] = {}
    length_clients: dict[int, dict[str, ClientRun]] = {}
    task_records: dict[str, list[RequestRecord]] = {}
    prefix: dict[str, Any] = {}  # bench.prefix: per level its hit rates (PrefixLevel)
    interrupted: str | None = None
    tasks: list[acc_tasks.Task] = []
    task_errors: dict[str, dict[str, Any]] = {}
    with (
        BenchProgress(opts.progress) as progress,
        served.quiet(recipe, "trtkv bench", opts.url) as asked,
    ):
        if asked:
            progress.log(
                "bench: the supervisor sends no canaries while this runs (it checks alive and "
                "ready only)"
            )
        try:
            interrupted = "preparation of the accuracy tasks"
            tasks, task_errors = build_tasks(
                recipe, tokenizer, task_names, opts.golden_prompts, progress.log
            )
            lengths = list(
                recipe.bench.sweep_input_tokens if opts.sweep_input is None else opts.sweep_input
            )
            if opts.latency and lengths:
                interrupted = "input sweep"
                run_sweep(
                    recipe,
                    ep,
                    tokenizer,
                    progress,
                    records,
                    lengths,
                    by_length,
                    length_clients,
                    opts.workers,
                )
            if opts.latency and recipe.bench.input_tokens not in by_length:
                interrupted = "latency sweep"
                run_latency(
                    recipe,
                    ep,
                    tokenizer,
                    progress,
                    records,
                    by_level,
                    clients,
                    opts.workers,
                    prefix,
                )
            # the recipe's own length was one of the sweep's: its levels are the main ones
            elif opts.latency:
                by_level.update(by_length[recipe.bench.input_tokens])
                clients.update(length_clients[recipe.bench.input_tokens])
            interrupted = "accuracy tasks"
            task_records = run_accuracy(recipe, ep, tasks, progress, records)
            if "fidelity" in task_names:
                interrupted = "fidelity task"
                from trtkv.bench.tasks.fidelity import (
                    fidelity_entry,  # loaded only when the task runs
                )

                task_errors["fidelity"] = fidelity_entry(recipe, ep, tokenizer, progress.log)
            interrupted = None
        except (Interrupted, KeyboardInterrupt):
            progress.log(f"interrupted (Ctrl-C) during the {interrupted}: writing partial results")
    check = count_response_tokens(tokenizer, records)
    _normalize(records, t0)
    doc = assemble(
        recipe,
        ep,
        opts,
        records,
        by_level,
        tasks,
        task_records,
        task_errors,
        slos,
        check,
        interrupted,
        started,
        time.time() - wall0,
    )
    doc.time_origin = TimeOrigin(
        unix_ns=origin_unix_ns,
        note="record times are ms after this wall-clock instant (to line "
        "them up with a server's logs and metrics)",
    )
    for label, run in clients.items():
        if label in doc.levels:
            doc.levels[label].client = ClientSummary(**client_summary(run, by_level[label]))
    if by_length:
        from trtkv.measures import sweep

        clients_by_length = {
            n: {
                label: client_summary(run, by_length[n][label])
                for label, run in runs.items()
                if label in by_length[n]
            }
            for n, runs in length_clients.items()
        }
        doc.sweep = BenchSweep.model_validate(sweep.summarize(by_length, clients_by_length))
    if goodput:
        doc.goodput_slos = goodput
        for label, recs in by_level.items():
            good = aiperf_export.level_export(recs, goodput)
            doc.levels[label].goodput = MetricStats(
                **good["goodput"], good_request_count=good["good_request_count"]["avg"]
            )
    if prefix:
        doc.prefix = with_prediction(prefix, _prefix_plan(served, recipe))
    doc.tool_versions = tool_versions()
    doc.kv_pool = KVPoolCheck.model_validate(_served_pool(served, recipe, opts.url))
    if doc.kv_pool.warning:
        # assigned, never appended in place: results.json writes only the fields set (exclude_unset)
        doc.warnings = [*doc.warnings, doc.kv_pool.warning]
    # results.json as written (trtkv.contracts.bench_doc.BenchResults; report loads it back)
    out = doc.document()
    passed = doc.slo is not None and doc.slo.passed

    def work(tmp: Path) -> dict[str, Any]:
        write_all(tmp, doc, by_level)
        return {"partial": out["partial"], "slo_passed": passed, "endpoint": out["endpoint"]}

    # only a complete run replaces the results: an interrupted one's go beside them
    written = partial_dir(output) if interrupted else output
    run_stage(
        "bench",
        recipe,
        written,
        work,
        force=True,
        extra_key={"endpoint": ep.display},
        log=lambda s: None,
    )
    results.console_summary(doc, written)
    code = EXIT_INTERRUPTED if interrupted else (0 if passed else EXIT_SLO_FAILED)
    return BenchOutcome(code, written, out)


def partial_dir(output: Path) -> Path:
    """Where an interrupted run writes its partial results (`<output>.partial`, beside the output):
    the last complete run's folder is replaced only by a complete run."""
    return output.with_name(output.name + ".partial")


def _served_pool(served: ServedSide, recipe: Recipe, url: str | None) -> dict[str, Any]:
    """Planned against served KV pool (`served.kv_pool`: trtkv.serving.pool) for the recorded
    server, when it runs; a --url elsewhere is another server: its pool is not read."""
    try:
        return served.kv_pool(recipe, url)
    except Exception as exc:  # noqa: BLE001 - the read-back never fails a benchmark; it says why it has no figure
        return {"planned_bytes_per_gpu": None, "source": f"not read: {exc}", "warning": None}


def _prefix_plan(served: ServedSide, recipe: Recipe) -> PrefixPrediction | None:
    """The plan's predicted hit rates (`served.prefix_plan`); a plan that fails leaves the
    measured rates without them, never the benchmark."""
    try:
        return served.prefix_plan(recipe)
    except Exception:  # noqa: BLE001 - the prediction is beside the measurement, never its condition
        return None


def assemble(
    recipe: Recipe,
    ep: Endpoint,
    opts: BenchOptions,
    records: list[RequestRecord],
    by_level: dict[str, list[RequestRecord]],
    tasks: list[acc_tasks.Task],
    task_records: dict[str, list[RequestRecord]],
    task_errors: dict[str, dict[str, Any]],
    slos: list[slo.SLO],
    check: dict[str, int],
    interrupted: str | None,
    started: str,
    wall_s: float,
) -> BenchResults:
    """results.json's content: summary in GenAI-Perf names, accuracy, SLO verdicts and every raw
    record."""
    b = recipe.bench
    levels = {
        label: BenchLevel.model_validate(summarize_level(rs)) for label, rs in by_level.items()
    }
    accuracy = {name: TaskScore.model_validate(entry) for name, entry in task_errors.items()}
    for task in tasks:
        if task.name in task_records:
            scored = task.score(task_records[task.name])
            accuracy[task.name] = TaskScore.model_validate({**scored, "notes": task.notes})
    checked = slo.check(slos, levels, accuracy)
    mode = (
        f"request rate {b.request_rate:g}/s"
        if b.request_rate
        else f"concurrency sweep {b.concurrency}"
    )
    return BenchResults(
        schema_id=SCHEMA,
        recipe=recipe.name,
        kv_cache=recipe.quantization.kv_cache.value,
        endpoint=BenchEndpoint(
            url=ep.url,
            protocol=ep.protocol.value,
            model=ep.model,
            source=ep.source,
            **({"endpoint_type": ep.endpoint_type} if ep.protocol is Protocol.OPENAI else {}),
        ),
        started_at=started,
        wall_seconds=wall_s,
        partial=interrupted is not None,
        interrupted_during=interrupted,
        workload=BenchWorkload(
            input_tokens=b.input_tokens,
            output_tokens=b.output_tokens,
            num_requests=b.num_requests,
            warmup_requests=b.warmup_requests,
            concurrency=b.concurrency,
            request_rate=b.request_rate,
            accuracy_concurrency=b.accuracy_concurrency,
            request_timeout_s=b.request_timeout_s,
            mode=mode,
            sampling="greedy (temperature 0, top_k 1)",
        ),
        token_counting=results.TOKEN_COUNTING,
        token_count_check=check,
        levels=levels,
        accuracy=accuracy,
        slo=BenchSLOs(
            passed=all(r.passed for r in checked),
            results=[SLOVerdict.model_validate(r.to_json()) for r in checked],
        ),
        records=[r.to_doc() for r in records],
    )


def write_all(
    folder: Path, doc: BenchResults, by_level: dict[str, list[RequestRecord]]
) -> list[str]:
    """results.json/.csv/.md, requests.csv and the PNG plots into `folder`; returns the plot
    names."""
    made = []
    if plots.latency_distributions(folder / "latency_distributions.png", by_level):
        made.append("latency_distributions.png")
    if levels := doc.levels:
        x = [float(label.split("=", 1)[1].rstrip("/s")) for label in levels]
        rate = doc.workload and doc.workload.request_rate
        if plots.throughput(
            folder / "throughput.png", levels, x, "offered requests/s" if rate else "concurrency"
        ):
            made.append("throughput.png")
    if plots.accuracy(folder / "accuracy.png", doc.accuracy):
        made.append("accuracy.png")
    sweep_levels = doc.sweep.levels if doc.sweep else {}
    if plots.itl_vs_input(
        folder / "itl_vs_input.png", sweep_levels, f"{doc.recipe}: ITL vs input length"
    ):
        made.append("itl_vs_input.png")
    results_files.write_json(folder / "results.json", doc)
    results_files.write_csv(folder / "results.csv", doc)
    results_files.write_requests_csv(folder / "requests.csv", doc.records)
    results_files.write_md(folder / "results.md", doc, made)
    # AIPerf's layout: one profile_export_aiperf.json/.csv per run (level)
    endpoint = doc.endpoint.model_dump(exclude_unset=True) if doc.endpoint else None
    for label, recs in by_level.items():
        meta = {"trtkv": {"recipe": doc.recipe, "level": label, "endpoint": endpoint}}
        aiperf_export.write_level(
            folder / "aiperf" / label.replace("=", "_").replace("/", "_"),
            recs,
            doc.goodput_slos,
            meta,
        )
    return made
