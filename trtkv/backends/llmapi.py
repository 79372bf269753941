"""Backend `llmapi` (alias `pytorch`): TensorRT-LLM's LLM API (its PyTorch backend) on the calibrated HF checkpoint,
the only path TensorRT-LLM has after 1.3.0rc20 (no engine build: the HF checkpoint loads directly).

Artifacts: ModelOpt's unified HF export (checkpoint/hf/, validated by trtkv.checkpoints.hf_export), the build stage's
`llm_api_options.yaml` (trtllm-serve `--extra_llm_api_options`, called `--config` since late 2025) and `serve_command.txt`,
and a Triton repository in upstream's `llmapi` layout: one Python model `tensorrt_llm` whose `1/model.yaml` holds the
same `LLM()` arguments. On a GPU the model runs `tensorrt_llm.LLM`; on hardware.gpu cpu the same model.py runs trtkv's
reference engine behind the same interface (trtkv.runtime.llm). KV dtype: `kv_cache_config.dtype` (fp8, nvfp4, or
auto = the checkpoint's); INT8 KV exists only on the engine path (TensorRT-LLM <= 1.2.x, backend tensorrt).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trtkv.backends.base import BUILD_SECTIONS, RefusingRunner, TritonServing, command_block, trtllm_served
from trtkv.backends.seam import EngineBackend, MemoryRule, TokenizerSource
from trtkv.checkpoints.serving_memory import EngineKnobs, trtllm_knobs
from trtkv.contracts.interface import LLMAPI
from trtkv.core.errors import StageError
from trtkv.core.tools import quote
from trtkv.platform.versions import Row
from trtkv.recipe import Backend, KVCacheQuant, Recipe
from trtkv.recipe.layout import HF, Artifacts, checkpoint_dir, engine_dir, host_artifacts, kv_cache_quant_algo, served_artifacts
from trtkv.recipe.prefix_cache import prefix_cache

SERVE_COMMAND = "serve_command.txt"
LLM_API_OPTIONS = "llm_api_options.yaml"
MODEL_YAML = "model.yaml"
GPU_MODULE = "tensorrt_llm"  # the engine module the Triton model imports LLM and SamplingParams from
CPU_MODULE = "trtkv.runtime.llm"
# LLM() arguments trtllm-serve takes as flags; the --config YAML carries the rest
SERVE_FLAGS = ("backend", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_num_tokens",
               "max_seq_len")
LLMAPI_RUNNER = """\
import json, sys
from tensorrt_llm import LLM, SamplingParams
a = json.loads(sys.argv[1])
llm = LLM(**a["llm_args"])
out = llm.generate([a["prompt"]], SamplingParams(max_tokens=a["max_tokens"], temperature=0.0))
print("TRTKV_TEXT"); print(out[0].outputs[0].text)
"""


LLMAPI_OPTIONS_FLAG = "--extra_llm_api_options"  # trtllm-serve's flag for the LLM() options YAML (newer name: --config)


def kv_dtype(recipe: Recipe) -> str:
    """kv_cache_config.dtype: fp8 / nvfp4 for a quantized KV cache, auto (the model dtype) for none."""
    kv = recipe.quantization.kv_cache
    return kv.value if kv in (KVCacheQuant.FP8, KVCacheQuant.NVFP4) else "auto"


def _period(values: list[int]) -> list[int]:
    """The shortest prefix that repeats to `values` (TensorRT-LLM repeats max_attention_window over the layers)."""
    n = len(values)
    for p in range(1, n + 1):
        if n % p == 0 and values == values[:p] * (n // p):
            return values[:p]
    return values


def model_layers(recipe: Recipe) -> list[Any] | None:
    """The model's per-layer attention: the recipe's model.attention_layers (what `trtkv init` read from config.json),
    else the HF export's config.json layer_types + sliding_window when calibrate has written it; None when unknown."""
    import json

    from trtkv.recipe.attention import AttentionKind, LayerAttention, parse_layers

    if recipe.model.attention_layers:
        return list(parse_layers(recipe.model.attention_layers))
    config = _hf(recipe) / "config.json"
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    types, window = text.get("layer_types"), text.get("sliding_window")
    if not isinstance(types, list) or not isinstance(window, int) or window <= 0:
        return None
    return [LayerAttention(AttentionKind.SLIDING, window) if kind == "sliding_attention"
            else LayerAttention(AttentionKind.FULL) for kind in types]


def max_attention_window(recipe: Recipe) -> list[int] | None:
    """kv_cache_config.max_attention_window for a sliding-window hybrid (Gemma 3: [512]*5 + [max_seq_len]): without it
    TensorRT-LLM's PyTorch backend sizes every layer's KV cache for max_seq_len (its variable-window layout is on only
    when the list holds more than one value: `is_vswa_enabled`, `_torch/pyexecutor/_util.py` @d8ae02ca), while the
    model still attends within each window and trtkv's planner counts each sliding layer's window only. Full layers get
    max_seq_len, windows are capped at it (as TensorRT-LLM normalizes them), and the list is its shortest repeating
    period (TensorRT-LLM repeats it over the layers; upstream's Gemma 3 VSWA example writes the same 6 values).
    None for a model without sliding layers, or whose windows all reach max_seq_len."""
    from trtkv.recipe.attention import AttentionKind

    layers = model_layers(recipe)
    if not layers or not any(x.kind is AttentionKind.SLIDING for x in layers):
        return None
    seq = recipe.build.max_seq_len
    windows = [min(x.window, seq) if x.kind is AttentionKind.SLIDING and x.window else seq for x in layers]
    return _period(windows) if len(set(windows)) > 1 else None


def _window_note(recipe: Recipe) -> str:
    windows = max_attention_window(recipe)
    return f" and per-layer `max_attention_window` {windows} (repeated over the layers)" if windows else ""


def llm_args(recipe: Recipe, hf_dir: Path) -> dict[str, Any]:
    """The LLM() keyword arguments for the recipe (model.yaml, the trtllm-serve config and `trtkv generate`).
    Every key is a field of TensorRT-LLM's TorchLlmArgs (tests/data/llm_args_fields.json). The KV-cache memory
    fields are the ones trtkv's plan used (llmapi_memory_knobs)."""
    b = recipe.build
    knobs = llmapi_memory_knobs(recipe)
    args: dict[str, Any] = {
        "model": str(hf_dir),
        "backend": "pytorch",
        "tensor_parallel_size": b.tp_size,
        "pipeline_parallel_size": b.pp_size,
        "max_batch_size": b.max_batch_size,
        "max_num_tokens": b.max_num_tokens,
        "max_seq_len": b.max_seq_len,
        "max_input_len": b.max_input_len,
        "enable_chunked_prefill": recipe.chunked_context,  # a prompt longer than max_num_tokens needs it
        "kv_cache_config": {
            "dtype": kv_dtype(recipe),
            "free_gpu_memory_fraction": knobs.value,
            "enable_block_reuse": prefix_cache(recipe).enabled,  # explicit: the engine's default where it may reuse
        },
    }
    if knobs.cap_value is not None:  # triton.kv_pool_gib_per_gpu: TensorRT-LLM takes the smaller of the two
        args["kv_cache_config"]["max_tokens"] = knobs.cap_value
    windows = max_attention_window(recipe)
    if windows is not None:
        args["kv_cache_config"]["max_attention_window"] = windows
    if b.mamba_ssm_cache_dtype != "auto":  # a linear-attention / Mamba layer's recurrent state: what the plan priced
        args["kv_cache_config"]["mamba_ssm_cache_dtype"] = b.mamba_ssm_cache_dtype
    return args


def model_yaml(recipe: Recipe, hf_dir: Path) -> dict[str, Any]:
    """tensorrt_llm/1/model.yaml: LLM() arguments + triton_config (max_batch_size 0: one prompt per request, the LLM
    batches in flight; decoupled from the recipe)."""
    return {**llm_args(recipe, hf_dir),
            "triton_config": {"max_batch_size": 0, "decoupled": recipe.triton.decoupled}}


def serve_config(recipe: Recipe) -> dict[str, Any]:
    """trtllm-serve's --extra_llm_api_options (--config) YAML: the LLM() arguments that have no flag of their own."""
    return {k: v for k, v in llm_args(recipe, Path()).items() if k not in ("model", *SERVE_FLAGS)}


def trtllm_serve_command(recipe: Recipe, hf_dir: Path, config: Path) -> list[str]:
    """`trtllm-serve` on the HF export: an OpenAI-compatible server (/v1/completions, /v1/chat/completions)."""
    b = recipe.build
    return [
        "trtllm-serve", str(hf_dir),
        "--backend", "pytorch",
        "--host", recipe.triton.host,
        "--port", str(recipe.triton.http_port),
        "--tp_size", str(b.tp_size),
        "--pp_size", str(b.pp_size),
        "--max_batch_size", str(b.max_batch_size),
        "--max_num_tokens", str(b.max_num_tokens),
        "--max_seq_len", str(b.max_seq_len),
        "--kv_cache_free_gpu_memory_fraction", f"{llmapi_memory_knobs(recipe).value:g}",
        # `--config` is the newer name of the same option (PR #9104, Nov 2025); --extra_llm_api_options is accepted
        # by every release, including the 1.0/1.1 images of trtkv's version matrix
        LLMAPI_OPTIONS_FLAG, str(config),
    ]


def _yaml_text(recipe: Recipe, data: dict[str, Any], what: str) -> str:
    return (f"# {what}, generated by trtkv for recipe {recipe.name}. Regenerate instead of editing.\n"
            f"# {BUILDER.kv_source_line(recipe)}\n" + yaml.safe_dump(data, sort_keys=False))



# ---------------------------------------------------------------------------------------------
# The backend's parts


def _hf(recipe: Recipe) -> Path:
    return checkpoint_dir(recipe) / HF


class LlmApiBuilder:
    sections = (*BUILD_SECTIONS, "triton", "hardware")  # the serve options, and which engine (CPU or GPU)

    def kv_source_line(self, recipe: Recipe) -> str:
        algo = kv_cache_quant_algo(recipe)
        return (f"KV cache: {algo or 'unquantized'}, from LLM() kv_cache_config.dtype = {kv_dtype(recipe)} and the HF "
                f"export's hf_quant_config.json kv_cache_quant_algo (per-layer k_scale/v_scale)")

    def prepare(self, recipe: Recipe) -> tuple[Path, dict[str, Any]]:
        from trtkv.checkpoints.hf_export import validate_hf_checkpoint
        from trtkv.contracts.stage import manifest_hash

        ckpt = checkpoint_dir(recipe)
        if manifest_hash(ckpt) is None:
            raise StageError(f"build {recipe.name}: {ckpt} is missing or incomplete (no manifest.json). Next: `trtkv "
                             f"calibrate {recipe.name}` (or `make engine RECIPE={recipe.name}`)")
        if not (ckpt / HF / "config.json").is_file():
            raise StageError(f"build {recipe.name}: {ckpt / HF} has no config.json: the llmapi backend serves the HF "
                             f"export that calibrate writes. Next: `trtkv calibrate {recipe.name} --force`")
        summary = validate_hf_checkpoint(ckpt, recipe)
        return ckpt, {"checkpoint": str(ckpt), "hf_validation": summary}

    def build(self, recipe: Recipe, ckpt: Path, tmp: Path, final: Path, info: dict[str, Any],
              log: Callable[[str], None]) -> dict[str, Any]:
        hf = ckpt / HF
        options = serve_config(recipe)
        (tmp / LLM_API_OPTIONS).write_text(_yaml_text(recipe, options, "trtllm-serve --extra_llm_api_options (or --config)"))
        at = served_artifacts(recipe)  # a GPU recipe's command runs in a container: /models/<recipe>/...
        cmd = trtllm_serve_command(recipe, at.hf, at.engine / LLM_API_OPTIONS)
        (tmp / SERVE_COMMAND).write_text(quote(cmd) + "\n")
        out: dict[str, Any] = {"backend": Backend.LLMAPI.value, "serve_command": cmd, "llm_api_options": options,
                               "llm_args": llm_args(recipe, hf)}
        if SERVING.serves_locally(recipe):  # load the HF export the way the served model will, and decode one token
            from trtkv.runtime.llm import LLM, SamplingParams

            llm = LLM(**llm_args(recipe, hf))
            try:
                first = llm.generate_async([llm.runtime.bos_token_id or 0], SamplingParams(max_tokens=1,
                                                                                           temperature=0)).result()
            finally:
                llm.shutdown()
            log(f"build: {CPU_MODULE}.LLM loaded {hf} (KV {llm.runtime.kv_format}); smoke token "
                f"{first.outputs[0].token_ids}")
            out.update(kv_format=llm.runtime.kv_format, smoke_token=first.outputs[0].token_ids)
        return out

    def dry_run_lines(self, recipe: Recipe, ckpt: Path, out: Path) -> list[str]:
        options = out / LLM_API_OPTIONS
        at = served_artifacts(recipe)
        lines = [f"  write {options} (trtllm-serve --extra_llm_api_options, newer name --config):"]
        lines += ["      " + line for line in yaml.safe_dump(serve_config(recipe), sort_keys=False).splitlines()]
        where = "" if at == host_artifacts(recipe) else f", in the container with the artifacts at {at.root}"
        lines.append(f"  serve command (saved to {out / SERVE_COMMAND}; an OpenAI-compatible server on a GPU "
                     f"host{where}):")
        lines += command_block(trtllm_serve_command(recipe, at.hf, at.engine / LLM_API_OPTIONS))
        if SERVING.serves_locally(recipe):
            lines.append(f"  then load {ckpt / HF} with {CPU_MODULE}.LLM (the CPU engine the Triton model uses "
                         f"here) and decode one token")
        return lines


class LlmApiLayout:
    """Upstream's `llmapi` layout (triton_backend/all_models/llmapi): one Python model, text in and text out."""

    name = "llmapi"
    interface = LLMAPI
    tokenizer = TokenizerSource.SERVED_MODEL  # the LLM loads the tokenizer of the HF checkpoint it serves
    shared_module = False  # one self-contained model (no shared module, no ensemble)

    def models(self) -> dict[str, tuple[str, str | None]]:
        return {"tensorrt_llm": ("llmapi/config.pbtxt", "llmapi/model.py")}

    def template_values(self, recipe: Recipe) -> dict[str, str]:
        return {"llm_step_model": "tensorrt_llm",
                "llm_module": CPU_MODULE if SERVING.serves_locally(recipe) else GPU_MODULE}

    def input(self, recipe: Recipe) -> tuple[Path, str]:
        return _hf(recipe), "calibrate"

    def files(self, recipe: Recipe) -> dict[str, str]:
        """Extra files of the repository (path -> text): the model's LLM() arguments."""
        return {f"tensorrt_llm/1/{MODEL_YAML}": _yaml_text(recipe, model_yaml(recipe, served_artifacts(recipe).hf),
                                                           "LLM() arguments for the Triton llmapi model")}

    def summary(self, recipe: Recipe) -> str:
        engine = ("trtkv's reference engine (`trtkv.runtime.llm`, CPU)" if SERVING.serves_locally(recipe)
                  else "`tensorrt_llm.LLM` (PyTorch backend)")
        return (f"Python model in TensorRT-LLM's llmapi layout on {engine}; LLM() arguments in "
                f"`tensorrt_llm/1/{MODEL_YAML}`, model `{served_artifacts(recipe).hf}`")

    def readme_lines(self, recipe: Recipe, tokenizer: str) -> list[str]:
        return [
            "TensorRT-LLM's `llmapi` layout (`triton_backend/all_models/llmapi`): one model, text in and text out.",
            "",
            "| file | what |",
            "|---|---|",
            f"| `tensorrt_llm/config.pbtxt` | upstream's tensors; max_batch_size 0, decoupled "
            f"{str(recipe.triton.decoupled).lower()}; parameter `llm_module` = the engine module |",
            f"| `tensorrt_llm/1/model.yaml` | `LLM()` arguments (model, backend pytorch, parallel sizes, "
            f"`kv_cache_config` with dtype `{kv_dtype(recipe)}`{_window_note(recipe)}, limits) + `triton_config` |",
            f"| `tensorrt_llm/1/model.py` | {self.summary(recipe)} |",
            "",
        ]

    def client_lines(self, recipe: Recipe) -> list[str]:
        t = recipe.triton
        body = '{"text_input": "The capital of France is", "sampling_param_max_tokens": 8}'
        stream_body = body[:-1] + ', "streaming": true}'
        return [
            "## Ask it something",
            "",
            "```",
            f"curl -s -X POST http://{t.host}:{t.http_port}/v2/models/tensorrt_llm/generate -d '{body}'",
            f"curl -s -N -X POST http://{t.host}:{t.http_port}/v2/models/tensorrt_llm/generate_stream -d '{stream_body}'",
            "```",
            "",
            f"gRPC (decoupled: {str(t.decoupled).lower()}) on {t.host}:{t.grpc_port}: model `tensorrt_llm`, upstream's "
            "llmapi tensors: `text_input` (BYTES [1]), `streaming` (BOOL [1]), `sampling_param_*` (`max_tokens`, "
            "`temperature`, `top_k`, `top_p`, `seed`, `stop`, `frequency_penalty`, `presence_penalty`, ...), "
            "`return_finish_reason` / `return_stop_reason`, and `stop` (true: cancel the requests sent with this "
            "request id). Output `text_output`: with streaming, each response holds the whole text so far (upstream's "
            "model does the same). `trtkv bench` detects this interface and benchmarks it.",
            "",
        ]

    def launch_lines(self, recipe: Recipe, ranks: int, row: Row | None, image: str) -> tuple[str, str]:
        engine = engine_dir(recipe)
        stack = (f"No engine: the LLM API loads the HF checkpoint directly, in this image (TensorRT-LLM "
                 f"{row.tensorrt_llm if row else '?'}) or any later one with `triton_backend/all_models/llmapi` "
                 f"(TensorRT-LLM 1.3+ has only this path). The OpenAI-compatible alternative, `trtllm-serve`, is in "
                 f"the build output: `{engine / SERVE_COMMAND}` with `--extra_llm_api_options "
                 f"{engine / LLM_API_OPTIONS}` (`--config` in newer releases); `trtkv serve "
                 f"{recipe.name} --trtllm-serve` runs it in the container.")
        mpi = (f"One tritonserver (launch_triton_server.py --world_size=1): the LLM API starts its own workers for "
               f"tensor_parallel_size {recipe.build.tp_size} x pipeline_parallel_size {recipe.build.pp_size} "
               f"(model.yaml).")
        return stack, mpi


class TrtllmServe:
    """TensorRT-LLM's OpenAI-compatible server on the HF export, with the build's --config: `trtkv serve
    --trtllm-serve`, and every multi-node or Slurm deployment of this backend (the Triton model has no multi-node)."""

    name = "trtllm-serve"
    label = "trtllm-serve"
    metrics_path = None  # no Prometheus endpoint
    # 200, or 503 when the LLM is unhealthy (tensorrt_llm/serve/openai_server.py register_routes/health @00057725)
    health_path = "/health"
    shm_gib = 2  # the Triton TensorRT-LLM image's docker --shm-size=2g (trtkv.serving.container)
    key_env = None  # no API key option
    ray = False
    non_root = False
    key_note = ("- trtllm-serve has no API key option: nothing but the network (the NetworkPolicy here, your cluster "
                "network on Slurm) fences it. Put an authenticating gateway in front of it if its clients are not "
                "trusted.")

    def image(self, recipe: Recipe) -> str | None:
        return None  # the Triton TensorRT-LLM image of the version matrix

    def command(self, recipe: Recipe, host: str, at: Artifacts | None = None) -> list[str]:
        """`at`: where the artifacts are (default: where the recipe's server reads them, a container's /models)."""
        at = at or served_artifacts(recipe)
        cmd = trtllm_serve_command(recipe, at.hf, at.engine / LLM_API_OPTIONS)
        cmd[cmd.index("--host") + 1] = host
        return cmd

    def node_command(self, recipe: Recipe, host: str) -> list[str]:
        return ["trtllm-llmapi-launch", *self.command(recipe, host)]

    def leader_command(self, recipe: Recipe, host: str, ranks: int) -> list[str]:
        return ["mpirun", "--allow-run-as-root", "-np", str(ranks), "trtllm-llmapi-launch", *self.command(recipe, host)]

    def reads(self, recipe: Recipe) -> list[Path]:
        return [_hf(recipe), engine_dir(recipe)]  # the HF export and the build's llm_api_options.yaml

    def served_model(self, recipe: Recipe, at: Artifacts | None = None) -> str:
        """trtllm-serve names the model by the path it loads (where that path is: `at`, default served_artifacts)."""
        return str((at or served_artifacts(recipe)).hf)

    def problem(self, recipe: Recipe) -> str | None:
        return None

    def here(self, recipe: Recipe, *, check: bool = True) -> tuple[list[str], dict[str, str]]:
        """trtllm-serve installed on this machine: the host's folders."""
        return self.command(recipe, recipe.triton.host, host_artifacts(recipe)), {}


class LlmApiServing(TritonServing):
    rank_processes = False  # one tritonserver: the LLM API starts its own workers
    openai = TrtllmServe()

    def require_input(self, recipe: Recipe) -> None:
        """The server loads the HF export of the checkpoint (no build output)."""
        from trtkv.contracts.stage import require_input

        ckpt = checkpoint_dir(recipe)
        require_input(ckpt, "serve", "calibrate", recipe)
        if not (ckpt / HF / "config.json").is_file():
            raise StageError(f"serve: {ckpt / HF} has no config.json: the llmapi backend serves the HF export that "
                             f"`trtkv calibrate` writes for an FP8, NVFP4 or no KV cache. Next: `trtkv calibrate "
                             f"{recipe.name} --force`.")


class LlmApiRunner(RefusingRunner):
    def describe_local_generate(self, recipe: Recipe, max_tokens: int, checkpoint: Path | None) -> str:
        return (f"{CPU_MODULE}.LLM on {checkpoint or checkpoint_dir(recipe) / HF} (the HF export; CPU, greedy, "
                f"{max_tokens} tokens)")

    def local_generate(self, recipe: Recipe, prompt: str, max_tokens: int, checkpoint: Path | None) -> str:
        from trtkv.runtime.llm import LLM, SamplingParams

        hf = Path(checkpoint) if checkpoint is not None else checkpoint_dir(recipe) / HF
        if not (hf / "config.json").is_file():
            raise StageError(f"{hf}: no config.json (the HF export). Next: `trtkv calibrate {recipe.name}`.")
        llm = LLM(**{**llm_args(recipe, hf), "model": str(hf)})
        try:
            return str(llm.generate_async(prompt, SamplingParams(max_tokens=max_tokens, temperature=0)).result()
                       .outputs[0].text)
        finally:
            llm.shutdown()

    def generate_job(self, recipe: Recipe, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
        return LLMAPI_RUNNER, {"llm_args": llm_args(recipe, checkpoint_dir(recipe) / HF), "prompt": prompt,
                               "max_tokens": max_tokens}


class LlmApiDynamo:
    """python3 -m dynamo.trtllm: the LLM API on the HF checkpoint, its LLM() arguments in a ConfigMap."""

    framework = "trtllm"
    component = "TrtllmWorker"
    runtime_image = "tensorrtllm-runtime"

    def args(self, recipe: Recipe, hf_dir: Path, role: str, config_dir: str) -> list[str]:
        return ["--model", str(hf_dir), "--served-model-name", recipe.name,
                "--extra-engine-args", f"{config_dir}/{role}.yaml"]

    def engine_config(self, recipe: Recipe, role: str) -> dict[str, Any] | None:
        """dynamo.trtllm --extra-engine-args: the recipe's LLM() arguments (TorchLlmArgs fields), minus the model
        path; prefill/decode workers add the KV cache transceiver (and prefill drops the overlap scheduler, as
        upstream's)."""
        cfg = {k: v for k, v in llm_args(recipe, Path()).items() if k != "model"}
        if role in ("prefill", "decode"):
            cfg["cache_transceiver_config"] = {"backend": "DEFAULT"}
        if role == "prefill":
            cfg["disable_overlap_scheduler"] = True
        return cfg


BUILDER = LlmApiBuilder()
SERVING = LlmApiServing()
def llmapi_memory_knobs(recipe: Recipe) -> EngineKnobs:
    """kv_cache_config.free_gpu_memory_fraction, and kv_cache_config.max_tokens when triton.kv_pool_gib_per_gpu caps."""
    return trtllm_knobs(recipe, "kv_cache_config.free_gpu_memory_fraction", "kv_cache_config.max_tokens")


BACKEND = EngineBackend(Backend.LLMAPI, BUILDER, LlmApiLayout(), SERVING, LlmApiRunner(), LlmApiDynamo(),
                        memory=MemoryRule("trtllm", llmapi_memory_knobs, served=trtllm_served))
