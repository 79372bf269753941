"""Recipe loading and validation: every shipped recipe validates; each bad input names file, field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.recipes import GOOD
from trtkv.core.errors import RecipeError
from trtkv.recipe import KVCacheQuant, list_recipes, load_recipe

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(str(p) for p in (ROOT / "recipes").rglob("*.yaml") if "_base" not in p.parts)



def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(path: Path, overrides: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path), overrides)
    return info.value.problems


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: Path(p).stem)
def test_every_shipped_recipe_validates(path: str) -> None:
    recipe = load_recipe(path)
    assert recipe.name == Path(path).stem
    assert Path(path).read_text().startswith("#"), "each shipped recipe opens with the command that runs it"


def test_list_recipes_matches_disk() -> None:
    assert sorted(str(p) for p in list_recipes()) == SHIPPED
    assert {"smollm2_fp8kv", "smollm2_int8kv", "llama70b_fp8kv", "llama70b_int8kv", "llama8b_fp8kv"} <= {
        Path(p).stem for p in SHIPPED}


def test_good_recipe_and_defaults(tmp_path: Path) -> None:
    recipe = load_recipe(str(write(tmp_path, GOOD)))
    assert recipe.triton.host == "127.0.0.1"
    assert recipe.triton.exclude_input_in_output is True
    assert recipe.fp8_context_fmha is True


def test_aliases_map_to_canonical(tmp_path: Path) -> None:
    text = GOOD.replace("kv_cache: fp8}", "kv_cache: int8_kv_cache}")
    assert load_recipe(str(write(tmp_path, text))).quantization.kv_cache is KVCacheQuant.INT8
    text = GOOD.replace("kv_cache: fp8}", "kv_cache: fp8_kv_cache}")
    assert load_recipe(str(write(tmp_path, text))).quantization.kv_cache is KVCacheQuant.FP8


# GOOD as a trtllm-build recipe on one H100 (the context-FMHA and Blackwell rules are engine rules)
H100 = GOOD.replace("hardware: {gpu: cpu}", "hardware: {gpu: H100-80GB}").replace("backend: reference,",
                                                                                 "backend: tensorrt,")


# (name, yaml text or replacement, expected field path, expected words in the message)
CASES = [
    ("typo_in_key", GOOD.replace("num_kv_heads", "num_kv_head"), "model.num_kv_head",
     ["unknown key", "did you mean 'num_kv_heads'"]),
    ("unknown_section", GOOD + "serving: {port: 1}\n", "serving", ["unknown key", "Allowed keys here"]),
    ("bad_enum", GOOD.replace("weights: fp8", "weights: fp4"), "quantization.weights",
     ["'fp4' is not allowed", "Allowed: fp8, int8_sq, int4_awq, none"]),
    ("bad_enum_did_you_mean", GOOD.replace("kv_cache: fp8}", "kv_cache: int8_kv_cach}"), "quantization.kv_cache",
     ["did you mean 'int8_kv_cache'", "aliases: fp8_kv_cache, int8_kv_cache"]),
    ("negative_number", GOOD.replace("max_input_len: 1024", "max_input_len: -5"), "build.max_input_len",
     ["greater than or equal to 1", "-5", "allowed: 1..134,217,728 (the largest published: Llama 4 Scout"]),
    ("string_for_int", GOOD.replace("num_layers: 30", "num_layers: thirty"), "model.num_layers",
     ["valid integer", "thirty"]),
    ("missing_source", GOOD.replace("  source: packaged:smollm2\n", ""), "model.source", ["required field is missing"]),
    ("unknown_packaged", GOOD.replace("packaged:smollm2", "packaged:gpt5"), "model.source",
     ["unknown packaged model", "packaged:smollm2"]),
    ("bad_slo", GOOD + "bench: {thresholds: ['ttft is fast']}\n", "bench.thresholds", ["metric.stat<=value"]),
    # cross-field rules
    ("tp_times_pp_vs_count", GOOD.replace("hardware: {gpu: cpu}", "hardware: {gpu: H100-80GB, count: 4}")
     .replace("backend: reference,", "backend: tensorrt, tp_size: 2,"), "build.tp_size", ["must equal hardware.count = 4"]),
    ("heads_divisible_by_tp", GOOD.replace("hardware: {gpu: cpu}", "hardware: {gpu: H100-80GB, count: 2}")
     .replace("backend: reference,", "backend: tensorrt, tp_size: 2,"), "model.num_attention_heads",
     ["9 heads are not divisible by build.tp_size = 2"]),
    ("kv_heads_vs_tp", GOOD.replace("hardware: {gpu: cpu}", "hardware: {gpu: H100-80GB, count: 6}")
     .replace("backend: reference,", "backend: tensorrt, tp_size: 6,").replace("num_kv_heads: 3", "num_kv_heads: 4"),
     "model.num_kv_heads", ["4 KV heads and build.tp_size = 6", "multiple of them"]),
    ("input_lt_seq", GOOD.replace("max_input_len: 1024", "max_input_len: 2048"), "build.max_input_len",
     ["must be < build.max_seq_len 2048"]),
    ("fp8_fmha_needs_fp8_kv", GOOD.replace("kv_cache: fp8}", "kv_cache: int8}") + "  \n",
     "build.use_fp8_context_fmha", ["FP8 context FMHA needs quantization.kv_cache: fp8"]),
    ("fp8_weights_need_fp8_gpu", GOOD.replace("hardware: {gpu: cpu}", "hardware: {gpu: A100-80GB}")
     .replace("backend: reference,", "backend: tensorrt,").replace("kv_cache: fp8}", "kv_cache: int8}"),
     "quantization.weights", ["FP8 weights need FP8 tensor cores (SM89+", "A100-80GB (compute capability 8.0) has none"]),
    ("tensorrt_not_on_cpu", GOOD.replace("backend: reference,", "backend: tensorrt,"), "build.backend",
     ["needs a GPU and TensorRT-LLM", "use backend reference"]),
    ("ports_differ", GOOD + "triton: {http_port: 9000, grpc_port: 9000}\n", "triton.grpc_port", ["must differ"]),
    # context FMHA and Blackwell: what TensorRT-LLM's builder refuses or silently changes
    ("fp8_fmha_needs_fp8_weights", H100.replace("weights: fp8", "weights: none")
     .replace("backend: tensorrt,", "backend: tensorrt, use_fp8_context_fmha: true,"),
     "build.use_fp8_context_fmha", ["FP8 quantization workflow", "quantization.weights: fp8"]),
    ("fp8_fmha_off_is_turned_back_on", H100.replace("backend: tensorrt,", "backend: tensorrt, "
                                                    "use_fp8_context_fmha: false,"),
     "build.use_fp8_context_fmha", ["turns FP8 context FMHA back on", "build.use_paged_context_fmha: false"]),
    ("int8_kv_cannot_chunk", H100.replace("kv_cache: fp8}", "kv_cache: int8}")
     .replace("max_input_len: 1024,", "max_input_len: 1024, max_num_tokens: 512,"),
     "build.max_num_tokens", ["needs chunked context", "forced off for an INT8 KV cache", ">= 1024"]),
    ("paged_off_cannot_chunk", H100.replace("max_input_len: 1024,", "max_input_len: 1024, max_num_tokens: 512, "
                                            "use_paged_context_fmha: false,"),
     "build.max_num_tokens", ["needs chunked context", "build.use_paged_context_fmha is false"]),
    ("int8_kv_no_block_reuse", H100.replace("kv_cache: fp8}", "kv_cache: int8}")
     + "triton: {enable_kv_cache_reuse: true}\n",
     "triton.enable_kv_cache_reuse", ["needs an engine built with paged context FMHA", "KV cache int8"]),
    ("b200_no_int8_kv", H100.replace("H100-80GB", "B200").replace("kv_cache: fp8}", "kv_cache: int8}"),
     "quantization.kv_cache", ["refuses an INT8 KV cache on B200", "SM>=100", "use fp8"]),
    ("b200_no_int4_awq", H100.replace("H100-80GB", "B200").replace("weights: fp8", "weights: int4_awq"),
     "quantization.weights", ["refuses int4_awq on B200", "use fp8 or none"]),
    ("b200_no_smoothquant", H100.replace("H100-80GB", "B200").replace("weights: fp8", "weights: int8_sq"),
     "quantization.weights", ["refuses int8_sq on B200"]),
]


@pytest.mark.parametrize("name,text,field,words", CASES, ids=[c[0] for c in CASES])
def test_malformed_recipe_names_field_and_fix(tmp_path: Path, name: str, text: str, field: str,
                                              words: list[str]) -> None:
    if name == "fp8_fmha_needs_fp8_kv":
        text = text.replace("build: {backend: reference,", "build: {use_fp8_context_fmha: true, backend: reference,")
    path = write(tmp_path, text)
    problems = problems_of(path)
    hits = [p for p in problems if f": {field}:" in p]
    assert hits, f"no problem names {field}: {problems}"
    assert str(path) in hits[0], "the message names the file"
    for word in words:
        assert word in hits[0], f"{word!r} not in {hits[0]!r}"


def test_good_engine_recipes_pass_the_engine_rules(tmp_path: Path) -> None:
    """The H100 base of the cases above is valid, and INT8 KV alone is fine (paged context FMHA is forced off)."""
    assert load_recipe(str(write(tmp_path, H100))).paged_context_fmha is True
    int8 = load_recipe(str(write(tmp_path, H100.replace("kv_cache: fp8}", "kv_cache: int8}"))))
    assert int8.paged_context_fmha is False and int8.fp8_context_fmha is False
    assert int8.build.use_paged_context_fmha is True  # the recipe's wish, overridden by TensorRT-LLM's rule


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    text = GOOD.replace("num_kv_heads", "num_kv_head").replace("weights: fp8", "weights: fp4")
    text = text.replace("max_input_len: 1024", "max_input_len: -1")
    problems = problems_of(write(tmp_path, text))
    assert len(problems) == 3, problems


def test_broken_yaml_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  source: [unclosed\n")
    (problem,) = problems_of(path)
    assert str(path) in problem and "malformed YAML" in problem and ":3:" in problem


def test_empty_file(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "# only a comment\n"))
    assert "the file is empty" in problem


def test_top_level_not_mapping(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "- a\n- b\n"))
    assert "must be a mapping" in problem


def test_include_relative_local_wins_and_provenance(tmp_path: Path) -> None:
    (tmp_path / "_base").mkdir()
    write(tmp_path, GOOD.replace("max_input_len: 1024", "max_input_len: 512"), "_base/base.yaml")
    child = write(tmp_path, "include: _base/base.yaml\nbuild: {max_input_len: 700}\n", "child.yaml")
    recipe = load_recipe(str(child))
    assert recipe.build.max_input_len == 700  # local keys win
    assert recipe.build.max_seq_len == 2048  # merged from the include
    # an error in the included file is reported against that file
    write(tmp_path, GOOD.replace("weights: fp8", "weights: fp4"), "_base/base.yaml")
    problems = problems_of(child)
    assert any("_base/base.yaml: quantization.weights" in p for p in problems), problems


def test_include_cycle(tmp_path: Path) -> None:
    write(tmp_path, "include: b.yaml\n", "a.yaml")
    write(tmp_path, "include: a.yaml\n", "b.yaml")
    (problem,) = problems_of(tmp_path / "a.yaml")
    assert "include cycle" in problem and "a.yaml -> " in problem


def test_missing_include(tmp_path: Path) -> None:
    path = write(tmp_path, "include: nope.yaml\n")
    (problem,) = problems_of(path)
    assert "nope.yaml: no such file (included from" in problem


def test_overrides_win_and_are_validated(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert load_recipe(str(path), ["build.max_batch_size=16"]).build.max_batch_size == 16
    problems = problems_of(path, ("build.max_batch_size=lots",))
    assert any(p.startswith("<command line>: build.max_batch_size") for p in problems), problems
    with pytest.raises(RecipeError, match="expected section.key=value"):
        load_recipe(str(path), ["build.max_batch_size"])


def test_unknown_recipe_name_did_you_mean() -> None:
    with pytest.raises(RecipeError, match="did you mean 'smollm2_fp8kv'"):
        load_recipe("smollm2_fp8k")


def test_tp_beyond_the_kv_heads_replicates_them() -> None:
    """Llama-3-70B has 8 KV heads: TP16 replicates each on 2 GPUs (TensorRT-LLM and ModelOpt do); TP12 cannot."""
    recipe = load_recipe("llama70b_fp8kv", ["build.tp_size=16", "hardware.count=16"])
    assert recipe.build.tp_size == 16
    with pytest.raises(RecipeError, match="8 KV heads and build.tp_size = 12"):
        load_recipe("llama70b_fp8kv", ["build.tp_size=12", "hardware.count=12"])
