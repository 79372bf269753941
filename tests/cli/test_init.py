"""`trtkv init`: a recipe from a config.json that validates and plans at once, for each family; refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.checkpoints import read_model_facts
from trtkv.cli.init import write_recipe
from trtkv.core.errors import RecipeError
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe
from trtkv.recipe.attention import compact_layers

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
FAMILIES = sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file())


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip(tmp_path: Path, family: str) -> None:
    out = write_recipe(f"r_{family}", CONFIGS / family, tmp_path / f"r_{family}.yaml")
    text = out.read_text()
    assert text.startswith(f"# trtkv plan r_{family}")
    recipe = load_recipe(out)  # validates
    facts = read_model_facts(CONFIGS / family)
    assert recipe.model.attention_layers == compact_layers(facts.layers)
    assert recipe.model.attention_source and facts.attention_source in recipe.model.attention_source
    p = plan(recipe)  # plans at once, the config on disk agreeing with every written field
    cap = next(c for c in p.formats if c.format == p.recipe_kv_format)
    assert cap.max_sequences[recipe.build.max_seq_len] >= 1  # TP/PP sized so one sequence fits
    assert p.concurrency.workload_sequences >= recipe.build.max_batch_size  # the cap init sized fits the workload
    assert recipe.build.max_batch_size >= min(cap.max_sequences[recipe.build.max_seq_len], p.concurrency.sized)
    assert recipe.build.tp_size * recipe.build.pp_size == recipe.hardware.count
    if facts.max_position_embeddings:
        assert recipe.build.max_seq_len <= facts.max_position_embeddings


def test_the_batch_fits_with_itself_as_the_engines_max_num_seqs(tmp_path: Path) -> None:
    """vLLM's profiling run samples max_num_seqs rows and captures CUDA graphs up to 2 x max_num_seqs: sized to what
    fits at a smaller batch, the batch may no longer fit (Qwen3-Next on one H200 was sized 116 where 115 fit), so init
    re-plans with the cap it chose until the workload still fits beside it."""
    out = write_recipe("q", CONFIGS / "qwen3_next_80b_a3b", tmp_path / "q.yaml", gpu="NVIDIA H200", backend="vllm")
    recipe = load_recipe(out)
    p = plan(recipe)
    cap = next(c for c in p.formats if c.format == p.recipe_kv_format)
    assert cap.max_sequences[recipe.build.max_seq_len] < recipe.build.max_batch_size <= p.concurrency.workload_sequences


def test_2k_traffic_is_not_capped_at_the_full_context_count(tmp_path: Path) -> None:
    """Issue #52: Qwen3-32B on one H200 fits 23 sequences of 32,768 tokens, and init used to write max_batch_size 23
    (vLLM served with --max-num-seqs 23), though the engines admit by KV blocks and the recipe's workload is 2,048 in +
    256 out tokens. The cap is now the workload's sequences that fit, under vLLM's own max_num_seqs default (1,024 on
    a GPU of 70 GiB or more), re-planned with itself; plan and the served command carry it."""
    from trtkv.backends.vllm_command import server_args

    out = write_recipe("q", CONFIGS / "qwen3_32b", tmp_path / "q.yaml", gpu="NVIDIA H200", backend="vllm")
    recipe = load_recipe(out)
    c = plan(recipe).concurrency
    assert (recipe.bench.input_tokens, recipe.bench.output_tokens, c.max_seq_len) == (2048, 256, 32768)
    assert c.full_context_sequences < 30  # the full-context count (23 when the issue was filed)
    assert c.engine_limit == 1024 and c.flag == "--max-num-seqs"
    assert 10 * c.full_context_sequences < recipe.build.max_batch_size == c.cap <= c.workload_sequences
    assert recipe.build.max_batch_size >= c.sized - 2  # sized for the workload, less what its own activation costs
    args = server_args(recipe, tmp_path, "127.0.0.1")
    assert args[args.index("--max-num-seqs") + 1] == str(recipe.build.max_batch_size)
    assert recipe.bench.concurrency[-1] == recipe.build.max_batch_size
    assert "sequences of the bench workload (2048 in + 256 out tokens) fit" in out.read_text()


def test_sizes_tp_pp_for_the_gpus(tmp_path: Path) -> None:
    small = load_recipe(write_recipe("a", CONFIGS / "llama3_1_8b", tmp_path / "a.yaml"))
    assert (small.build.tp_size, small.build.pp_size) == (1, 1)
    big = load_recipe(write_recipe("b", CONFIGS / "deepseek_v3", tmp_path / "b.yaml"))
    assert big.hardware.count > 8 and big.build.tp_size == 8  # 627 GiB of FP8 weights: more than one node of H100s
    fixed = load_recipe(write_recipe("c", CONFIGS / "deepseek_v3", tmp_path / "c.yaml", "H200-141GB", 8))
    assert (fixed.build.tp_size, fixed.hardware.count) == (8, 8)
    cpu = load_recipe(write_recipe("d", CONFIGS / "llama3_1_8b", tmp_path / "d.yaml", "cpu"))
    assert cpu.build.backend.value == "reference" and cpu.hardware.count == 1
    vllm = load_recipe(write_recipe("e", CONFIGS / "gemma3_27b", tmp_path / "e.yaml", "cpu"))
    assert vllm.build.backend.value == "vllm"


def test_never_overwrites_without_force(tmp_path: Path) -> None:
    out = write_recipe("x", CONFIGS / "qwen3_8b", tmp_path / "x.yaml")
    out.write_text("# mine\n" + out.read_text())
    with pytest.raises(RecipeError, match="already exists.*--force"):
        write_recipe("x", CONFIGS / "qwen3_8b", tmp_path / "x.yaml")
    assert out.read_text().startswith("# mine")
    write_recipe("x", CONFIGS / "qwen3_8b", tmp_path / "x.yaml", force=True)
    assert not out.read_text().startswith("# mine")


@pytest.mark.parametrize("name", ["Bad Name", "UPPER", "a/b", "-lead", "x" * 60])
def test_refuses_a_bad_name_before_writing(tmp_path: Path, name: str) -> None:
    with pytest.raises(RecipeError):
        write_recipe(name, CONFIGS / "qwen3_8b", tmp_path / f"{name.replace('/', '_')}.yaml")
    assert list(tmp_path.iterdir()) == []


def test_refuses_unreadable_and_unpriced_configs(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="qwen3_next.*needs.*linear_num_key_heads.*Next:"):
        write_recipe("q", CONFIGS / "refused" / "qwen3_next", tmp_path / "q.yaml")
    with pytest.raises(RecipeError, match="Mamba-2 .*state-space only.*Next:"):
        write_recipe("q", CONFIGS / "refused" / "mamba2", tmp_path / "q.yaml")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"num_hidden_layers": 2, "hidden_size": 64}')
    with pytest.raises(RecipeError, match=r"num_attention_heads: missing.*Next:"):
        write_recipe("m", tmp_path / "m", tmp_path / "m.yaml")
    assert not (tmp_path / "m.yaml").exists() and not (tmp_path / "q.yaml").exists()


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    out = tmp_path / "gemma.yaml"
    assert main(["init", "gemma", "--model", str(CONFIGS / "gemma3_27b" / "config.json"), "--output", str(out),
                 "--gpu", "H200-141GB", "--kv-cache", "fp8", "--backend", "vllm"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert main(["plan", str(out), "--full"]) == 0
    printed = capsys.readouterr().out
    assert "52 x sliding:1024 + 10 x full" in printed and "vLLM allocation" in printed
    assert main(["init", "gemma", "--model", str(CONFIGS / "gemma3_27b"), "--output", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


GPU_TARGETS = ("H100-80GB", "B200", "A100-80GB", "L4", "RTX-5090", "cpu")


@pytest.mark.parametrize("gpu", GPU_TARGETS)
@pytest.mark.parametrize("backend", ["llmapi", "tensorrt", "vllm", "sglang", "reference"])
def test_every_backend_gets_defaults_its_engine_accepts(tmp_path: Path, gpu: str, backend: str) -> None:
    """Whatever engine is asked for, the defaults init fills in validate for it; what the engine cannot do at all is
    refused naming the user's file and the flag."""
    out = tmp_path / "r.yaml"
    if gpu == "cpu" and backend in ("tensorrt", "sglang"):
        with pytest.raises(RecipeError, match=rf"{out}: (build.backend \(from --backend {backend}\)|hardware.gpu "
                                              rf"\(from --gpu cpu\)).*Next: change --"):
            write_recipe("r", CONFIGS / "llama3_1_8b", out, gpu, backend=backend)
        assert not out.exists()
        return
    recipe = load_recipe(write_recipe("r", CONFIGS / "llama3_1_8b", out, gpu, backend=backend))
    assert recipe.build.backend.value == backend
    assert recipe.build.max_num_tokens >= recipe.build.max_batch_size  # vLLM's scheduler rule, kept for every engine


@pytest.mark.parametrize("gpu,chunk", [("RTX-4080", 2048), ("RTX-4090", 4096), ("L4", 4096), ("A100-40GB", 4096),
                                       ("H100-80GB", 8192), ("B200", 16384)])
def test_sglang_takes_sglangs_own_chunk_for_the_card(tmp_path: Path, gpu: str, chunk: int) -> None:
    """SGLang 0.5.23 sizes chunked_prefill_size by GPU memory (arg_groups/memory_hook.py handle_gpu_memory_settings):
    init writes that as build.max_num_tokens for SGLang, which the command passes as --chunked-prefill-size and the
    planned fraction reserves for."""
    from trtkv.backends import sglang

    out = write_recipe("s", CONFIGS / "qwen2_5_7b", tmp_path / "s.yaml", gpu, backend="sglang")
    recipe = load_recipe(out)
    assert recipe.build.max_num_tokens == chunk
    assert "chunked_prefill_size on a" in out.read_text()
    args = sglang.server_args(recipe, Path("/m"), "h")
    assert args[args.index("--chunked-prefill-size") + 1] == str(chunk)


def test_sglang_serves_a_7b_model_on_one_24_gb_card(tmp_path: Path) -> None:
    """Qwen2.5-7B (15.2 GB of BF16 weights) on one RTX 4090 under SGLang: with trtkv's 8,192-token step SGLang's
    formula reserves 13.5 GiB and left no KV ('0.0 GiB for KV', refused); with SGLang's own 4,096 it reserves 7.3 GiB
    and the pool holds several sequences."""
    out = write_recipe("s", CONFIGS / "qwen2_5_7b", tmp_path / "s.yaml", "RTX-4090", count=1, backend="sglang",
                       kv_cache="none")
    recipe = load_recipe(out)
    p = plan(recipe)
    assert recipe.build.tp_size == 1 and p.kv_pool.engine == "sglang"
    assert 0.6 < p.kv_pool.knob_value < 0.8 and p.kv_pool_bytes_per_gpu > 1.0 * 2**30
    cap = next(c for c in p.formats if c.format == p.recipe_kv_format)
    assert cap.max_sequences[recipe.build.max_seq_len] >= 1


def test_a_refused_default_moves_and_says_why(tmp_path: Path) -> None:
    """vLLM reads an FP8 KV cache beside 16-bit weights (calibrate's compressed-tensors KV-only export): init keeps
    the weights as stored (on main it moved them to fp8); trtllm-build without paged context FMHA needs
    max_num_tokens >= max_input_len: init raises it."""
    vllm = write_recipe("v", CONFIGS / "llama3_1_8b", tmp_path / "v.yaml", backend="vllm")
    assert load_recipe(vllm).quantization.weights.value == "none"
    trt = load_recipe(write_recipe("t", CONFIGS / "llama3_1_8b", tmp_path / "t.yaml", backend="tensorrt"))
    assert trt.quantization.weights.value == "none" and trt.build.max_num_tokens == trt.build.max_input_len
    fp8 = load_recipe(write_recipe("f", CONFIGS / "llama3_1_8b", tmp_path / "f.yaml", backend="tensorrt",
                                   weights="fp8"))
    assert fp8.build.max_num_tokens == 8192 < fp8.build.max_input_len  # chunked context with paged context FMHA


def test_a_refused_flag_is_named_with_the_users_file(tmp_path: Path) -> None:
    out = tmp_path / "mine.yaml"
    with pytest.raises(RecipeError) as err:
        write_recipe("mine", CONFIGS / "gpt_oss_120b", out, "H200-141GB", backend="vllm", weights="fp8")
    text = str(err.value)
    assert f"{out}: quantization.weights (from --weights fp8)" in text and "stored as mxfp4" in text
    assert "Next: change --weights" in text and "Recipe not written" in text
    with pytest.raises(RecipeError, match=rf"{out}: build.max_seq_len \(from --max-seq-len 200000\).*131072"):
        write_recipe("mine", CONFIGS / "llama3_1_8b", out, max_seq_len=200000)
    with pytest.raises(RecipeError, match=r"quantization.kv_cache \(from --kv-cache nvfp4\).*SM100/103"):
        write_recipe("mine", CONFIGS / "llama3_1_8b", out, "H100-80GB", kv_cache="nvfp4")
    with pytest.raises(RecipeError, match=r"--concurrency 0: must be in 1\.\."):
        write_recipe("mine", CONFIGS / "llama3_1_8b", out, concurrency=0)
    assert not out.exists()


def test_lengths_and_concurrency_size_the_recipe(tmp_path: Path) -> None:
    """max_batch_size is the bench workload's sequences that fit (the plan's figure) under the engine's own default;
    --concurrency grows the GPU count until that many of max_seq_len fit, or is refused on a fixed count; the sections
    stay within the lengths."""
    r = load_recipe(write_recipe("a", CONFIGS / "llama3_1_8b", tmp_path / "a.yaml", max_seq_len=8192))
    assert (r.build.max_seq_len, r.build.max_input_len) == (8192, 7168)
    c = plan(r).concurrency
    assert c.engine_limit == 2048 and c.flag == "max_batch_size"  # TensorRT-LLM's LLM API default
    # re-planned with itself (the warm-up's logits grow with the cap): within a few of what the workload fits
    assert c.full_context_sequences < r.build.max_batch_size <= c.workload_sequences <= r.build.max_batch_size + 8
    assert r.bench.concurrency[-1] == r.build.max_batch_size and r.bench.input_tokens <= r.build.max_input_len
    assert max(r.probe.lengths) <= 8192 and max(r.bench.needle_context_lengths) <= r.build.max_input_len
    assert (r.calibration.num_samples, r.calibration.seq_len, r.calibration.batch_size) == (512, 512, 8)
    one = load_recipe(write_recipe("b", CONFIGS / "llama3_1_8b", tmp_path / "b.yaml"))
    fits_on_one = next(c for c in plan(one).formats if c.format == one.kv_format_label).max_sequences[32768]
    many = load_recipe(write_recipe("c", CONFIGS / "llama3_1_8b", tmp_path / "c.yaml", concurrency=2 * fits_on_one + 1))
    assert many.build.max_batch_size == 2 * fits_on_one + 1 and many.hardware.count > 1
    assert next(c for c in plan(many).formats if c.format == many.kv_format_label).max_sequences[32768] >= \
        many.build.max_batch_size
    with pytest.raises(RecipeError, match=r"build.max_batch_size \(from --concurrency \d+\): .* sequence\(s\) of "
                                          r"32768 tokens in fp8.*--target-concurrency"):
        write_recipe("d", CONFIGS / "llama3_1_8b", tmp_path / "d.yaml", count=1, concurrency=fits_on_one + 1)
    cpu = load_recipe(write_recipe("e", CONFIGS / "llama3_1_8b", tmp_path / "e.yaml", "cpu", max_seq_len=512))
    assert cpu.build.max_batch_size == 16 and cpu.calibration.num_samples == 16  # the CPU keeps the schema's sizes
    assert cpu.bench.needle_context_lengths == [448] and cpu.probe.lengths == [512]


def test_cli_takes_nvidia_smi_names_and_the_new_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    out = tmp_path / "h.yaml"
    assert main(["init", "h", "--model", str(CONFIGS / "qwen3_8b"), "--output", str(out), "--gpu",
                 "NVIDIA H200", "--weights", "fp8", "--max-seq-len", "16384", "--concurrency", "8"]) == 0
    r = load_recipe(out)
    assert (r.hardware.gpu.value, r.quantization.weights.value, r.build.max_seq_len, r.build.max_batch_size) == \
        ("H200-141GB", "fp8", 16384, 8)
    capsys.readouterr()
    assert main(["init", "h", "--model", str(CONFIGS / "qwen3_8b"), "--gpu", "NVIDIA Tesla K80"]) == 2
    err = capsys.readouterr().err
    assert "--gpu 'NVIDIA Tesla K80': unknown GPU" in err and "Value error" not in err  # pydantic's prefix dropped
    assert main(["init", "h", "--model", str(CONFIGS / "qwen3_8b"), "--concurrency", "0"]) == 2
    assert "--concurrency 0: Input should be greater than or equal to 1" in capsys.readouterr().err
