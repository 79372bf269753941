"""`trtkv plan`: KV bytes per token, capacity on the recipe's GPUs, decode bandwidth bound,
advice."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from trtkv.cli.common import add_verb, load
from trtkv.core.options import Flag, Options
from trtkv.units import GIB

if TYPE_CHECKING:
    from trtkv.plan.estimate_model import Estimate
    from trtkv.plan.result import Plan


class PlanOptions(Options):
    """`trtkv plan RECIPE [options]`: each field one flag (trtkv.core.options)."""

    as_json: Annotated[
        bool, Field(description="print the figures as JSON"), Flag(names=("--json",))
    ] = False
    full: Annotated[
        bool,
        Field(
            description="after the one-screen answer, the pool's terms, the capacity, decode and "
            "prefix tables, the advice and the notes (wrapped to the terminal)"
        ),
        Flag(names=("--full", "-v")),
    ] = False
    estimate: Annotated[
        bool,
        Field(
            description="TTFT, ITL and output tokens/s per KV format and bench.concurrency level "
            "for the recipe's engine and GPU (aiconfigurator where it has data, else trtkv's "
            "model; each row says which)"
        ),
        Flag(),
    ] = False
    no_aiconfigurator: Annotated[
        bool, Field(description="with --estimate: trtkv's own model for every row"), Flag()
    ] = False
    probe_dir: Annotated[
        Path | None,
        Field(description="probe results to base advice on (default engines/<recipe>/probe)"),
        Flag(),
    ] = None


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(
        sub,
        "plan",
        "  $ trtkv plan llama70b_fp8kv\n  $ trtkv plan llama70b_fp8kv --full\n"
        "  $ trtkv plan llama70b_fp8kv --json\n"
        "  $ trtkv plan llama70b_fp8kv hardware.gpu=H200-141GB build.max_seq_len=131072\n"
        "  $ trtkv plan llama8b_fp8kv --estimate bench.input_tokens=32768 bench.output_tokens=1024 "
        "'bench.concurrency=[1,8]'\n",
        PlanOptions,
        run,
    )


def run(args: argparse.Namespace) -> int:
    from trtkv.plan.planner import plan

    o = PlanOptions.from_args(args)
    recipe = load(args)
    result = plan(recipe, o.probe_dir)
    est = None
    if o.estimate:
        from trtkv.plan.estimate import estimate

        est = estimate(recipe, result, use_aiconfigurator=not o.no_aiconfigurator)
    if est is not None:
        from dataclasses import replace

        # the advice compares formats from the estimate's rows (one source each), in place of the
        # model-only line
        prefix = est.replaces_advice or "\0"
        kept = [a for a in result.advice if not a.startswith(prefix)]
        at = next((i for i, a in enumerate(result.advice) if a.startswith(prefix)), len(kept))
        result = replace(result, estimate=est, advice=[*kept[:at], *est.advice, *kept[at:]])
    if o.as_json:
        print(result.to_json())
        return 0
    from trtkv.cli.plan_summary import summary, width, wrap

    lines = summary(result, recipe)
    cols = width()
    if o.full:
        lines += ["", *format_plan(result, cols)]
    if est is not None:
        lines += ["", *format_estimate(est, result, cols, notes=o.full)]
    if not o.full:
        notes = len(result.notes) + (len(est.notes) if est is not None else 0)
        lines += [
            "",
            *wrap(
                f"Terms, tables, advice and {notes} note(s): trtkv plan {args.recipe} --full "
                "(figures: --json)",
                cols,
            ),
        ]
    print("\n".join(lines))
    return 0


def format_estimate(est: Estimate, p: Plan, cols: int, notes: bool = True) -> list[str]:
    """The estimate's table; the KV pool its `max conc` divides is the plan's (`KV pool per GPU`
    above). Its heading and notes wrapped to `cols`; the notes only when asked (`--full`)."""
    from trtkv.cli.plan_summary import wrap

    w = est.workload
    lines = wrap(
        f"Speed estimate ({est.engine} on {est.gpu}; {w['input_tokens']:,} tokens in, "
        f"{w['output_tokens']:,} out, {w['arrival']} arrival; chunked prefill "
        f"{w['max_num_batched_tokens']:,} tokens/step; "
        f"KV pool {p.kv_pool_bytes_per_gpu / GIB:.1f} GiB/GPU, {p.kv_pool.engine}'s rule): "
        f"{est.aiconfigurator}",
        cols,
    )
    # aiconfigurator's figures beside a level whose rows are trtkv's model (not compared)
    beside = any(r.aiconfigurator for r in est.rows)
    head = ["format", "conc", "TTFT ms", "ITL ms", "tok/s/GPU", "tok/s/user", "max conc"]
    head += ["aic TTFT", "aic ITL", "source"] if beside else ["source"]
    rows = []
    for r in est.rows:
        a = r.aiconfigurator
        row = [
            r.format,
            f"{r.concurrency}" + ("" if r.fits else "*"),
            f"{r.ttft_ms:,.1f}",
            f"{r.itl_ms:.2f}" if r.itl_ms else "-",
            f"{r.output_tokens_per_s:,.0f}",
            f"{r.output_tokens_per_s_per_user:.1f}" if r.output_tokens_per_s_per_user else "-",
            f"{est.max_concurrency[r.format]:,}",
        ]
        if beside:
            row += [f"{a.ttft_ms:,.1f}", f"{a.itl_ms:.2f}"] if a else ["", ""]
        rows.append([*row, r.source])
    lines += _table(head, rows)
    lines += [x for a in est.advice for x in wrap(f"Compared: {a}", cols, "  ")]
    if est.prefix is not None:  # bench.prefix: hit rates per tier and their TTFT (#55)
        from trtkv.plan import reuse_lines

        said, *table = reuse_lines(est.prefix)
        lines += ["", *wrap(said, cols), *table]
    if notes:
        lines += [x for n in est.notes for x in wrap(f"Note: {n}", cols)]
    elif est.notes:
        lines.append(f"{len(est.notes)} note(s) on the estimate: --full")
    return lines


def format_plan(p: Plan, cols: int) -> list[str]:
    """Everything the plan holds, as text: the model, the pool's terms, the tables, the advice and
    the notes; lines of prose wrapped to `cols` (tables are not)."""
    from trtkv.cli.plan_summary import concurrency_line, wrap

    m, hw, w, att = p.model, p.hardware, p.weights, p.attention
    lines = [
        f"Plan for {p.recipe}: {m.num_layers} layers, {m.num_kv_heads} KV heads x "
        f"head_dim {m.head_dim}, {m.parameters / 1e9:.2f}B parameters ({m.source})"
    ]
    mem = f"{hw.memory_gib:.1f} GiB" if hw.memory_gib else "memory unknown"
    bw = f"{hw.hbm_bandwidth_gbps:g} GB/s" if hw.hbm_bandwidth_gbps else "bandwidth unknown"
    lines.append(
        f"Hardware: {hw.count} x {hw.gpu.value} ({mem}, {bw}), TP{hw.tp_size} PP{hw.pp_size}"
    )
    lines.append(
        f"Weights ({w.precision}): {w.total_gib:.2f} GiB total, {w.per_gpu_gib:.2f} GiB per GPU"
    )
    lines += [x for line in format_kv_pool(p) for x in wrap(line, cols, "    ")]
    lines.append(f"Recipe KV format: {p.recipe_kv_format}")
    lines += wrap(f"Concurrency cap: {concurrency_line(p)}", cols)
    lines += wrap(
        f"Attention: {att.summary} ({att.source}); capacity follows {att.accounting}", cols
    )
    if att.state is not None:
        st = att.state
        lines.append(
            f"State: each of the {st.layers} {st.kind} layers keeps "
            f"{st.bytes_per_layer / 2**20:,.2f} MiB per sequence at any length (conv "
            f"{st.conv_dtype}, recurrent {st.recurrent_dtype}: {st.dtype_source}), "
            f"{st.bytes_per_sequence / 2**20:,.1f} MiB per sequence in all; vLLM aligns its "
            f"attention block to {st.vllm_attention_block} tokens to page it"
        )
    uniform = all(x == "full" for x in att.layers)
    lines.append("")
    # where layers are sliding, chunked or state, the engine's own token (its printed count) beside
    engine = (
        [] if uniform else [f"{p.kv_pool.engine} B/token/GPU", f"{p.kv_pool.engine} tokens/GPU"]
    )
    head = ["format", "B/token", "B/token/GPU", "tokens/GPU", *engine]
    head += [f"seqs@{_k(n)}" for n in p.lengths]
    rows = [
        [
            c.format,
            f"{c.bytes_per_token:,.0f}",
            f"{c.bytes_per_token_per_gpu:,.0f}",
            f"{c.tokens_per_gpu_budget:,}",
        ]
        + (
            []
            if uniform
            else [f"{c.engine_bytes_per_token_per_gpu:,.0f}", f"{c.engine_tokens_per_gpu:,}"]
        )
        + [f"{c.max_sequences[n]:,}" for n in p.lengths]
        for c in p.formats
    ]
    lines += _table(head, rows)
    if not uniform:
        lines += wrap(
            "B/token and tokens/GPU count a token in every layer (the exact account); "
            f"{p.kv_pool.engine}'s columns count it as the engine does: {p.engine_token_rule}",
            cols,
        )
    if any(c.decode_step_ms for c in p.formats):
        lines.append("")
        lines.append(
            "Decode step lower bound (ms; weights + KV read once per step at HBM bandwidth, "
            "batch = min(max_batch_size, what fits)):"
        )
        head = ["format"] + [f"@{_k(n)}" for n in p.lengths]
        rows = [[c.format] + [f"{c.decode_step_ms[n]:.2f}" for n in p.lengths] for c in p.formats]
        lines += _table(head, rows)
    if not uniform:
        lines.append("")
        block = (
            f"{att.vllm_block_size}"
            if att.state is None
            else f"{att.vllm_block_size} raised to hold a state page, "
            f"{att.state.vllm_attention_block} for {p.recipe_kv_format}, with the state blocks "
            "prefix caching keeps"
        )
        lines.append(
            f"{'KV' if att.state is None else 'KV and state'} of one sequence (GiB, all GPUs; "
            "exact = per-layer windows as TensorRT-LLM keeps them, vllm = vLLM's allocation with "
            f"max_num_batched_tokens {att.max_num_batched_tokens}, block {block}):"
        )
        head = ["format", "accounting"] + [f"@{_k(n)}" for n in p.lengths]
        rows = [
            [c.format, acc]
            + [f"{c.per_sequence_kv_bytes_by_accounting[acc][n] / GIB:.3f}" for n in p.lengths]
            for c in p.formats
            if c.format in (p.formats[0].format, "fp16", "fp8")
            for acc in c.per_sequence_kv_bytes_by_accounting
        ]
        lines += _table(head, rows)
    pc = p.prefix_cache
    lines.append("")
    lines.append(
        f"Prefix cache: {'on' if pc.enabled else 'off'} ({pc.why}); sequences per replica of "
        f"{pc.input_tokens} in + {pc.output_tokens} out tokens at each prefix hit rate:"
    )
    head = ["format"] + [f"hit {h:.0%}" for h in pc.hit_rates]
    lines += _table(head, [[r.format] + [f"{n:,}" for n in r.sequences.values()] for r in pc.rows])
    if p.kv_tiers is not None:  # a host KV tier (#55): capacity per tier, per format
        from trtkv.plan.tiers import tier_lines

        lines.append("")
        lines += tier_lines(p.kv_tiers)
    lines.append("")
    for ex in p.examples:
        parts = ", ".join(f"{fmt} {gib:g} GiB" for fmt, gib in ex.kv_gib.items())
        lines.append(f"KV for {ex.context_len:,} tokens x batch {ex.batch}: {parts}")
    lines.append("")
    lines += wrap(f"Advice ({p.advice_basis}):", cols)
    lines += [x for a in p.advice for x in wrap(f"  - {a}", cols, "  ")]
    lines += [x for n in p.notes for x in wrap(f"Note: {n}", cols)]
    return [x for line in lines for x in (wrap(line, cols) if _prose(line) else [line])]


def _prose(line: str) -> bool:
    """A line of words (not a table's row, header or rule): the ones wrapped."""
    return ":" in line and "  " not in line.strip()


def format_kv_pool(p: Plan) -> list[str]:
    """The KV pool per GPU, the engine rule it follows (release, source), the flag values the served
    command carries and every term of the rule."""
    kp = p.kv_pool
    lines = [
        f"KV pool per GPU: {kp.pool_bytes / GIB:.2f} GiB, {kp.engine} {kp.version}'s rule: "
        f"{kp.rule}"
    ]
    if kp.knob is not None and kp.knob_value is not None:
        default = " (the engine's default, left unset in the recipe)" if kp.knob_is_default else ""
        lines.append(
            f"  {kp.knob} {kp.knob_value:g}{default}: {kp.budget_bytes / GIB:.2f} GiB to divide"
        )
    for t in kp.terms:
        lines.append(f"  - {t.name} {t.bytes / GIB:.2f} GiB: {t.note}")
    bound = {
        "rule": "the rule",
        "cap": f"capped by {kp.cap_flag} {kp.cap_value:,}" if kp.cap_value else "capped",
        "pin": f"pinned by {kp.cap_flag} {kp.cap_value:,}"
        if kp.cap_flag and kp.cap_value
        else "pinned",
    }
    lines.append(
        f"  = {kp.available_bytes / GIB:.2f} GiB by the rule; allocated {kp.pool_bytes / GIB:.2f} "
        f"GiB ({bound.get(kp.bound, kp.bound)}, whole blocks)"
    )
    lines.append(f"  rule read from {kp.source}")
    return lines


def _k(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    fmt = "  ".join(f"{{:>{w}}}" if i else f"{{:<{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*head), fmt.format(*["-" * w for w in widths])]
    out += [fmt.format(*r) for r in rows]
    return out
