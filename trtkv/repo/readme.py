"""The README written into each generated repository: what is in it and the exact deploy commands."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from trtkv.backends import for_recipe, llmapi
from trtkv.core.errors import StageError
from trtkv.core.tools import quote
from trtkv.platform import versions
from trtkv.serving import container, serve

if TYPE_CHECKING:
    from trtkv.repo.plan import RepoPlan


def _llmapi_client_lines(plan: RepoPlan) -> list[str]:
    t = plan.recipe.triton
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
        "`return_finish_reason` / `return_stop_reason`, and `stop` (true: cancel the requests sent with this request "
        "id). Output `text_output`: with streaming, each response holds the whole text so far (upstream's model "
        "does the same). `trtkv bench` detects this interface and benchmarks it.",
        "",
    ]


def _client_lines(plan: RepoPlan) -> list[str]:
    if for_recipe(plan.recipe).repo_layout == "llmapi":
        return _llmapi_client_lines(plan)
    t = plan.recipe.triton
    body = '{"text_input": "The capital of France is", "max_tokens": 8, "bad_words": "", "stop_words": ""}'
    stream_body = body[:-1] + ', "stream": true}'
    return [
        "## Ask it something",
        "",
        "```",
        f"curl -s -X POST http://{t.host}:{t.http_port}/v2/models/ensemble/generate -d '{body}'",
        f"curl -s -N -X POST http://{t.host}:{t.http_port}/v2/models/ensemble/generate_stream -d '{stream_body}'",
        "```",
        "",
        f"gRPC streaming (decoupled) on {t.host}:{t.grpc_port}: model `ensemble`, inputs `text_input` (BYTES, "
        "shape [1, 1]), `max_tokens` (INT32 [1, 1]), `stream` (BOOL [1, 1]) and optionally `temperature`, `top_k`, "
        "`top_p`, `seed`, `end_id`, `pad_id`, `stop_words`, `bad_words`; output `text_output`. Streamed responses "
        "carry only the new text. `trtkv bench` is such a client.",
        "",
    ]


def _layout_lines(plan: RepoPlan) -> list[str]:
    r = plan.recipe
    llm = for_recipe(r).repo_summary(r)
    if for_recipe(r).repo_layout == "llmapi":
        return [
            "TensorRT-LLM's `llmapi` layout (`triton_backend/all_models/llmapi`): one model, text in and text out.",
            "",
            "| file | what |",
            "|---|---|",
            f"| `tensorrt_llm/config.pbtxt` | upstream's tensors; max_batch_size 0, decoupled "
            f"{str(r.triton.decoupled).lower()}; parameter `llm_module` = the engine module |",
            f"| `tensorrt_llm/1/model.yaml` | `LLM()` arguments (model, backend pytorch, parallel sizes, "
            f"`kv_cache_config` with dtype `{llmapi.kv_dtype(r)}`, limits) + `triton_config` |",
            f"| `tensorrt_llm/1/model.py` | {llm} |",
            "",
        ]
    tokenizer = f"`{plan.tokenizer_ref}/` (copied in)" if plan.tokenizer_source else f"`{plan.tokenizer_ref}`"
    return [
        "| model | what |",
        "|---|---|",
        f"| `preprocessing` | Python: text -> `input_ids`, `input_lengths`, `request_output_len`, end/pad ids, "
        f"stop/bad words; tokenizer {tokenizer} |",
        f"| `tensorrt_llm` | {llm}; decoupled: {str(r.triton.decoupled).lower()} |",
        "| `postprocessing` | Python: token ids -> text |",
        "| `ensemble` | platform `ensemble`: preprocessing -> tensorrt_llm -> postprocessing |",
        "",
    ]


GENERIC_TRITONSERVER = "<site-packages>/pytriton/tritonserver/bin/tritonserver"


def _local_command_text(plan: RepoPlan) -> str:
    """The bundled tritonserver command; with a generic binary path where nvidia-pytriton is not installed."""
    r = plan.recipe
    backends = serve.serve_dir(r) / "backends"
    try:
        return quote(serve.local_command(r, plan.output, backends))
    except StageError:
        t = r.triton
        return quote([GENERIC_TRITONSERVER, f"--model-repository={plan.output}", f"--backend-directory={backends}",
                      f"--http-address={t.host}", f"--http-port={t.http_port}", f"--grpc-address={t.host}",
                      f"--grpc-port={t.grpc_port}", f"--metrics-address={t.host}", f"--metrics-port={t.metrics_port}",
                      "..."]) + "   # nvidia-pytriton is not installed here: `make install` puts it in the venv"


def _chunked_lines(plan: RepoPlan) -> list[str]:
    """Backend-specific notes (the engine path's chunked-context setting)."""
    return for_recipe(plan.recipe).repo_notes(plan.recipe)


def _deploy_lines(plan: RepoPlan) -> list[str]:
    r = plan.recipe
    repo = plan.output
    backend = for_recipe(r)
    if backend.serves_locally(r):
        return [
            "## Deploy (CPU, the tritonserver bundled in nvidia-pytriton)",
            "",
            "```",
            f"make serve RECIPE={r.name}      # or: trtkv serve {r.name}",
            f"make stop RECIPE={r.name}       # or: trtkv stop {r.name}",
            "```",
            "",
            "What `trtkv serve` runs (it also links the Python backend into "
            f"`{serve.serve_dir(r) / 'backends'}` first):",
            "",
            "```",
            f"PATH={sys.prefix}/bin:$PATH LD_LIBRARY_PATH={serve.python_libdir()} \\",
            f"  {_local_command_text(plan)}",
            "```",
            "",
        ]
    ranks = backend.ranks(r)
    mpi = (f"tp_size x pp_size = {r.world_size}: one tritonserver per rank under `mpirun`."
           if ranks > 1 else "One GPU rank: a single tritonserver.")
    if backend.repo_layout == "llmapi":
        mpi = (f"One tritonserver (launch_triton_server.py --world_size=1): the LLM API starts its own workers for "
               f"tensor_parallel_size {r.build.tp_size} x pipeline_parallel_size {r.build.pp_size} (model.yaml).")
    image = container.container_image(r)
    row = versions.row_for_tag(versions.image_tag(image) or "")
    stack = (f"The image ships TensorRT-LLM {row.tensorrt_llm} and TensorRT {row.tensorrt} (trtkv's version matrix, "
             f"`trtkv/data/trtllm_versions.json`); an engine runs only under the TensorRT-LLM/TensorRT that built it."
             if row else
             f"`{image}` is not in trtkv's version matrix: check that it ships the TensorRT-LLM that built the engine.")
    if backend.repo_layout == "llmapi":
        stack = (f"No engine: the LLM API loads the HF checkpoint directly, in this image (TensorRT-LLM "
                 f"{row.tensorrt_llm if row else '?'}) or any later one with `triton_backend/all_models/llmapi` "
                 f"(TensorRT-LLM 1.3+ has only this path). The OpenAI-compatible alternative, `trtllm-serve`, is in "
                 f"the build output: `{plan.engine_dir / 'serve_command.txt'}` with `--extra_llm_api_options "
                 f"{plan.engine_dir / 'llm_api_options.yaml'}` (`--config` in newer releases); `trtkv serve "
                 f"{r.name} --trtllm-serve` runs it in the container.")
    return [
        f"## Deploy ({r.hardware.count} x {r.hardware.gpu.value}, container `{image}`)",
        "",
        stack,
        "",
        mpi + " The engine folder and this repository are mounted at the same paths inside the container, so "
        "the paths in the configs hold on both sides.",
        "",
        "```",
        f"trtkv serve {r.name}             # runs the command below (or prints it: --dry-run)",
        container.shell_block(container.docker_command(r, repo)),
        "```",
        "",
        "Inside the container (already running it), the same launch:",
        "",
        "```",
        container.shell_block(container.gpu_command(r, repo)),
        f"# or, with the backend's script: {quote(container.launch_script_command(r, repo))}",
        "```",
        "",
        f"Ports: HTTP {r.triton.http_port}, gRPC {r.triton.grpc_port}, metrics {r.triton.metrics_port}.",
        "",
    ]


def readme_text(plan: RepoPlan) -> str:
    r = plan.recipe
    lines = [
        f"# Triton model repository for `{r.name}`",
        "",
        f"Generated by `trtkv repo {r.name}` from `{r.path}`. Backend `{r.build.backend.value}`, weights "
        f"`{r.quantization.weights.value}`, KV cache `{r.quantization.kv_cache.value}`, max batch "
        f"{r.build.max_batch_size}, max_seq_len {r.build.max_seq_len}. Regenerate instead of editing: "
        f"`trtkv repo {r.name} --force`.",
        "",
        *_layout_lines(plan),
        *_chunked_lines(plan),
    ]
    if plan.warnings:
        lines += ["Not there yet when this was generated:", "", *[f"- {w}" for w in plan.warnings], ""]
    lines += [*_deploy_lines(plan), *_client_lines(plan)]
    return "\n".join(lines)
