"""The one-screen answer `trtkv plan` leads with: the KV pool, the sequences a replica holds, the
recommended KV format and why, each on a line of at most SUMMARY_WIDTH characters; and the wrapping
of the long lines (advice, notes, rules) of the full plan to the terminal's width.

The answer is read from the plan `plan --json` prints (no new figure): the recipe's own format row
at build.max_seq_len, the workload's sequences (no prefix hits) and the concurrency cap passed
(trtkv.plan.concurrency), and the format the probe
rated safe at the smallest size or, without probe results, the published guidance advice.py cites
(FP8 where the GPU has it, INT8 with calibrated scales where not, 16-bit where KV does not bound the
batch)."""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from typing import TYPE_CHECKING

from trtkv.units import GIB

if TYPE_CHECKING:
    from trtkv.plan.result import Plan
    from trtkv.recipe import Recipe

SUMMARY_WIDTH = 100  # the most characters a line of the answer holds
# the probe's per-format advice line (trtkv.measures.probe_results.probe_advice), smallest first
PROBE_LINE = re.compile(r"^(?P<format>\S+) at \d+ tokens: .* -> safe$")


def width() -> int:
    """The terminal's columns where stdout is one (at least 40), else SUMMARY_WIDTH: a pipe or a
    file gets the same text on every machine."""
    if not sys.stdout.isatty():
        return SUMMARY_WIDTH
    return max(40, shutil.get_terminal_size((SUMMARY_WIDTH, 24)).columns)


def wrap(line: str, cols: int, indent: str = "") -> list[str]:
    """`line` wrapped to `cols`, continuation lines indented past `indent` by two spaces; words
    (paths, flags) never broken."""
    if len(line) <= cols:
        return [line]
    return textwrap.wrap(
        line,
        cols,
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def _row_at(max_sequences: dict[int, int], ctx: int) -> tuple[int, int]:
    """The sequences of one format at `ctx` tokens, or at the longest planned length below it."""
    length = max((n for n in max_sequences if n <= ctx), default=min(max_sequences))
    return length, max_sequences[length]


def recommended(p: Plan, recipe: Recipe) -> tuple[str, str]:
    """The KV format to serve and why, in one line each."""
    from trtkv.platform.hardware import GPU, GPU_SPECS

    for line in p.advice:
        hit = PROBE_LINE.match(line)
        if hit and hit["format"] not in ("fp16", "bf16"):
            return hit["format"], "the smallest format `trtkv probe` rated safe on this model"
    by = {c.format: c for c in p.formats}
    ctx, batch = recipe.build.max_seq_len, recipe.build.max_batch_size
    base = by.get("fp16")
    gpu = p.hardware.gpu
    if gpu is GPU.CPU:
        return p.recipe_kv_format, "CPU reference runtime: the recipe's format, emulated"
    if base is not None:
        length, fits = _row_at(base.max_sequences, ctx)
        if fits >= batch:
            return "fp16", (
                f"KV does not bound the batch: fp16 fits {fits:,} sequences at {length:,} tokens, "
                f"max_batch_size {batch}"
            )
    pick = "fp8" if GPU_SPECS[gpu].has_fp8 else "int8"
    what = (
        f"{gpu.value} has FP8: E4M3's exponent tolerates static scales' range errors"
        if pick == "fp8"
        else f"no FP8 on {gpu.value}: INT8 with calibrated scales"
    )
    if base is not None and pick in by:
        length, fits = _row_at(by[pick].max_sequences, ctx)
        _, fits16 = _row_at(base.max_sequences, ctx)
        what += f"; {fits:,} vs fp16's {fits16:,} sequences at {length:,} tokens"
    return pick, what


def summary(p: Plan, recipe: Recipe) -> list[str]:
    """At most 12 lines of at most SUMMARY_WIDTH characters: the answer."""
    kp, hw, m = p.kv_pool, p.hardware, p.model
    mem = f", {hw.memory_gib:.1f} GiB each" if hw.memory_gib else ""
    knob = (
        f", {kp.knob} {kp.knob_value:g}"
        if kp.knob is not None and kp.knob_value is not None
        else ""
    )
    own = next((c for c in p.formats if c.format == p.recipe_kv_format), p.formats[0])
    length, fits = _row_at(own.max_sequences, recipe.build.max_seq_len)
    pc = p.prefix_cache
    work = next((r for r in pc.rows if r.format == own.format), None)
    fmt, why = recommended(p, recipe)
    lines = [
        f"{p.recipe}: {m.parameters / 1e9:.1f}B parameters on {hw.count} x {hw.gpu.value}{mem}, "
        f"{recipe.parallelism.label()}",
        f"KV pool:     {kp.pool_bytes / GIB:.2f} GiB per GPU "
        f"({kp.engine} {kp.version}'s rule{knob})",
        f"Sequences:   {fits:,} per replica at {length:,} tokens in {own.format} (the recipe's KV)",
    ]
    c = p.concurrency
    if work is not None:
        lines.append(
            f"             {c.workload_sequences:,} of {c.input_tokens:,} in + "
            f"{c.output_tokens:,} out tokens (no prefix hits)"
        )
    limit = f", {kp.engine}'s default {c.engine_limit:,}" if c.engine_limit is not None else ""
    lines.append(
        f"Cap:         {c.cap:,} requests at once (build.max_batch_size, passed as {c.flag}); the "
        f"workload asks {c.sized:,}{limit}"
    )
    tier = p.kv_tiers
    row = next((r for r in tier.rows if r.format == own.format), None) if tier else None
    if tier is not None and row is not None:  # a host KV tier (#55)
        lines.append(
            f"Host tier:   {tier.host_bytes_per_replica / GIB:.1f} GiB per replica "
            f"({tier.served}): +{row.host_tokens:,} tokens in {row.format}, "
            f"{row.resident_sequences:,} workload sequences resident "
            f"({row.running_sequences:,} running on the device)"
        )
    lines += [f"Recommended: {fmt} KV", f"Why:         {why}"]
    if fmt != p.recipe_kv_format:
        lines.append(
            f"             (the recipe serves {p.recipe_kv_format} KV: `trtkv probe` measures both)"
        )
    return [w for line in lines for w in wrap(line, SUMMARY_WIDTH, "           ")]


def concurrency_line(p: Plan) -> str:
    """The cap passed and what fits, in one line (`plan --full`)."""
    c = p.concurrency
    limit = f"; the engine's own default {c.engine_limit:,}" if c.engine_limit is not None else ""
    return (
        f"{c.cap:,} ({c.flag}); fit per replica: {c.full_context_sequences:,} of max_seq_len "
        f"{c.max_seq_len:,}, {c.workload_sequences:,} of {c.input_tokens:,} in + "
        f"{c.output_tokens:,} out tokens{limit}"
    )
