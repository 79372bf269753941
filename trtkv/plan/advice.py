"""The planner's advice and notes: measured (from `trtkv probe` results) when there are any, else
published guidance, plus what each attention-layer type means for the bytes (trtkv.plan.planner
calls these)."""

from __future__ import annotations

from pathlib import Path

from trtkv.engines.sequence import sequence_kv_bytes
from trtkv.kvcache.formats import KVFormat
from trtkv.plan.model import (
    Architecture,
    recipe_accounting,
    recipe_formats,
    seq_bytes,
    weights_bytes,
)
from trtkv.plan.result import FormatCapacity
from trtkv.platform.hardware import GPU
from trtkv.recipe import Recipe
from trtkv.recipe.attention import Accounting, AttentionKind, layer_formats
from trtkv.recipe.backend_rules import SPEED_ENGINE
from trtkv.recipe.stored import engine_unit_scale
from trtkv.units import GIB


def attention_notes(arch: Architecture, recipe: Recipe) -> list[str]:
    out = list(arch.config_notes)
    layers = arch.layer_list()
    if arch.kv_lora_rank:
        out.append(
            f"MLA: one latent of {arch.kv_shape().mla_latent} elements per token and layer "
            f"(kv_lora_rank {arch.kv_lora_rank} + qk_rope_head_dim {arch.qk_rope_head_dim}), no "
            f"separate V; under TP {recipe.build.tp_size} the latent is whole on every rank "
            "(per-GPU KV is not divided by TP)."
            + (
                " vLLM stores fp8 as fp8_ds_mla, 656 bytes/token/layer (sparse MLA)."
                if arch.sparse_mla
                else ""
            )
        )
    if arch.sinks:
        out.append(f"Attention sinks ({arch.sinks}): no KV cost, left out of the figures.")
    if any(x.kind is AttentionKind.CHUNKED for x in layers):
        n, fmts = recipe.build.max_seq_len, [KVFormat.FP16] * len(layers)
        on = sequence_kv_bytes(
            layers,
            arch.kv_shape(),
            fmts,
            n,
            1,
            1,
            Accounting.VLLM,
            recipe.build.max_num_tokens,
            recipe_accounting(recipe)[1],
            hybrid=True,
        )
        out.append(
            "vLLM turns its hybrid KV manager off by default for chunked-local attention and "
            "sizes those layers as full attention (the vllm rows); with it on, one 16-bit "
            f"sequence of {n:,} takes {on / GIB:.3g} GiB. TensorRT-LLM's exact figures keep one "
            "chunk."
        )
    if arch.expert_parameters:
        out.append(
            f"MoE: {arch.expert_parameters / 1e9:.1f}B of {arch.parameters() / 1e9:.1f}B "
            "parameters are routed experts, counted in full and split evenly over tp x pp (expert "
            "parallelism places the same bytes); the decode bound reads every weight, an upper "
            "bound for a step that routes to few experts."
        )
    return out


def format_row_note(recipe: Recipe) -> str | None:
    """The recipe's KV format as docs/kv-formats.md has it: numerics, the engines' values, scale
    bytes per token."""
    from trtkv.kvcache.engines import load_table
    from trtkv.kvcache.formats import PER_TOKEN_HEAD_SCALE_BYTES, bytes_per_element

    kv = recipe.kv_row.choice.name
    row = load_table().row(kv) if kv != "none" else None
    if row is None:
        return None
    n, fmt, m = row.numerics, recipe.kv_format, recipe.model
    engines = "; ".join(
        f"{e.engine} {e.version} `{e.config} {e.value}` (scales: {e.checkpoint_scales})"
        for e in row.engines
    )
    scale = ""
    if m.head_dim:
        per = bytes_per_element(fmt, int(m.head_dim))
        scale = f"; {per:.4g} bytes per K/V element at head_dim {m.head_dim}, scales included"
        if recipe.kv_format.value.endswith("_per_token_head"):
            scale += (
                f" ({PER_TOKEN_HEAD_SCALE_BYTES}-byte float32 scale per token and KV head, K "
                "and V each)"
            )
    name = kv if kv == row.name else f"{kv} (table row {row.name})"
    return (
        f"KV format {name} (docs/kv-formats.md): {n['element']}, scale {n['scale']} "
        f"({n['scale_granularity']}), scales from {n['scale_source']}{scale}; engines: {engines}."
    )


def unit_scale_note(recipe: Recipe, rec_fmt: KVFormat) -> str | None:
    """Where the recipe's engine runs FP8 KV at scale 1.0 whatever scales the checkpoint holds
    (trtkv.recipe.stored.engine_unit_scale): that the engine will use 1.0, why, and that the plan
    prices the cache as fp8_cast (the registry row's storage and dequantization cost; its accuracy
    cost is the probe's fp8_cast record)."""
    from trtkv.kvcache.engines import load_table

    why = engine_unit_scale(recipe)
    row = load_table().row(rec_fmt.value)
    if not why or row is None or row.storage is None:
        return None
    kv, backend = recipe.kv_row.choice.name, recipe.build.backend.value
    return (
        f"quantization.kv_cache {kv} on build.backend {backend}: the engine will use K/V scale 1.0 "
        f"on every layer ({why}). Planned as fp8_cast "
        f"({row.name}: {row.storage.bits}-bit, {row.storage.dequant_ops} dequantization operations "
        f"per element read); its accuracy cost is the fp8_cast row of `trtkv probe {recipe.name} "
        f"--formats fp8,fp8_cast`."
    )


def engine_format_guidance(recipe: Recipe, has_fp8: bool) -> list[str]:
    """Published guidance naming the engine formats of trtkv/data/kv_formats.json (no figures:
    nothing measured)."""
    from trtkv.kvcache.engines import load_table

    table, out = load_table(), []
    dyn = table.engine_rows("int8_per_token_head", "vllm")
    # the row's engine must be the recipe's (vLLM's format: no advice for TensorRT-LLM or SGLang)
    if dyn and SPEED_ENGINE.get(recipe.build.backend) == dyn[0].engine:
        out.append(
            f"On vLLM >= {dyn[0].version} (the version docs/kv-formats.md was read from), "
            f"`{dyn[0].config} {dyn[0].value}` is the INT8 without calibration (dynamic scale per "
            f"token and KV head; Triton attention backend): `trtkv probe {recipe.name} --formats "
            "int8,int8_per_token_head` measures it against static INT8 on this model."
        )
    cast = table.engine_rows("fp8_cast", "modelopt")
    if cast and has_fp8:
        out.append(
            f"ModelOpt {cast[0].version}'s default `{cast[0].config.split(' ')[0]} "
            f"{cast[0].value}` is FP8 with scale 1.0 (no calibration): `trtkv probe {recipe.name} "
            "--formats fp8,fp8_cast` measures what it costs against calibrated fp8."
        )
    return out


def advice_for(
    recipe: Recipe,
    arch: Architecture,
    caps: list[FormatCapacity],
    rec_fmt: KVFormat,
    has_fp8: bool,
    probe_dir: Path | None,
) -> tuple[list[str], str]:
    from trtkv.measures.probe_results import probe_advice  # small module, no torch

    measured = probe_advice(recipe, probe_dir)
    if measured is not None:
        return measured
    out: list[str] = []
    by = {c.format: c for c in caps}
    base = by.get(KVFormat.FP16.value)
    ctx = recipe.build.max_seq_len
    batch = recipe.build.max_batch_size
    if base is not None and base.tokens_per_gpu_budget:
        fits = base.max_sequences.get(ctx, 0)
        bound = fits < batch
        if ctx < 4096:
            out.append(
                f"Context {ctx} < 4K: KV cache quantization is rarely worth it for short-context "
                "chat; weights dominate memory."
            )
        elif bound:
            gain = "" if arch.state is not None else " (x2 capacity)"
            out.append(
                f"At max_seq_len {ctx}, fp16 KV fits {fits} sequences per replica but "
                f"max_batch_size is {batch}: the batch is bound by KV memory, so an 8-bit KV "
                f"cache{gain} pays off."
            )
        else:
            out.append(
                f"At max_seq_len {ctx}, fp16 KV already fits {fits} sequences (max_batch_size "
                f"{batch}): KV quantization buys bandwidth (decode speed) more than capacity."
            )
    if arch.state is not None:
        out += state_advice(recipe, arch, caps)
    if not arch.uniform_full():
        out += attention_advice(recipe, arch, caps, rec_fmt)
    speed = _speed_line(recipe, arch, caps, rec_fmt)
    if speed:
        out.append(speed)
    elif arch.uniform_full() and ctx >= 8192:
        out.append(
            "Context >= 8K: decode reads the whole KV cache every step, so halving its bytes cuts "
            "attention time."
        )
    if recipe.hardware.gpu is GPU.CPU:
        out.append(
            "CPU reference runtime: FP8 and INT8 KV are emulated in software (same numerics as the "
            "engine); on the GPU, prefer FP8 on Hopper/Ada/Blackwell."
        )
    elif has_fp8:
        out.append(
            "This GPU has FP8: prefer an FP8 (E4M3) KV cache; its exponent bits tolerate range "
            "errors of static scales."
        )
    else:
        out.append("No FP8 on this target: use INT8 KV with calibrated scales.")
    out.append(
        "INT8 KV only with calibrated (static) or per-token scales; uncalibrated INT8 clips."
    )
    out += engine_format_guidance(recipe, has_fp8)
    if ctx > 16384:
        out.append(
            "INT4 KV is risky at long context (error grows with every quantized past token): probe "
            "before use."
        )
    if rec_fmt is KVFormat.INT8:
        out.append(
            "TensorRT-LLM shares one scale for K and V per layer (kv_cache_scaling_factor); check "
            "V's resolution with `trtkv probe`."
        )
    return (
        out,
        "heuristic: published guidance, no probe results for this model yet (run `trtkv probe`)",
    )


def _speed_line(
    recipe: Recipe, arch: Architecture, caps: list[FormatCapacity], rec_fmt: KVFormat
) -> str | None:
    """The estimate's verdict on the recipe's format (trtkv.plan.estimate.speed_advice); None off
    the GPU engines."""
    from trtkv.plan.estimate import speed_advice

    by = {c.format: c for c in caps}
    base, rec = by.get(KVFormat.FP16.value), by.get(recipe.kv_format_label) or by.get(rec_fmt.value)
    n, exact = recipe.build.max_seq_len, Accounting.EXACT.value
    # one sequence's bytes at max_seq_len, so a hybrid's fixed state (which no KV format shrinks) is
    # in the ratio
    base_n = base.per_sequence_kv_bytes_by_accounting[exact].get(n) if base else None
    rec_n = rec.per_sequence_kv_bytes_by_accounting[exact].get(n) if rec else None
    return speed_advice(recipe, arch, base_n / rec_n if base_n and rec_n else None)


def attention_advice(
    recipe: Recipe, arch: Architecture, caps: list[FormatCapacity], rec_fmt: KVFormat
) -> list[str]:
    """Advice from each layer type's share of one sequence's bytes at the recipe's length (exact
    accounting)."""
    by = {c.format: c for c in caps}
    base, rec = by.get(KVFormat.FP16.value), by.get(recipe.kv_format_label) or by.get(rec_fmt.value)
    n = recipe.build.max_seq_len
    if base is None or rec is None:
        return []
    shares = base.bytes_by_attention[n]
    total = sum(shares.values()) or 1.0
    counts: dict[str, int] = {}
    for layer in arch.layer_list():
        counts[layer.label] = counts.get(layer.label, 0) + 1
    parts = ", ".join(
        f"{counts[k]} {k} layers {v / total:.0%}"
        for k, v in sorted(shares.items(), key=lambda kv: -kv[1])
    )
    what = "16-bit KV and fixed state" if arch.state is not None else "16-bit KV"
    out = [f"At max_seq_len {n:,}, one sequence's {what} is {total / GIB:.3g} GiB: {parts} of it."]
    local = sum(v for k, v in shares.items() if k.startswith(("sliding", "chunked")))
    if local and rec is not base:
        kept = rec.per_sequence_kv_bytes_by_accounting[Accounting.EXACT.value][n]
        out.append(
            f"{rec.format} KV shrinks every layer alike: {total / GIB:.3g} -> {kept / GIB:.3g} GiB "
            f"per sequence, {base.max_sequences[n]:,} -> {rec.max_sequences[n]:,} sequences of "
            f"{n:,} per GPU; {1 - local / total:.0%} of the saving is in the full-attention "
            f"layers, {local / total:.0%} in the windowed ones."
        )
        if (
            any(x.kind is AttentionKind.SLIDING for x in arch.layer_list())
            and "sliding_window" not in recipe.quantization.kv_skip_layers
        ):
            fmts = layer_formats(
                arch.layer_list(), rec_fmt, ("sliding_window",), recipe.kv_skip_format
            )
            mixed = seq_bytes(arch, fmts, n)
            out.append(
                "quantization.kv_skip_layers: [sliding_window] (vLLM) keeps the sliding layers "
                f"16-bit for {mixed / kept - 1:+.1%} bytes per sequence at {n:,} "
                f"({mixed / GIB:.3g} GiB)."
            )
    if arch.kv_lora_rank:
        out.append(
            f"MLA: {arch.kv_shape().mla_latent} elements per token and layer in all; TP does not "
            "shrink it, so more GPUs add KV room only through PP or the weights they take off each "
            "GPU."
        )
    read = (
        rec.per_sequence_kv_bytes_per_gpu[n]
        if recipe_accounting(recipe)[0] is Accounting.EXACT
        else seq_bytes(
            arch,
            recipe_formats(arch, recipe, rec_fmt),
            n,
            recipe.parallelism.attention_tp,
            recipe.build.pp_size,
        )
    )
    batch = max(1, min(recipe.build.max_batch_size, rec.max_sequences[n] or 1))
    weights = weights_bytes(arch, recipe)[1]
    out.append(
        f"A decode step at {n:,} tokens x batch {batch} reads {batch * read / GIB:.3g} GiB of KV "
        f"per GPU beside {weights / GIB:.3g} GiB of weights: KV is "
        f"{batch * read / (batch * read + weights):.0%} of the bytes read."
    )
    return out


def state_advice(recipe: Recipe, arch: Architecture, caps: list[FormatCapacity]) -> list[str]:
    """A hybrid: how few layers hold a KV cache, what the fixed state costs, what an 8-bit cache
    really buys."""
    layers = arch.layer_list()
    kv = sum(1 for x in layers if not x.is_state and x.kind is not AttentionKind.NONE)
    state_n = sum(1 for x in layers if x.is_state)
    shape, tp = arch.kv_shape(), recipe.build.tp_size
    kind = next(x for x in layers if x.is_state)
    per_seq = state_n * shape.sequence_state_bytes(kind)
    conv, ssm = arch.state_dtypes
    out = [
        f"Only {kv} of {len(layers)} layers hold a KV cache (1 in {len(layers) / max(kv, 1):.3g}); "
        f"the {state_n} {kind.kind.value} layers keep a fixed {per_seq / 2**20:,.1f} MiB per "
        f"sequence whatever its length (conv {conv} + recurrent {ssm}: {arch.state_dtype_source}; "
        f"build.mamba_ssm_cache_dtype sets it), {per_seq / tp / 2**20:,.1f} MiB per GPU at TP{tp}."
    ]
    by = {c.format: c for c in caps}
    base, eight = by.get(KVFormat.FP16.value), by.get(KVFormat.FP8.value)
    n = recipe.build.max_seq_len
    if base is not None and eight is not None:
        b, e = base.max_sequences.get(n, 0), eight.max_sequences.get(n, 0)
        seq = base.per_sequence_kv_bytes_by_accounting[Accounting.EXACT.value][n]
        ideal = seq / eight.per_sequence_kv_bytes_by_accounting[Accounting.EXACT.value][n]
        fits = f", {b:,} -> {e:,} sequences per GPU" if b else ""
        out.append(
            f"At max_seq_len {n:,} the state is {per_seq / seq:.0%} of a sequence's bytes, and an "
            f"8-bit KV cache halves only the KV of the {kv} attention layers: x{ideal:.2f} bytes "
            f"per sequence{fits}."
        )
    if ssm == "float32":
        out.append(
            f"The recurrent state is kept in float32 ({arch.state_dtype_source}); "
            f"build.mamba_ssm_cache_dtype bfloat16 halves it, at an accuracy cost to measure first."
        )
    return out
