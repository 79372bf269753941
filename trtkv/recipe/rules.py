"""Cross-field rules: what no single field can say (tp x pp vs GPUs, lengths, FP8 hardware, ports,
...), plus each backend's own rules (trtkv.recipe.backend_rules, engine_formats, memory_knobs), and
the default bench task that reads the backend rows (which import the schema)."""

from __future__ import annotations

from trtkv.platform.gpu_capabilities import gpus_where
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import kv_tiers, prefix_cache
from trtkv.recipe.backend_rules import BACKEND_ROWS, BACKEND_RULES
from trtkv.recipe.engine_formats import engine_format_problems
from trtkv.recipe.enums import BenchTask, GemmPlugin, KVCacheQuant, Protocol, WeightQuant
from trtkv.recipe.memory_knobs import memory_knob_problems
from trtkv.recipe.moe_activations import moe_activation_problems
from trtkv.recipe.parallel import parallel_problems
from trtkv.recipe.schema import Recipe
from trtkv.recipe.stored import stored_problems


# model.architecture values ModelOpt 0.47 exports only as its unified HF checkpoint
# (checkpoint/hf/), never as a TensorRT-LLM checkpoint, and why: calibrate writes hf/ alone for
# them; backend tensorrt is refused here and the TRT-LLM checkpoint validation
# (trtkv.checkpoints.trtllm_checkpoint) refuses to read one for them.
def kv_heads_split(kv_heads: int, tp: int) -> bool:
    """KV heads split over TP ranks, or replicated when TP is a multiple of them (TensorRT-LLM;
    ModelOpt's dup_kv_weight asserts tp_size % num_kv_heads == 0)."""
    return kv_heads % tp == 0 or tp % kv_heads == 0


def add_default_tasks(r: Recipe) -> None:
    """A quantized KV cache is benched against what its format predicts unless the recipe names its
    tasks or its served model has no per-token log-probs (trtkv.bench.tasks.fidelity_served)."""
    able = (
        BACKEND_ROWS[r.build.backend].token_log_probs_on_triton
        or r.bench.protocol is Protocol.OPENAI
    )
    named = "tasks" in r.bench.model_fields_set or BenchTask.FIDELITY in r.bench.tasks
    if able and not named and r.kv_row.choice.kind != "unquantized":
        r.bench.tasks = [*r.bench.tasks, BenchTask.FIDELITY]


def cross_field_problems(r: Recipe) -> list[tuple[str, str]]:
    """Rules that involve more than one field: (field path, message) pairs."""
    out: list[tuple[str, str]] = []
    b, hw, q, m = r.build, r.hardware, r.quantization, r.model
    on_cpu = hw.gpu is GPU.CPU
    if on_cpu:
        if r.world_size != 1:
            out.append(
                (
                    "build.tp_size",
                    f"tp_size x pp_size = {r.world_size}, but hardware.gpu is cpu: use 1 and 1",
                )
            )
    elif r.world_size != hw.count:
        out.append(
            (
                "build.tp_size",
                f"tp_size x pp_size = {b.tp_size} x {b.pp_size} = {r.world_size} must equal "
                f"hardware.count = {hw.count}",
            )
        )
    if not on_cpu and hw.count > hw.gpus_per_node and hw.count % hw.gpus_per_node:
        out.append(
            (
                "hardware.count",
                f"{hw.count} GPUs per model instance do not fill whole nodes of "
                f"hardware.gpus_per_node = {hw.gpus_per_node}: use a multiple of "
                f"{hw.gpus_per_node} (each node runs the same number of ranks), or at most "
                f"{hw.gpus_per_node} (one node)",
            )
        )
    # the attention's TP: tp_size, or one attention-DP group's share (trtkv.recipe.parallel)
    atp = r.parallelism.attention_tp
    tp_words = (
        f"build.tp_size = {b.tp_size}"
        if atp == b.tp_size
        else f"build.tp_size / attention_dp_size = {b.tp_size} / {b.attention_dp_size} = {atp}"
    )
    if m.num_attention_heads is not None and m.num_attention_heads % atp:
        out.append(
            (
                "model.num_attention_heads",
                f"{m.num_attention_heads} heads are not divisible by {tp_words}",
            )
        )
    if m.num_kv_heads is not None and not kv_heads_split(m.num_kv_heads, atp):
        out.append(
            (
                "model.num_kv_heads",
                f"{m.num_kv_heads} KV heads and {tp_words}: TP must divide "
                f"the KV heads, or be a multiple of them (each KV head is then replicated "
                f"on tp_size / num_kv_heads GPUs, as TensorRT-LLM and ModelOpt's export do)",
            )
        )
    if m.num_layers is not None and m.num_layers < b.pp_size:
        out.append(
            ("build.pp_size", f"pp_size {b.pp_size} exceeds model.num_layers {m.num_layers}")
        )
    if b.max_input_len >= b.max_seq_len:
        out.append(
            (
                "build.max_input_len",
                f"max_input_len {b.max_input_len} must be < build.max_seq_len {b.max_seq_len}",
            )
        )
    if m.max_position_embeddings is not None and b.max_seq_len > m.max_position_embeddings:
        out.append(
            (
                "build.max_seq_len",
                f"max_seq_len {b.max_seq_len} exceeds the model's max_position_embeddings "
                f"{m.max_position_embeddings}",
            )
        )
    out += _context_fmha_problems(r)
    out += gpu_capability_problems(r)
    out += moe_activation_problems(r)  # an MXFP4-expert activation the engine cannot run
    if q.kv_skip_layers:
        if r.kv_row.choice.kind == "unquantized":
            out.append(
                (
                    "quantization.kv_skip_layers",
                    "layers kept in the model dtype need a quantized KV cache for "
                    "the others (quantization.kv_cache is none): remove the list",
                )
            )
        if m.dtype.value == "float32":
            out.append(
                (
                    "quantization.kv_skip_layers",
                    "the skipped layers keep the model dtype, and trtkv plans "
                    "16-bit KV only: use model.dtype bfloat16 or float16",
                )
            )
        beyond = [
            i
            for i in q.kv_skip_layers
            if isinstance(i, int) and m.num_layers is not None and i >= m.num_layers
        ]
        if beyond:
            out.append(
                (
                    "quantization.kv_skip_layers",
                    f"layers {beyond} do not exist: model.num_layers is "
                    f"{m.num_layers} (indices 0..{(m.num_layers or 1) - 1})",
                )
            )
    out += _attention_layer_problems(r)
    if b.gemm_plugin is GemmPlugin.FP8 and q.weights is not WeightQuant.FP8:
        out.append(("build.gemm_plugin", "gemm_plugin fp8 needs quantization.weights: fp8"))
    # the engine formats, per backend and GPU, from trtkv/data/kv_formats.json
    out += engine_format_problems(r)
    out += BACKEND_RULES[b.backend](r)
    out += stored_problems(r)
    out += parallel_problems(r.parallelism, b.backend, hw.gpus_per_node)
    out += memory_knob_problems(r)
    out += kv_tiers.problems(r)  # a KV tier beyond the device the engine cannot serve
    for length in r.bench.sweep_input_tokens:
        if length > b.max_input_len:
            out.append(
                (
                    "bench.sweep_input_tokens",
                    f"{length} exceeds build.max_input_len {b.max_input_len}: the "
                    f"server would refuse the prompt; lower it or raise build.max_input_len.",
                )
            )
        elif length + r.bench.output_tokens > b.max_seq_len:
            out.append(
                (
                    "bench.sweep_input_tokens",
                    f"{length} + output_tokens {r.bench.output_tokens} exceeds "
                    f"build.max_seq_len {b.max_seq_len}; lower it or raise build.max_seq_len.",
                )
            )
    out += prefix_cache.problems(r)  # an explicit prefix-cache true the engine cannot honour
    for length in r.bench.needle_context_lengths if BenchTask.NEEDLE in r.bench.tasks else []:
        if length > b.max_input_len:
            out.append(
                (
                    "bench.needle_context_lengths",
                    f"{length} exceeds build.max_input_len {b.max_input_len}: "
                    f"the server would refuse the prompt; lower it or raise "
                    f"build.max_input_len",
                )
            )
    if r.bench.input_tokens > b.max_input_len:
        out.append(
            (
                "bench.input_tokens",
                f"{r.bench.input_tokens} exceeds build.max_input_len {b.max_input_len}",
            )
        )
    if r.bench.input_tokens + r.bench.output_tokens > b.max_seq_len:
        out.append(
            (
                "bench.output_tokens",
                f"input_tokens + output_tokens = "
                f"{r.bench.input_tokens + r.bench.output_tokens} exceeds build.max_seq_len "
                f"{b.max_seq_len}",
            )
        )
    out += _prefix_workload_problems(r)
    ports = {
        "triton.http_port": r.triton.http_port,
        "triton.grpc_port": r.triton.grpc_port,
        "triton.metrics_port": r.triton.metrics_port,
    }
    if len(set(ports.values())) != len(ports):
        out.append(
            (
                "triton.grpc_port",
                f"HTTP, gRPC and metrics ports must differ, got {sorted(ports.values())}",
            )
        )
    return out


def gpu_capability_problems(r: Recipe) -> list[tuple[str, str]]:
    """What the GPU's compute capability rules out (trtkv.platform.hardware's table): FP8 below
    SM89, an NVFP4 KV cache off SM100/103 (TensorRT-LLM's FP4 attention kernels; SM120 has FP4 GEMMs
    but not them)."""
    q, hw, out = r.quantization, r.hardware, []
    on_cpu = hw.gpu is GPU.CPU
    spec = None if on_cpu else GPU_SPECS[hw.gpu]
    where = "" if spec is None else f"{hw.gpu.value} (compute capability {spec.compute_capability})"
    if q.weights is WeightQuant.FP8 and spec is not None and not spec.has_fp8:
        out.append(
            (
                "quantization.weights",
                f"FP8 weights need FP8 tensor cores (SM89+: {', '.join(gpus_where('fp8'))});"
                f" {where} has none: use int8_sq, int4_awq or none",
            )
        )
    # a calibrated format's element needs the GPU's type (the engine formats:
    # trtkv.recipe.engine_formats)
    element = r.kv_row.numerics["element"].upper() if r.kv_row.choice.kind == "calibrated" else ""
    if element.startswith("FP8") and spec is not None and not spec.has_fp8:
        out.append(
            (
                "quantization.kv_cache",
                f"an FP8 KV cache needs FP8 support (SM89+: {', '.join(gpus_where('fp8'))});"
                f" on {where} use int8",
            )
        )
    if element.startswith("FP4") and (spec is None or not spec.nvfp4_kv):
        out.append(
            (
                "quantization.kv_cache",
                f"an NVFP4 KV cache needs a datacenter Blackwell GPU (SM100/103: "
                f"{', '.join(gpus_where('nvfp4_kv'))}); hardware.gpu is "
                f"{where or hw.gpu.value}: use fp8 (or measure nvfp4 on the CPU with "
                f"`trtkv probe RECIPE --formats nvfp4`)",
            )
        )
    return out


def _context_fmha_problems(r: Recipe) -> list[tuple[str, str]]:
    """Context-FMHA flags TensorRT-LLM's builder would refuse or silently change (tensorrt
    backend)."""
    b, q = r.build, r.quantization
    out: list[tuple[str, str]] = []
    if b.use_fp8_context_fmha:
        if q.kv_cache is not KVCacheQuant.FP8:
            out.append(
                (
                    "build.use_fp8_context_fmha",
                    f"FP8 context FMHA needs quantization.kv_cache: fp8 (it is "
                    f"{q.kv_cache.value}); set it to false or leave it unset",
                )
            )
        if q.weights is not WeightQuant.FP8:
            out.append(
                (
                    "build.use_fp8_context_fmha",
                    f"FP8 context FMHA needs the FP8 quantization workflow "
                    f"(quantization.weights: fp8, it is {q.weights.value}); "
                    f"TensorRT-LLM disables it otherwise: set it to false or "
                    f"leave it unset",
                )
            )
    return out


def _attention_layer_problems(r: Recipe) -> list[tuple[str, str]]:
    """model.attention_layers against num_layers and the MLA fields; `sliding_window` skips need
    sliding layers."""
    from trtkv.recipe.attention import AttentionKind, parse_layers

    m, out = r.model, []
    layers = parse_layers(m.attention_layers) if m.attention_layers else ()
    if layers and m.num_layers is not None and len(layers) != m.num_layers:
        out.append(
            (
                "model.attention_layers",
                f"{len(layers)} layers listed, model.num_layers is {m.num_layers}: "
                f"list one entry per layer (COUNT with *COUNT)",
            )
        )
    if any(x.kind is AttentionKind.MLA for x in layers) and m.kv_lora_rank is None:
        out.append(
            (
                "model.kv_lora_rank",
                "mla layers need model.kv_lora_rank and model.qk_rope_head_dim (the latent "
                "each token keeps)",
            )
        )
    if (
        "sliding_window" in r.quantization.kv_skip_layers
        and layers
        and not any(x.kind is AttentionKind.SLIDING for x in layers)
    ):
        out.append(
            (
                "quantization.kv_skip_layers",
                "sliding_window: model.attention_layers has no sliding layer",
            )
        )
    return out


def _prefix_workload_problems(r: Recipe) -> list[tuple[str, str]]:
    """bench.prefix: the shared prefix inside the first prompt, the longest session within the
    served lengths."""
    p, b, bench = r.bench.prefix, r.build, r.bench
    out: list[tuple[str, str]] = []
    if p.shared_tokens > bench.input_tokens:
        out.append(
            (
                "bench.prefix.shared_tokens",
                f"{p.shared_tokens} exceeds bench.input_tokens {bench.input_tokens} (the first "
                "prompt holds the shared prefix): lower it or raise bench.input_tokens",
            )
        )
    if p.turns == 1:
        return out
    longest = p.longest_tokens(bench.input_tokens, bench.output_tokens)
    formula = (
        f"input_tokens {bench.input_tokens} + (turns {p.turns} - 1) x (turn_tokens "
        f"{p.turn_tokens} + output_tokens {bench.output_tokens}) + output_tokens "
        f"{bench.output_tokens} = {longest}"
    )
    if longest > b.max_seq_len:
        out.append(
            (
                "bench.prefix.turns",
                f"the longest session is {formula} tokens, over build.max_seq_len "
                f"{b.max_seq_len}: lower bench.prefix.turns or bench.prefix.turn_tokens, or raise "
                "build.max_seq_len",
            )
        )
    elif longest - bench.output_tokens > b.max_input_len:
        out.append(
            (
                "bench.prefix.turns",
                f"the last turn's prompt is {longest - bench.output_tokens} tokens ({formula} "
                f"less its answer), over build.max_input_len {b.max_input_len}: lower "
                "bench.prefix.turns or bench.prefix.turn_tokens, or raise build.max_input_len",
            )
        )
    return out
