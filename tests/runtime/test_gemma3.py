"""The reference runtime runs Gemma 3 from an HF export: greedy tokens equal transformers' Gemma3ForCausalLM (float32),
solo and in the in-flight batch, with the sliding layers' caches holding only their window."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.tiny_gemma3 import VOCAB, tiny_gemma3
from trtkv.core.errors import StageError
from trtkv.runtime import Batcher, ReferenceRuntime, make_sequence
from trtkv.runtime.batch import run_solo


def _export(model: Any, out: Path) -> Path:
    """A plain (unquantized) HF export: config.json + model.safetensors, as save_pretrained writes it."""
    model.save_pretrained(str(out))
    return out


def _reference_tokens(model: Any, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ReferenceRuntime]:
    model = tiny_gemma3(window=6)
    runtime = ReferenceRuntime.load_hf(_export(model, tmp_path_factory.mktemp("gemma3") / "hf"))
    return model, runtime


def test_tiny_gemma3_greedy_equals_transformers(tiny: tuple[Any, ReferenceRuntime]) -> None:
    """Prompts longer than the window and decodes past it: the sliding layers' caches trim, the full layer keeps all."""
    model, runtime = tiny
    assert type(runtime.model).__name__ == "Gemma3ForCausalLM" and runtime.model.dtype == torch.float32
    for fmt in ("none", "fp16"):
        rt = runtime.with_kv_format(fmt)
        for seed, length in ((0, 4), (1, 9), (2, 15)):
            prompt = _prompt(length, seed)
            assert rt.generate(prompt, max_tokens=12) == _reference_tokens(model, prompt, 12), (fmt, seed)
    seq = make_sequence(runtime.with_kv_format("fp16"), _prompt(9, 1), max_tokens=12)
    run_solo(runtime.with_kv_format("fp16"), seq)
    assert seq.cache.stored_tokens() == [5, 5, 20, 5]  # 9 + 11 fed (the 12th is never fed); window 6 keeps 5


def test_tiny_gemma3_weights_are_read_as_the_engines_read_them(tiny: tuple[Any, ReferenceRuntime]) -> None:
    """(1 + w) norms, sqrt(hidden) embedding scale, query_pre_attn_scalar, per-layer RoPE base: the runtime's model
    is transformers' own, filled with the checkpoint's w (not 1 + w) and its non-persistent buffers rebuilt."""
    model, runtime = tiny
    inner = runtime.model.model
    assert float(inner.embed_tokens.embed_scale) == pytest.approx(64 ** 0.5)
    assert inner.layers[0].self_attn.scaling == pytest.approx(24 ** -0.5)
    assert torch.equal(inner.layers[1].self_attn.q_norm.weight, model.model.layers[1].self_attn.q_norm.weight)
    for kind in ("sliding_attention", "full_attention"):
        assert torch.equal(getattr(inner.rotary_emb, f"{kind}_inv_freq"), getattr(model.model.rotary_emb,
                                                                                     f"{kind}_inv_freq"))
    assert runtime.model.lm_head.weight is inner.embed_tokens.weight  # tied, as the export says


def test_tiny_gemma3_in_flight_batch_gives_the_solo_tokens(tiny: tuple[Any, ReferenceRuntime]) -> None:
    _, runtime = tiny
    rt = runtime.with_kv_format("fp16")
    prompts = [_prompt(n, seed) for seed, n in ((3, 5), (4, 11), (5, 8))]
    solo = [rt.generate(p, max_tokens=10) for p in prompts]
    results: dict[int, list[int]] = {}
    batcher = Batcher(rt, max_batch_size=3, max_num_tokens=4)  # chunked prefill while others decode
    try:
        import threading

        done = threading.Event()

        def finish(i: int):  # noqa: ANN202
            def on_done(tokens: list[int], error: BaseException | None) -> None:
                assert error is None
                results[i] = tokens
                if len(results) == len(prompts):
                    done.set()
            return on_done

        for i, p in enumerate(prompts):
            batcher.submit(make_sequence(rt, p, max_tokens=10, on_done=finish(i)))
        assert done.wait(120)
    finally:
        batcher.shutdown()
    assert [results[i] for i in range(len(prompts))] == solo and batcher.peak_batch >= 2


def test_non_gemma_non_llama_export_is_refused(tmp_path: Path) -> None:
    out = _export(tiny_gemma3(), tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["Gemma2ForCausalLM"]}))
    with pytest.raises(StageError, match="LlamaForCausalLM or Gemma3ForCausalLM"):
        ReferenceRuntime.load_hf(out)


@pytest.fixture(scope="module")
def modelopt_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The tiny Gemma 3 through ModelOpt itself: FP8 weights and FP8 KV calibrated, export_hf_checkpoint."""
    import copy

    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    model = tiny_gemma3(window=6, seed=1)
    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    cfg["quant_cfg"] = list(cfg["quant_cfg"]) + list(copy.deepcopy(mtq.FP8_KV_CFG)["quant_cfg"])
    batches = [torch.tensor([_prompt(16, s)]) for s in range(4)]
    mtq.quantize(model, cfg, lambda m: [m(b) for b in batches])
    out = tmp_path_factory.mktemp("gemma3_modelopt") / "hf"
    export_hf_checkpoint(model, export_dir=str(out))
    return model, out


@pytest.mark.slow  # ModelOpt's quantize + export: ~8 s
def test_modelopt_fp8_export_runs_as_transformers_on_its_dequantized_weights(modelopt_export: tuple[Any, Path],
                                                                            tmp_path: Path) -> None:
    """ModelOpt 0.47 exports Gemma 3 with k_proj.k_scale / v_proj.v_scale and FP8 weights x weight_scale, norms as w:
    the runtime's tokens (16-bit KV) equal transformers' float32 Gemma3ForCausalLM on the dequantized weights."""
    from safetensors.torch import load_file
    from transformers import Gemma3ForCausalLM

    _, out = modelopt_export
    quant = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["kv_cache_quant_algo"]) == ("FP8", "FP8")
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    runtime = ReferenceRuntime.load_hf(out)
    assert runtime.kv_format == "fp8_scale1" and runtime.kv_scales is None  # TensorRT-LLM's PyTorch backend
    k_scales, v_scales = runtime.export_kv_scales or ([], [])
    assert k_scales == [float(tensors[f"model.layers.{i}.self_attn.k_proj.k_scale"]) for i in range(4)]
    assert v_scales == [float(tensors[f"model.layers.{i}.self_attn.v_proj.v_scale"]) for i in range(4)]
    reference = Gemma3ForCausalLM(runtime.config).eval()  # a fresh model with the runtime's dequantized weights
    reference.load_state_dict(runtime.model.state_dict())
    for seed in (6, 7):
        prompt = _prompt(10, seed)
        want = _reference_tokens(reference, prompt, 10)
        assert runtime.with_kv_format("fp16").generate(prompt, max_tokens=10) == want
        assert len(runtime.generate(prompt, max_tokens=10)) == 10  # FP8 KV, scale 1.0
        assert len(runtime.with_kv_format("fp8").generate(prompt, max_tokens=10)) == 10  # vLLM: k_scale, v_scale
    with pytest.raises(Exception, match="FP8 scales"):
        runtime.with_kv_format("int8")
    shutil.rmtree(tmp_path, ignore_errors=True)


RECIPE = """\
model:
  source: packaged:gemma3
  num_layers: 18
  num_attention_heads: 4
  num_kv_heads: 1
  head_dim: 256
  hidden_size: 640
quantization: {weights: none, kv_cache: KV}
build: {backend: reference, max_input_len: 1024, max_seq_len: 2048}
hardware: {gpu: cpu}
"""


def _recipe(tmp_path: Path, kv: str) -> Any:
    from trtkv.recipe import load_recipe

    path = tmp_path / "gemma3_test.yaml"
    path.write_text(RECIPE.replace("KV", kv))
    return load_recipe(str(path))


@pytest.mark.e2e  # runs the real model: not in `make check`
@pytest.mark.slow  # ~50 s here under load: the recipe's tokenizer is the packaged Gemma 3's (262K entries)
def test_reference_backend_serves_an_hf_export_without_a_trtllm_checkpoint(tiny: tuple[Any, ReferenceRuntime],
                                                                           tmp_path: Path) -> None:
    """build writes runtime.json pointing at checkpoint/hf/; ReferenceRuntime.load (what the Triton model calls)
    then runs the Gemma 3 export; an INT8-KV recipe on an HF export is refused with the reason."""
    from trtkv.backends import BuildJob
    from trtkv.backends.reference import BACKEND, hf_export_only

    model, _ = tiny
    ckpt = tmp_path / "checkpoint"
    _export(model, ckpt / "hf")
    assert hf_export_only(ckpt) == ckpt / "hf"
    engine = tmp_path / "engine"
    engine.mkdir()
    lines: list[str] = []
    info = BACKEND.builder.build(BuildJob(_recipe(tmp_path, "none"), ckpt, engine, engine, {}, lines.append))
    settings = json.loads((engine / "runtime.json").read_text())
    assert settings["hf_checkpoint"] == str(ckpt / "hf") and "checkpoint" not in settings
    assert info["kv_format"] == "none" and "no TensorRT-LLM checkpoint" in lines[0]
    runtime = ReferenceRuntime.load(engine)
    prompt = _prompt(9, 1)
    assert runtime.generate(prompt, max_tokens=8) == _reference_tokens(model, prompt, 8)
    assert runtime.max_seq_len == 256 and runtime.engine_dir == engine  # the model's 256 positions cap 2048
    with pytest.raises(StageError, match="allowed here: fp8, none"):
        BACKEND.builder.build(BuildJob(_recipe(tmp_path, "int8"), ckpt, engine, engine, {}, lines.append))


def test_tiny_gemma3_through_the_llm_api_equals_transformers(tmp_path: Path, smollm2_dir: Path) -> None:
    """The llmapi layout's engine (trtkv.runtime.llm.LLM, what its Triton `tensorrt_llm` model.py drives) on a Gemma 3
    HF export: greedy tokens equal transformers', with several requests in flight at once (the tiny model has no
    tokenizer of its own: SmolLM2's only turns its ids into text)."""
    from trtkv.runtime.llm import LLM, SamplingParams

    model = tiny_gemma3(window=6)
    llm = LLM(model=_export(model, tmp_path / "hf"), tokenizer=smollm2_dir, kv_cache_config={"dtype": "auto"})
    try:
        prompts = [_prompt(length, seed) for seed, length in ((3, 5), (4, 11), (5, 16))]
        params = SamplingParams(max_tokens=10, temperature=0.0)
        outs = [llm.generate_async(p, params) for p in prompts]  # submitted together: batched in flight
        for prompt, out in zip(prompts, outs, strict=True):
            assert out.result(timeout=120).outputs[0].token_ids == _reference_tokens(model, prompt, 10)
    finally:
        llm.shutdown()


def test_llm_api_checks_max_attention_window_against_the_models_windows(tmp_path: Path) -> None:
    """model.yaml's kv_cache_config.max_attention_window (what trtkv writes for a sliding-window hybrid, repeated over
    the layers as TensorRT-LLM reads it) is applied: the model's own windows load; any other window is refused, since
    the reference engine's cache keeps each layer's own window only."""
    from trtkv.runtime.errors import RequestError
    from trtkv.runtime.llm import LLM

    hf = _export(tiny_gemma3(window=6), tmp_path / "hf")  # layers sliding, sliding, full, sliding; 256 positions
    for same in ([6, 6, 256, 6], [6, 6, 4096]):  # the second repeats to 6, 6, 4096, 6 and is capped at max_seq_len
        llm = LLM(model=hf, kv_cache_config={"dtype": "auto", "max_attention_window": same}, max_seq_len=256)
        try:
            assert not any("max_attention_window" in a for a in llm.ignored_args)
        finally:
            llm.shutdown()
    for windows in ([6], [6, 6, 128, 6], [6, 6, 256, 256], [0]):  # full layer 6; full layer short; window lost; bad
        with pytest.raises(RequestError, match="max_attention_window"):
            LLM(model=hf, kv_cache_config={"max_attention_window": windows}, max_seq_len=256)
