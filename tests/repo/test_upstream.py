"""Generated configs against lists read from upstream at a named commit (tests/data, sources in their headers):
the C++ `tensorrt_llm` model's parameters, its tensors, and the ensemble's inputs and outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.backends import for_recipe
from trtkv.recipe import Backend, list_recipes, load_recipe
from trtkv.repo import generate_repo, validate_repo

DATA = Path(__file__).resolve().parents[1] / "data"
# the recipes with the inflight_batcher_llm layout (the llmapi layout is checked against its own upstream list in
# tests/backends/test_llmapi.py)
RECIPES = [p.stem for p in list_recipes()  # the ensemble layout's recipes (llmapi: one model; vLLM/SGLang: no repository)
           if for_recipe(load_recipe(p.stem)).layout == "ensemble"]


def upstream_parameters() -> list[str]:
    lines = (DATA / "triton_tensorrt_llm_parameters.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def upstream_io(name: str) -> dict[str, dict[str, tuple[str, list[int], str]]]:
    """{"input"|"output": {tensor: (data_type, dims, optional)}} from a tests/data TSV."""
    out: dict[str, dict[str, tuple[str, list[int], str]]] = {"input": {}, "output": {}}
    for line in (DATA / name).read_text().splitlines():
        if line and not line.startswith("#"):
            kind, tensor, dtype, dims, optional = line.split("\t")
            out[kind][tensor] = (dtype, [int(d) for d in dims.strip("[]").split(",")], optional)
    return out


def generated(config: object) -> dict[str, dict[str, tuple[str, list[int], str]]]:
    from tritonclient.grpc import model_config_pb2

    def row(t: object, kind: str) -> tuple[str, list[int], str]:
        optional = ("true" if t.optional else "false") if kind == "input" else "-"  # type: ignore[attr-defined]
        return (model_config_pb2.DataType.Name(t.data_type), list(t.dims), optional)  # type: ignore[attr-defined]

    return {"input": {t.name: row(t, "input") for t in config.input},  # type: ignore[attr-defined]
            "output": {t.name: row(t, "output") for t in config.output}}  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> dict[str, dict]:
    """Every shipped recipe's repository, generated once (GPU recipes reference engines that are not here)."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("upstream")
    mp.setenv("TRTKV_ENGINES", str(root / "engines"))
    mp.setenv("TRTKV_TRITON_REPO", str(root / "triton_repo"))
    try:
        out = {}
        for name in RECIPES:
            recipe = load_recipe(name)
            result = generate_repo(recipe, log=lambda _m: None)
            out[name] = {"recipe": recipe, "models": validate_repo(result.output,
                                                                   expect_decoupled=recipe.triton.decoupled)}
        return out
    finally:
        mp.undo()


def test_the_upstream_lists_are_complete() -> None:
    """Guards the test data itself: sizes as read from upstream (46 parameters, 62 + 21 tensors, 36 + 19)."""
    assert len(upstream_parameters()) == 46 and {"tokenizer_dir", "xgrammar_tokenizer_info_path",
                                                 "guided_decoding_backend"} <= set(upstream_parameters())
    llm, ensemble = upstream_io("triton_tensorrt_llm_io.tsv"), upstream_io("triton_ensemble_io.tsv")
    assert (len(llm["input"]), len(llm["output"])) == (62, 21)
    assert (len(ensemble["input"]), len(ensemble["output"])) == (36, 19)


@pytest.mark.parametrize("name", RECIPES)
def test_cpp_model_declares_every_upstream_parameter(name: str, repos: dict[str, dict]) -> None:
    entry = repos[name]
    if entry["recipe"].build.backend is not Backend.TENSORRT:
        pytest.skip("no C++ tensorrt_llm model in this repository")
    params = {k: v.string_value for k, v in entry["models"]["tensorrt_llm"].config.parameters.items()}
    missing = [k for k in upstream_parameters() if k not in params]
    assert missing == [], f"tensorrt_llm/config.pbtxt lacks upstream parameters {missing}"
    assert params["tokenizer_dir"].endswith("checkpoint/tokenizer")
    assert params["gpt_model_path"].endswith(f"{name}/engine")
    assert not any("${" in v for v in params.values())


@pytest.mark.parametrize("name", RECIPES)
def test_ensemble_matches_upstream(name: str, repos: dict[str, dict]) -> None:
    want, got = upstream_io("triton_ensemble_io.tsv"), generated(repos[name]["models"]["ensemble"].config)
    for kind in ("input", "output"):
        missing = sorted(set(want[kind]) - set(got[kind]))
        assert missing == [], f"ensemble lacks upstream {kind}s {missing}"
        for tensor, spec in want[kind].items():
            assert got[kind][tensor][0] == spec[0], f"{kind} {tensor}: {got[kind][tensor]} vs upstream {spec}"
            assert got[kind][tensor][2] == spec[2], f"{kind} {tensor}: optional differs from upstream"
            assert got[kind][tensor][1] == spec[1], f"{kind} {tensor}: dims {got[kind][tensor][1]} vs {spec[1]}"


@pytest.mark.parametrize("name", RECIPES)
def test_every_tensorrt_llm_model_has_upstreams_tensors(name: str, repos: dict[str, dict]) -> None:
    """The C++ model, trtkv's Python models and the streaming step all offer upstream's tensorrt_llm interface."""
    want = upstream_io("triton_tensorrt_llm_io.tsv")
    models = repos[name]["models"]
    for model in [m for m in ("tensorrt_llm", "tensorrt_llm_stream") if m in models]:
        got = generated(models[model].config)
        for kind in ("input", "output"):
            assert {t: got[kind].get(t) for t in want[kind]} == want[kind], f"{model} {kind}s differ from upstream"


@pytest.mark.parametrize("name", [n for n in RECIPES if n.startswith("llama")])
def test_embedding_bias_is_sized_to_the_models_vocabulary(name: str, repos: dict[str, dict]) -> None:
    """TensorRT-LLM checks embedding_bias width == the model's vocab size (128256 for Llama-3), not the tokenizer's."""
    params = {k: v.string_value for k, v in repos[name]["models"]["preprocessing"].config.parameters.items()}
    assert params["vocab_size"] == str(repos[name]["recipe"].model.vocab_size) == "128256"
