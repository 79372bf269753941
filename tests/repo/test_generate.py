"""`trtkv repo`: every shipped recipe generates a repository that Triton's own schema accepts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from trtkv.backends import for_recipe
from trtkv.core.errors import StageError
from trtkv.engines.trtllm import engine_memory_knobs
from trtkv.recipe import Backend, list_recipes, load_recipe
from trtkv.repo import generate_repo, validate_repo
from trtkv.repo.validate import RepoError

# vLLM and SGLang serve their own OpenAI servers: no Triton repository
RECIPES = [p.stem for p in list_recipes() if for_recipe(load_recipe(p.stem)).repo is not None]
CONTRACT_INPUTS = {"text_input": "TYPE_STRING", "max_tokens": "TYPE_INT32", "stream": "TYPE_BOOL",
                   "temperature": "TYPE_FP32", "top_k": "TYPE_INT32", "top_p": "TYPE_FP32", "end_id": "TYPE_INT32",
                   "pad_id": "TYPE_INT32", "stop_words": "TYPE_STRING", "bad_words": "TYPE_STRING"}


@pytest.fixture(scope="module")
def tokenizer_ready(smollm2_dir: Path) -> Path:
    """The CPU recipes copy SmolLM2's tokenizer in; make sure the model folder exists."""
    return smollm2_dir


def _generate(name: str, overrides: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
    logs: list[str] = []
    result = generate_repo(load_recipe(name, overrides), log=logs.append)
    return result.output, logs


def test_vllm_recipes_have_no_triton_repository(engines_tmp: Path) -> None:
    with pytest.raises(StageError, match="backend vllm has no Triton repository: vLLM serves the HF export itself"):
        generate_repo(load_recipe("smollm2_fp8kv_vllm"), log=lambda _m: None)


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_generates_a_valid_repo(name: str, engines_tmp: Path, tokenizer_ready: Path) -> None:
    recipe = load_recipe(name)
    repo, logs = _generate(name)
    models = validate_repo(repo, expect_decoupled=recipe.triton.decoupled)
    if recipe.build.backend is Backend.LLMAPI:  # upstream's llmapi layout: one model (tests/backends/test_llmapi.py)
        assert set(models) == {"tensorrt_llm"} and (repo / "tensorrt_llm" / "1" / "model.yaml").is_file()
        assert models["tensorrt_llm"].config.model_transaction_policy.decoupled is recipe.triton.decoupled
        readme = (repo / "README.md").read_text()
        local = recipe.hardware.gpu.value == "cpu"
        served = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())["model"]
        assert served == (str(engines_tmp / name / "checkpoint" / "hf") if local else f"/models/{name}/checkpoint/hf")
        assert ("make serve" in readme) if local else ("docker run" in readme and "--world_size=1" in readme)
        return
    expected = {"preprocessing", "tensorrt_llm", "postprocessing", "ensemble"}
    if recipe.build.backend is Backend.TENSORRT:  # the C++ model streams tokens; this BLS model re-cuts them
        expected.add("tensorrt_llm_stream")
    assert set(models) == expected
    for config in repo.glob("*/config.pbtxt"):
        assert "${" not in config.read_text(), config
    ensemble = models["ensemble"].config
    from tritonclient.grpc import model_config_pb2

    dtypes = {t.name: model_config_pb2.DataType.Name(t.data_type) for t in ensemble.input}
    assert {k: dtypes.get(k) for k in CONTRACT_INPUTS} == CONTRACT_INPUTS
    assert [t.name for t in ensemble.output][0] == "text_output"
    llm = models["tensorrt_llm"].config
    params = {k: v.string_value for k, v in llm.parameters.items()}
    if recipe.build.backend is Backend.TENSORRT:
        assert llm.backend == "tensorrtllm"
        assert params["gpt_model_type"] == recipe.triton.batching_strategy.value
        assert params["batch_scheduler_policy"] == recipe.triton.batch_scheduler_policy.value
        knobs = engine_memory_knobs(recipe)  # the plan's value: TensorRT-LLM's 0.9 when the recipe is silent
        assert float(params["kv_cache_free_gpu_mem_fraction"]) == knobs.value
        assert params["max_tokens_in_paged_kv_cache"] == ("" if knobs.cap_value is None else str(knobs.cap_value))
        # the container reads the repository: the configs name the canonical container paths, never this host's
        assert params["gpt_model_path"] == f"/models/{name}/engine"
        assert params["tokenizer_dir"] == f"/models/{name}/checkpoint/tokenizer"
        assert not any(str(engines_tmp) in c.read_text() for c in repo.glob("*/config.pbtxt"))
        assert {"enable_kv_cache_reuse", "exclude_input_in_output", "max_beam_width"} <= set(params)
        # prefix caching as the engine ships it (on), off with the reason for INT8 KV (no paged context FMHA)
        assert params["enable_kv_cache_reuse"] == ("false" if recipe.quantization.kv_cache.value == "int8" else "true")
        chunked = recipe.build.max_input_len > recipe.build.max_num_tokens
        assert params["enable_chunked_context"] == str(chunked).lower()
        assert f"`enable_chunked_context` is {str(chunked).lower()}" in (repo / "README.md").read_text()
    else:
        assert llm.backend == "python" and (repo / "tensorrt_llm" / "1" / "model.py").is_file()
    assert llm.model_transaction_policy.decoupled is recipe.triton.decoupled
    assert llm.max_batch_size == recipe.build.max_batch_size
    readme = (repo / "README.md").read_text()
    assert str(recipe.triton.http_port) in readme and str(recipe.triton.grpc_port) in readme
    if recipe.build.backend is Backend.REFERENCE:
        assert (repo / "preprocessing" / "tokenizer" / "tokenizer.json").is_file()
        assert "make serve" in readme
    else:
        assert "docker run" in readme and "nvcr.io/nvidia/tritonserver" in readme
        assert any("does not exist yet" in line for line in logs)  # no engine on this machine: warned
        if recipe.build.backend is Backend.TENSORRT and recipe.world_size > 1:
            assert readme.count("-n 1 /opt/tritonserver/bin/tritonserver") >= recipe.world_size
            assert f"--world_size={recipe.world_size}" in readme


def test_second_run_is_up_to_date_and_force_regenerates(engines_tmp: Path) -> None:
    _generate("llama8b_fp8kv")
    _, logs = _generate("llama8b_fp8kv")
    assert any("up to date" in line for line in logs)
    result = generate_repo(load_recipe("llama8b_fp8kv"), force=True, log=lambda _m: None)
    assert not result.skipped


def test_a_repository_naming_a_moved_trtkv_module_is_rebuilt(engines_tmp: Path, tokenizer_ready: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference repository names `trtkv.runtime` (and the llmapi one `trtkv.runtime.llm`): when a module it names
    resolves to another file (moved in an upgrade) or to none, the repo stage's key changes and the repository is
    rewritten, never reported up to date with a dead module path inside."""
    import importlib.util

    from trtkv.repo import generate

    plan = generate.plan_repo(load_recipe("smollm2_fp8kv_llmapi"))
    assert generate.named_modules(plan) == {"trtkv.kvcache.formats": "kvcache/formats.py",  # the served pool's line
                                            "trtkv.runtime": "runtime/__init__.py", "trtkv.runtime.llm": "runtime/llm.py",
                                            "trtkv.runtime.block_reuse": "runtime/block_reuse.py"}  # the prefix cache
    _generate("smollm2_fp8kv_llmapi")
    _, logs = _generate("smollm2_fp8kv_llmapi")
    assert any("up to date" in line for line in logs)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trtkv.runtime.llm" else real(name, *a))
    assert generate.named_modules(plan)["trtkv.runtime.llm"] == "missing"
    _, logs = _generate("smollm2_fp8kv_llmapi")
    assert not any("up to date" in line for line in logs)


def test_recipe_values_reach_the_configs(engines_tmp: Path, tokenizer_ready: Path) -> None:
    repo, _ = _generate("smollm2_fp8kv", ("triton.instance_count=1", "build.max_batch_size=3",
                                          "triton.decoupled=false"))
    models = validate_repo(repo, expect_decoupled=False)
    llm = models["tensorrt_llm"].config
    assert llm.instance_group[0].count == 1 and llm.max_batch_size == 3
    assert not llm.model_transaction_policy.decoupled


@pytest.fixture()
def repo_copy(engines_tmp: Path, tmp_path: Path) -> Path:
    repo, _ = _generate("llama8b_fp8kv")
    copy = tmp_path / "broken"
    shutil.copytree(repo, copy)
    return copy


def _edit(path: Path, old: str, new: str) -> int:
    """Replace the first `old`; returns its 1-based line."""
    text = path.read_text()
    index = text.index(old)
    path.write_text(text.replace(old, new, 1))
    return text[:index].count("\n") + 1


def _problems(repo: Path, **kwargs: object) -> str:
    with pytest.raises(RepoError) as info:
        validate_repo(repo, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


def test_typo_names_file_line_and_field(repo_copy: Path) -> None:
    config = repo_copy / "tensorrt_llm" / "config.pbtxt"
    line = _edit(config, "data_type: TYPE_INT32", "data_typ: TYPE_INT32")
    message = _problems(repo_copy)
    assert f"{config}:{line}:" in message and "data_typ" in message


def test_unfilled_placeholder_is_named(repo_copy: Path) -> None:
    config = repo_copy / "preprocessing" / "config.pbtxt"
    line = _edit(config, "max_batch_size: 128", "max_batch_size: ${triton_max_batch_size}")
    message = _problems(repo_copy)
    assert f"{config}:{line}: placeholder" in message and "${triton_max_batch_size}" in message


def test_ensemble_dtype_mismatch_is_named(repo_copy: Path) -> None:
    _edit(repo_copy / "preprocessing" / "config.pbtxt", '{ name: "INPUT_ID" data_type: TYPE_INT32',
          '{ name: "INPUT_ID" data_type: TYPE_INT64')
    ensemble = repo_copy / "ensemble" / "config.pbtxt"
    line = next(i for i, t in enumerate(ensemble.read_text().splitlines(), 1) if '"input_ids"' in t)
    message = _problems(repo_copy)
    assert f"{ensemble}:{line}: step tensorrt_llm_stream input_map input_ids: dtype TYPE_INT64" in message


def test_ensemble_dims_and_missing_names_are_named(repo_copy: Path) -> None:
    ensemble = repo_copy / "ensemble" / "config.pbtxt"
    _edit(repo_copy / "postprocessing" / "config.pbtxt", '{ name: "SEQUENCE_LENGTH" data_type: TYPE_INT32 dims: [ -1 ]',
          '{ name: "SEQUENCE_LENGTH" data_type: TYPE_INT32 dims: [ -1, 2 ]')
    _edit(ensemble, 'key: "runtime_top_k"', 'key: "top_k_typo"')
    _edit(ensemble, 'input_map { key: "input_lengths" value: "_REQUEST_INPUT_LEN" }', "")
    message = _problems(repo_copy)
    assert "dims [-1] of 'sequence_length' do not match [-1, 2]" in message
    assert "tensorrt_llm_stream has no input 'top_k_typo'" in message
    assert "required input 'input_lengths' of tensorrt_llm_stream is not mapped" in message


def test_missing_model_and_decoupled_mismatch(repo_copy: Path) -> None:
    shutil.rmtree(repo_copy / "postprocessing")
    message = _problems(repo_copy, expect_decoupled=False)
    assert "calls 'postprocessing', which is not in the repository" in message
    assert "model_transaction_policy.decoupled: True but the recipe's triton.decoupled is False" in message


def test_check_cli_reports_the_problem(repo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    assert main(["repo", "--check", str(repo_copy)]) == 0
    _edit(repo_copy / "ensemble" / "config.pbtxt", 'platform: "ensemble"', 'platfrom: "ensemble"')
    assert main(["repo", "--check", str(repo_copy)]) == 2
    assert "platfrom" in capsys.readouterr().err


def test_chunked_context_follows_max_num_tokens(engines_tmp: Path) -> None:
    """The batch manager rejects a context longer than max_num_tokens unless chunking is on."""
    repo, _ = _generate("llama70b_fp8kv", ("build.max_num_tokens=8192",))
    text = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'key: "enable_chunked_context" value: { string_value: "true" }' in text
    repo, _ = _generate("llama70b_int8kv")  # max_input_len == max_num_tokens: no chunking needed
    assert 'key: "enable_chunked_context" value: { string_value: "false" }' in (
        repo / "tensorrt_llm" / "config.pbtxt").read_text()


def test_readme_without_nvidia_pytriton_shows_a_generic_path(engines_tmp: Path, tokenizer_ready: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.backends import bundled
    from trtkv.core.errors import StageError

    def missing() -> Path:
        raise StageError("the tritonserver bundled in nvidia-pytriton is not installed")

    monkeypatch.setattr(bundled, "bundled_triton", missing)
    repo, _ = _generate("smollm2_fp8kv")
    readme = (repo / "README.md").read_text()
    assert "<site-packages>/pytriton/tritonserver/bin/tritonserver" in readme and "make install" in readme
