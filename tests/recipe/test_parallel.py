"""Expert and attention-data parallelism as recipe keys (build.ep_size, build.attention_dp_size): each engine's
refusals, read from its pinned source (trtkv.recipe.parallel), and each engine's words for them in the commands and
LLM() arguments trtkv writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtkv.core.errors import RecipeError
from trtkv.recipe import load_recipe
from trtkv.recipe.parallel import Parallelism

DATA = Path(__file__).resolve().parents[1] / "data"
CONFIGS = DATA / "configs"
PLAIN = ("build.ep_size=1", "build.attention_dp_size=1")  # init proposes both for an MoE model


def moe_recipe(tmp_path: Path, backend: str, count: int = 8, *overrides: str):  # noqa: ANN201 - a Recipe
    """Qwen3-30B-A3B (128 experts, top 8, 4 KV heads) on `count` H200s, as `trtkv init` writes it."""
    from trtkv.cli.init import write_recipe

    path = tmp_path / f"moe_{backend}_{count}.yaml"
    if not path.exists():
        write_recipe(f"moe_{backend}_{count}", CONFIGS / "qwen3_30b_a3b", path, "H200-141GB", count=count,
                     backend=backend)
    return load_recipe(path, list(overrides))


def refusals(name: str, *overrides: str) -> str:
    with pytest.raises(RecipeError) as err:
        load_recipe(name, list(overrides))
    return str(err.value)


def test_the_accessor_reads_the_four_sizes() -> None:
    p = load_recipe("llama70b_fp8kv_sglang", ["build.ep_size=2", "build.attention_dp_size=4"]).parallelism
    assert p == Parallelism(tp=4, pp=1, ep=2, attention_dp=4)
    assert (p.gpus, p.moe_tp, p.attention_tp, p.active, p.per_group(9)) == (4, 2, 1, True, 3)
    assert p.label() == "TP4 PP1 EP2 attention-DP4"
    assert not load_recipe("llama70b_fp8kv_sglang").parallelism.active


def test_ep_and_attention_dp_subdivide_the_tp_group() -> None:
    text = refusals("llama70b_fp8kv_sglang", "build.ep_size=3", "build.attention_dp_size=8")
    assert "build.ep_size" in text and "ep_size 3 does not divide build.tp_size 4" in text
    assert "attention_dp_size 8 does not divide build.tp_size 4" in text and "use one of 1, 2, 4" in text


def test_each_engine_refuses_what_its_source_cannot_run_and_names_the_alternative() -> None:
    # vLLM: EP is all of TP x DP or nothing (fused_moe/config.py FusedMoEParallelConfig.make)
    text = refusals("llama70b_fp8kv_sglang", "build.backend=vllm", "build.ep_size=2")
    assert "--enable-expert-parallel spreads the experts over all" in text and "use ep_size 4 or 1" in text
    # TensorRT-LLM: attention DP over every TP rank (mapping.py dp_size = tp_size if enable_attention_dp)
    text = refusals("llama70b_fp8kv_llmapi", "build.attention_dp_size=2")
    assert "enable_attention_dp" in text and "use attention_dp_size 4 or 1" in text and "--attn-dp-size 2" in text
    # the engine path: no EP in ModelOpt's TRT-LLM checkpoint mapping, no attention DP
    text = refusals("llama70b_fp8kv", "build.ep_size=4", "build.attention_dp_size=4")
    assert "moe_ep_size 1" in text and "trtllm-build engines have no attention data parallelism" in text
    assert text.count("build.backend llmapi") == 2
    # what each engine does run is accepted
    for name, overrides in (("llama70b_fp8kv_sglang", ["build.ep_size=2", "build.attention_dp_size=2"]),
                            ("llama70b_fp8kv_llmapi", ["build.ep_size=2", "build.attention_dp_size=4"]),
                            ("llama70b_fp8kv_sglang", ["build.backend=vllm", "build.ep_size=4",
                                                       "build.attention_dp_size=2"])):
        assert load_recipe(name, overrides).parallelism.active


def test_vllm_counts_tp_times_dp_and_turns_ep_on_for_all(tmp_path: Path) -> None:
    from trtkv.backends import vllm_command

    recipe = moe_recipe(tmp_path, "vllm", 8, "build.ep_size=8", "build.attention_dp_size=4", "build.max_batch_size=30")
    args = vllm_command.server_args(recipe, Path("/m"), "0.0.0.0")
    assert args[args.index("--tensor-parallel-size") + 1] == "2"  # 8 GPUs = TP 2 x DP 4
    assert args[args.index("--data-parallel-size") + 1] == "4" and "--enable-expert-parallel" in args
    assert args[args.index("--max-num-seqs") + 1] == "8"  # per DP engine core: ceil(30 / 4)
    plain = vllm_command.server_args(moe_recipe(tmp_path, "vllm", 8, *PLAIN), Path("/m"), "0.0.0.0")
    assert plain[plain.index("--tensor-parallel-size") + 1] == "8"
    assert "--data-parallel-size" not in plain and "--enable-expert-parallel" not in plain


def test_sglang_subdivides_tp_size(tmp_path: Path) -> None:
    from trtkv.backends import sglang

    recipe = moe_recipe(tmp_path, "sglang", 8, "build.ep_size=8", "build.attention_dp_size=8")
    args = sglang.server_args(recipe, Path("/m"), "0.0.0.0")
    assert args[args.index("--tp-size") + 1] == "8"  # GPUs = tp; DP and EP inside it
    assert args[args.index("--attn-dp-size") + 1] == "8" and args[args.index("--ep-size") + 1] == "8"
    assert "--enable-dp-attention" not in args  # deprecated in 0.5.23 (parallel_hook.py)


def test_llm_api_keys_are_torch_llm_args_fields_and_multiply_to_tp(tmp_path: Path) -> None:
    from trtkv.backends.llmapi_args import llm_args
    from trtkv.backends.llmapi_serve import serve_config

    fields = set(json.loads((DATA / "llm_args_fields.json").read_text())["llm_args"])
    recipe = moe_recipe(tmp_path, "llmapi", 8, "build.ep_size=4", "build.attention_dp_size=8",
                        "build.max_batch_size=64")
    args = llm_args(recipe, Path("/m"))
    assert set(args) <= fields, set(args) - fields
    assert args["moe_expert_parallel_size"] * args["moe_tensor_parallel_size"] == args["tensor_parallel_size"] == 8
    assert args["enable_attention_dp"] is True and args["max_batch_size"] == 8  # per attention-DP rank
    assert {"moe_expert_parallel_size", "enable_attention_dp"} <= set(serve_config(recipe))
    plain = llm_args(moe_recipe(tmp_path, "llmapi", 8, *PLAIN), Path("/m"))
    assert not {"moe_expert_parallel_size", "moe_tensor_parallel_size", "enable_attention_dp"} & set(plain)


def test_repo_and_every_deploy_target_carry_the_layout(tmp_path: Path) -> None:
    """The Triton llmapi model.yaml, the Dynamo workers' LLM() config (LLM API) and command line (vLLM), and the k8s
    and Slurm commands carry EP and attention DP; every LLM() key is a TorchLlmArgs field."""
    import yaml

    from tests.support.planned import deploy
    from trtkv.backends.llmapi_args import model_yaml
    from trtkv.deploy import Options, Target

    fields = set(json.loads((DATA / "llm_args_fields.json").read_text())["llm_args"])
    opts, quiet = Options(model_source="s3://my-bucket/x"), lambda _m: None
    llmapi = moe_recipe(tmp_path, "llmapi", 8, "build.ep_size=8", "build.attention_dp_size=8")
    doc = model_yaml(llmapi, Path("/m"))
    assert set(doc) - {"triton_config"} <= fields
    assert (doc["moe_expert_parallel_size"], doc["enable_attention_dp"]) == (8, True)
    out = deploy(llmapi, Target.DYNAMO, tmp_path / "dyn", log=quiet, options=opts)
    cm = next(d for d in yaml.safe_load_all((out / "agg.yaml").read_text()) if d and d["kind"] == "ConfigMap")
    for text in cm["data"].values():
        cfg = yaml.safe_load(text)
        assert set(cfg) <= fields and cfg["moe_tensor_parallel_size"] == 1 and cfg["enable_attention_dp"] is True
    vllm = moe_recipe(tmp_path, "vllm", 8, "build.ep_size=8", "build.attention_dp_size=8")
    out = deploy(vllm, Target.DYNAMO, tmp_path / "dynv", log=quiet, options=opts)
    text = (out / "agg.yaml").read_text()
    assert "--enable-expert-parallel" in text and "--data-parallel-size" in text
    for target in (Target.K8S, Target.SLURM):
        out = deploy(vllm, target, tmp_path / target.value, log=quiet, options=opts)
        text = "".join(p.read_text() for p in sorted(out.iterdir()) if p.is_file())
        assert "--data-parallel-size 8" in text and "--enable-expert-parallel" in text, target
