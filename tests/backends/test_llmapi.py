"""The LLM API path without a server: recipes, the llmapi repository layout against upstream's lists (test data with
their source commits), the build outputs, NVFP4 in the planner, and trtkv's CPU `LLM` on the session's HF export."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from trtkv.backends import llmapi_args, llmapi_serve
from trtkv.kvcache.formats import kv_bytes_per_token
from trtkv.plan.planner import plan as plan_memory
from trtkv.recipe import Backend, load_recipe
from trtkv.repo import generate_repo

DATA = Path(__file__).resolve().parents[1] / "data"
UPSTREAM_TENSORS = json.loads((DATA / "llmapi_tensors.json").read_text())
LLM_ARGS = json.loads((DATA / "llm_args_fields.json").read_text())
DTYPES = {v: k for k, v in model_config_pb2.DataType.items()}


def _tensors(items) -> list[tuple[str, str, list[int], bool]]:  # noqa: ANN001
    return [(t.name, DTYPES[t.data_type], list(t.dims), bool(getattr(t, "optional", False))) for t in items]


def test_pytorch_is_an_alias_of_llmapi() -> None:
    recipe = load_recipe("llama8b_fp8kv_pytorch")
    assert recipe.build.backend is Backend.LLMAPI and recipe.resolved()["build"]["backend"] == "llmapi"


@pytest.mark.parametrize("name", ["llama70b_fp8kv_llmapi", "llama70b_nvfp4kv", "smollm2_fp8kv_llmapi",
                                  "llama8b_fp8kv_pytorch"])
def test_every_generated_llm_argument_exists_upstream(name: str) -> None:
    recipe = load_recipe(name)
    data = llmapi_args.model_yaml(recipe, Path("/models/hf"))
    triton = data.pop("triton_config")
    assert set(triton) == {"max_batch_size", "decoupled"}
    unknown = sorted(set(data) - set(LLM_ARGS["llm_args"]))
    assert unknown == [], f"not LLM() arguments at {LLM_ARGS['source']['commit']}: {unknown}"
    kv = data["kv_cache_config"]
    assert sorted(set(kv) - set(LLM_ARGS["kv_cache_config"])) == []
    assert kv["dtype"] in LLM_ARGS["kv_cache_config_dtype_values"]
    serve_keys = set(llmapi_serve.serve_config(recipe)) | set(llmapi_serve.SERVE_FLAGS)
    assert serve_keys <= set(LLM_ARGS["llm_args"])


def test_sliding_window_hybrid_gets_tensorrt_llms_per_layer_windows() -> None:
    """Gemma 3 on the llmapi layout: kv_cache_config.max_attention_window = 5 x 512 + max_seq_len (repeated over the 18
    layers, as upstream's Gemma 3 VSWA example writes it), so TensorRT-LLM's cache holds what the planner counts; a
    model without sliding layers gets none."""
    recipe = load_recipe("gemma3_fp8kv", ["build.backend=llmapi"])
    kv = llmapi_args.model_yaml(recipe, Path("/models/hf"))["kv_cache_config"]
    assert kv["max_attention_window"] == [512] * 5 + [32768] and "max_attention_window" in LLM_ARGS["kv_cache_config"]
    assert llmapi_serve.serve_config(recipe)["kv_cache_config"]["max_attention_window"] == [512] * 5 + [32768]
    short = load_recipe("gemma3_fp8kv", ["build.backend=llmapi", "build.max_seq_len=4096", "build.max_input_len=4000",
                                         "bench.needle_context_lengths=[2048]"])
    assert llmapi_args.max_attention_window(short) == [512] * 5 + [4096]
    assert llmapi_args.max_attention_window(load_recipe("smollm2_fp8kv_llmapi")) is None


def test_repo_writes_upstreams_llmapi_layout(engines_tmp: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv_llmapi")
    result = generate_repo(recipe, log=lambda _m: None)
    repo = result.output
    files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file())
    assert files == ["README.md", "manifest.json", "tensorrt_llm/1/model.py", "tensorrt_llm/1/model.yaml",
                     "tensorrt_llm/config.pbtxt"]
    config = text_format.Parse((repo / "tensorrt_llm/config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    upstream_in = [(t["name"], t["data_type"], t["dims"], t["optional"]) for t in UPSTREAM_TENSORS["inputs"]]
    upstream_out = [(t["name"], t["data_type"], t["dims"], False) for t in UPSTREAM_TENSORS["outputs"]]
    assert _tensors(config.input) == upstream_in
    assert _tensors(config.output) == upstream_out
    assert config.backend == "python" and config.max_batch_size == 0 and config.model_transaction_policy.decoupled
    assert config.parameters["llm_module"].string_value == "tensorrt_llm"
    model = yaml.safe_load((repo / "tensorrt_llm/1/model.yaml").read_text())
    assert model["kv_cache_config"]["dtype"] == "fp8" and model["backend"] == "pytorch"
    assert model["tensor_parallel_size"] == 4 and model["model"].endswith("llama70b_fp8kv_llmapi/checkpoint/hf")
    assert model["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    readme = (repo / "README.md").read_text()
    assert "launch_triton_server.py" in readme and "sampling_param_max_tokens" in readme


def test_nvfp4_recipe_model_yaml_and_plan() -> None:
    recipe = load_recipe("llama70b_nvfp4kv")
    assert llmapi_args.model_yaml(recipe, Path("/m"))["kv_cache_config"]["dtype"] == "nvfp4"
    plan = plan_memory(recipe)
    row = next(f for f in plan.formats if f.format == plan.recipe_kv_format == "nvfp4")
    assert row.bytes_per_token == 80 * 8 * 128 * 2 * (0.5 + 1 / 16) == 92160
    assert kv_bytes_per_token(30, 3, 64, "nvfp4") == 6480  # SmolLM2, what `trtkv probe` reports


def test_serve_config_and_command() -> None:
    recipe = load_recipe("llama70b_fp8kv_llmapi")
    cmd = llmapi_serve.trtllm_serve_command(recipe, Path("/m/hf"), Path("/e/llm_api_options.yaml"))
    assert cmd[:2] == ["trtllm-serve", "/m/hf"]
    assert cmd[cmd.index("--extra_llm_api_options") + 1] == "/e/llm_api_options.yaml"  # = --config in newer releases
    assert cmd[cmd.index("--tp_size") + 1] == "4"
    # prefix caching as TensorRT-LLM ships it (KvCacheConfig.enable_block_reuse True), said explicitly
    assert llmapi_serve.serve_config(recipe) == {"max_input_len": 16384, "enable_chunked_prefill": True, "kv_cache_config": {
        "dtype": "fp8", "free_gpu_memory_fraction": 0.9, "enable_block_reuse": True}}
    off = load_recipe("llama70b_fp8kv_llmapi", ["triton.enable_kv_cache_reuse=false"])
    assert llmapi_serve.serve_config(off)["kv_cache_config"]["enable_block_reuse"] is False


# ---------------------------------------------------------------------------------------------------------------
# trtkv.runtime.llm on the HF export (the engine the Triton model runs on the CPU)


@pytest.fixture(scope="module")
def cpu_llm(smollm2_engine: Path):  # noqa: ANN201
    from trtkv.runtime.llm import LLM

    llm = LLM(model=str(smollm2_engine / "checkpoint" / "hf"), backend="pytorch", tensor_parallel_size=1,
              kv_cache_config={"dtype": "fp8", "free_gpu_memory_fraction": 0.9}, max_seq_len=4096)
    yield llm
    llm.shutdown()


@pytest.mark.slow
def test_cpu_llm_reads_the_hf_export_like_tensorrt_llm(cpu_llm, smollm2_engine: Path) -> None:  # noqa: ANN001
    rt = cpu_llm.runtime
    # TensorRT-LLM's PyTorch backend: FP8 KV with scale 1.0, the exported k_scale/v_scale unused (NVFP4 only)
    assert (rt.kv_format, rt.kv_scales) == ("fp8_scale1", None)
    assert "tensor_parallel_size" in cpu_llm.ignored_args
    # the same numerics as the engine path's checkpoint (its FP8 kv_cache_scaling_factor is clamped to >= 1.0; SmolLM2's
    # K/V stay far below 448, so it is 1.0 in every layer): the same greedy tokens
    from trtkv.runtime import ReferenceRuntime

    engine = ReferenceRuntime.load(smollm2_engine / "engine")
    assert set(engine.kv_scales) == {1.0}
    ids = rt.tokenizer("The capital of France is")["input_ids"]
    assert rt.generate(ids, max_tokens=12) == engine.generate(ids, max_tokens=12)


@pytest.mark.slow
def test_cpu_llm_streams_stops_and_aborts(cpu_llm) -> None:  # noqa: ANN001
    from trtkv.runtime.llm import SamplingParams

    greedy = SamplingParams(max_tokens=8, temperature=0)
    full = cpu_llm.generate_async("The capital of France is", greedy).result()
    assert full.outputs[0].text.startswith(" Paris") and full.outputs[0].finish_reason == "length"

    async def stream() -> tuple[list[str], list[str]]:
        out = cpu_llm.generate_async("The capital of France is", greedy, streaming=True)
        diffs, texts = [], []
        async for item in out:
            diffs.append(item.outputs[0].text_diff)
            texts.append(item.outputs[0].text)
        return diffs, texts

    diffs, texts = asyncio.run(stream())
    assert "".join(diffs) == full.outputs[0].text == texts[-1] and len(diffs) >= 4
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # each snapshot extends the previous one
    stopped = cpu_llm.generate_async("The capital of France is", SamplingParams(max_tokens=8, temperature=0,
                                                                                 stop=["."])).result()
    assert stopped.outputs[0].text == " Paris" and (stopped.outputs[0].finish_reason, stopped.outputs[0].stop_reason) \
        == ("stop", ".")
    echoed = cpu_llm.generate_async("Hi", SamplingParams(max_tokens=2, temperature=0,
                                                         exclude_input_from_output=False)).result()
    assert echoed.outputs[0].text.startswith("Hi")

    async def abort_after_two() -> tuple[str | None, int]:
        out = cpu_llm.generate_async("Once upon a time", SamplingParams(max_tokens=64, temperature=0), streaming=True)
        seen = 0
        async for _ in out:
            seen += 1
            if seen == 2:
                out.abort()
        return out.outputs[0].finish_reason, len(out.outputs[0].token_ids)

    reason, tokens = asyncio.run(abort_after_two())
    assert reason == "cancelled" and tokens < 64
    with pytest.raises(ValueError, match="one sequence per request"):
        cpu_llm.generate_async("x", SamplingParams(best_of=2))


def test_nvfp4_calibration_uses_modelopts_preset() -> None:
    from trtkv.calibrate.modelopt_export import build_quant_cfg

    cfg, _notes = build_quant_cfg(load_recipe("llama70b_nvfp4kv"))
    kv = [e for e in cfg["quant_cfg"] if e.get("quantizer_name") == "*[kv]_bmm_quantizer"]
    assert kv and kv[-1]["cfg"]["num_bits"] == [2, 1]  # E2M1
    blocks = kv[-1]["cfg"]["block_sizes"]  # JSON round trip: the axis key is the string "-1"
    assert blocks["scale_bits"] == [4, 3] and blocks["-1"] == 16 and blocks["type"] == "dynamic"


def test_trtllm_serve_dry_run_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.core.errors import StageError
    from trtkv.serving import serve

    serve.start(load_recipe("llama70b_fp8kv_llmapi"), dry_run=True, trtllm_serve=True)
    out = capsys.readouterr().out
    assert "docker run" in out and "trtllm-serve" in out and "--host 0.0.0.0" in out and "-p 127.0.0.1:8000:8000" in out
    with pytest.raises(StageError, match="build.backend tensorrt"):
        serve.start(load_recipe("llama70b_fp8kv"), dry_run=True, trtllm_serve=True)
    with pytest.raises(StageError, match="runs on the CPU"):
        serve.start(load_recipe("smollm2_fp8kv_llmapi"), dry_run=True, trtllm_serve=True)
