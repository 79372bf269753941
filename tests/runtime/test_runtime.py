"""The CPU reference runtime: checkpoint mapping, FP8 weight dequantization, generation against transformers,
sampling, stop conditions, streaming callback, concurrent requests, and the FP8-KV quiz agreement (slow)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.trtllm_state import hf_to_trtllm_state_dict
from trtkv.checkpoints import rope  # noqa: E402
from trtkv.core.errors import StageError  # noqa: E402
from trtkv.runtime import LogitControls, ReferenceRuntime, trtllm_to_hf_state_dict
from trtkv.runtime.checkpoint import checkpoint_architecture
from trtkv.runtime.errors import RequestError
from trtkv.runtime.sampling import pick_token

FP8_MAX = 448.0
LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")


# ---------------------------------------------------------------------------------------------
# Helpers (also used by test_build.py): small TensorRT-LLM checkpoints written the way ModelOpt exports them


def tiny_llama(seed: int = 0, vocab: int = 128, layers: int = 2, rope_parameters: dict | None = None) -> Any:
    """A random float32 LlamaForCausalLM small enough for unit tests (no eos: generation runs to max_tokens)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # larger weights than the default init, so logits are not near-uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = weight.abs().max().float() / FP8_MAX
    return (weight.float() / scale).to(torch.float8_e4m3fn), scale.reshape(1)


def write_hf_export(model: Any, out: Path, *, weights: str = "fp8", kv: str | None = "FP8",
                    kv_scale: float = 0.05) -> Path:
    """ModelOpt's unified HF export layout: config.json, model.safetensors (FP8 projections with weight_scale and
    input_scale, per-layer k_proj.k_scale / v_proj.v_scale) and hf_quant_config.json."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if weights == "fp8" and name.startswith("model.layers.") and name.endswith("_proj.weight"):
            base = name[: -len("weight")]
            tensors[name], scale = _fp8(tensor.detach())
            tensors[base + "weight_scale"] = scale.reshape(())
            tensors[base + "input_scale"] = torch.tensor(1.0)
        else:
            tensors[name] = tensor.detach().float().contiguous()
    if kv:
        for i in range(cfg.num_hidden_layers):
            tensors[f"model.layers.{i}.self_attn.k_proj.k_scale"] = torch.tensor(kv_scale)
            tensors[f"model.layers.{i}.self_attn.v_proj.v_scale"] = torch.tensor(kv_scale / 2)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({**cfg.to_dict(), "architectures": ["LlamaForCausalLM"]}, indent=2))
    if weights == "fp8" or kv:
        quant = {"quant_algo": "FP8" if weights == "fp8" else None, "kv_cache_quant_algo": kv}
        (out / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quant}))
    return out


def write_checkpoint(model: Any, out: Path, *, weights: str = "none", kv: str | None = None,
                     kv_factor: float = 1.0, dtype: str = "float32") -> Path:
    """config.json + rank0.safetensors (+ kv_scales.json, manifest.json) in the ModelOpt/TensorRT-LLM layout."""
    cfg = model.config
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if "lm_head.weight" not in state or cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    tensors = {k: v.to(getattr(torch, dtype)) for k, v in hf_to_trtllm_state_dict(state, cfg).items()}
    if weights == "fp8":
        for i in range(cfg.num_hidden_layers):
            for base in LINEARS:
                name = f"transformer.layers.{i}.{base}"
                q, scale = _fp8(tensors[f"{name}.weight"])
                tensors[f"{name}.weight"] = q
                tensors[f"{name}.weights_scaling_factor"] = scale
                tensors[f"{name}.activation_scaling_factor"] = torch.ones(1)
    if kv:
        for i in range(cfg.num_hidden_layers):
            for which in ("k", "v", "kv"):
                tensors[f"transformer.layers.{i}.attention.{which}_cache_scaling_factor"] = torch.tensor([kv_factor])
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "rank0.safetensors"))
    config = {
        "producer": {"name": "trtkv-tests"}, "architecture": "LlamaForCausalLM", "decoder": "llama", "dtype": dtype,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size, "head_size": cfg.head_dim,
        "norm_epsilon": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": cfg.hidden_act, "share_embedding_table": False, "rmsnorm": True,
        "position_embedding_type": "rope_gpt_neox", **rope.trtllm_fields(rope.from_hf(cfg.to_dict())),
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {"quant_algo": "FP8" if weights == "fp8" else None,
                         "kv_cache_quant_algo": kv, "exclude_modules": ["lm_head"]},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if kv:
        layers = [{"layer": i, "k_amax": 1.0, "v_amax": 1.0, "kv_cache_scaling_factor": kv_factor, "k_scale": 1.0,
                   "v_scale": 1.0} for i in range(cfg.num_hidden_layers)]
        (out / "kv_scales.json").write_text(json.dumps({"kv_cache_quant_algo": kv, "num_layers": len(layers),
                                                        "convention": "test", "layers": layers}))
    (out / "manifest.json").write_text(json.dumps({"stage": "calibrate", "written_by": "trtkv tests"}))
    return out


def write_engine(ckpt: Path, engine: Path, model: Any, tokenizer: Path | None = None, max_seq_len: int = 256) -> Path:
    """What `trtkv build` writes for backend reference: runtime.json + hf_config.json."""
    engine.mkdir(parents=True, exist_ok=True)
    (engine / "hf_config.json").write_text(model.config.to_json_string())
    (engine / "runtime.json").write_text(json.dumps({
        "backend": "reference", "checkpoint": str(ckpt), "tokenizer": str(tokenizer) if tokenizer else None,
        "hf_config": "hf_config.json", "max_seq_len": max_seq_len}))
    return engine


def has_quantized_cache() -> bool:
    try:
        from trtkv.kvcache.cache import QuantizedKVCache  # noqa: F401
    except ImportError:
        return False
    return True


needs_cache = pytest.mark.skipif(not has_quantized_cache(), reason="trtkv.kvcache.cache (kvcache task) not present yet")


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread: None) -> None:
    """Tiny models run fastest single-threaded (shared fixture in tests/conftest.py)."""


@pytest.fixture(scope="module")
def tiny() -> Any:
    return tiny_llama()


@pytest.fixture(scope="module")
def tiny_runtime(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> ReferenceRuntime:
    root = tmp_path_factory.mktemp("tiny")
    ckpt = write_checkpoint(tiny, root / "checkpoint")
    return ReferenceRuntime.load(write_engine(ckpt, root / "engine", tiny))


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0, len(prompt):]]


# ---------------------------------------------------------------------------------------------
# Mapping and numerics


def test_name_mapping_round_trips(tiny: Any) -> None:
    state = tiny.state_dict()
    back = trtllm_to_hf_state_dict(hf_to_trtllm_state_dict(state, tiny.config), tiny.config)
    assert set(back) == set(state)
    for name, tensor in state.items():
        assert torch.equal(back[name], tensor.float()), name


def test_fp8_weights_are_dequantized_with_their_scales(tiny: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    ckpt = write_checkpoint(tiny, tmp_path / "ck", weights="fp8")
    tensors = load_file(str(ckpt / "rank0.safetensors"))
    assert tensors["transformer.layers.0.attention.qkv.weight"].dtype == torch.float8_e4m3fn
    got = trtllm_to_hf_state_dict(tensors, tiny.config)
    for name, ref in tiny.state_dict().items():
        err = (got[name] - ref).abs().max().item()
        # FP8 E4M3 has a 3-bit mantissa: error <= 1/16 of the value, and the tensor amax bounds it
        assert err <= ref.abs().max().item() / 15, f"{name}: {err}"
        assert err > 0 or "norm" in name or "embed" in name or "lm_head" in name, f"{name} was not quantized"


def test_unknown_tensors_are_an_error(tiny: Any) -> None:
    tensors = hf_to_trtllm_state_dict(tiny.state_dict(), tiny.config)
    tensors["transformer.layers.0.attention.qkv.bias"] = torch.zeros(4)
    with pytest.raises(Exception, match="does not map"):
        trtllm_to_hf_state_dict(tensors, tiny.config)


# ---------------------------------------------------------------------------------------------
# Generation


def test_greedy_matches_transformers_token_for_token(tiny: Any, tiny_runtime: ReferenceRuntime) -> None:
    assert tiny_runtime.kv_format == "none"
    for prompt in ([5, 17, 99, 3], [42], list(range(1, 30))):
        assert tiny_runtime.generate(prompt, max_tokens=20) == hf_greedy(tiny, prompt, 20)


def test_fp8_weight_checkpoint_matches_transformers_on_dequantized_weights(tiny: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    ckpt = write_checkpoint(tiny, tmp_path / "ck", weights="fp8")
    runtime = ReferenceRuntime.load(write_engine(ckpt, tmp_path / "engine", tiny))
    ref = LlamaForCausalLM(tiny.config).eval()
    ref.load_state_dict(trtllm_to_hf_state_dict(load_file(str(ckpt / "rank0.safetensors")), tiny.config))
    ref.generation_config.pad_token_id = 0
    prompt = [7, 8, 9, 10]
    assert runtime.generate(prompt, max_tokens=16) == hf_greedy(ref, prompt, 16)


# ---------------------------------------------------------------------------------------------
# The checkpoint's config.json is the architecture, read with TensorRT-LLM's defaults


def last_logits(runtime: ReferenceRuntime, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return runtime.model(input_ids=torch.tensor([prompt])).logits[0, -1]


def edited_checkpoint(ckpt: Path, out: Path, **changes: Any) -> Path:
    """A copy of `ckpt` whose config.json has `changes` applied (None removes a key)."""
    import shutil

    shutil.copytree(ckpt, out)
    config = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_architecture_comes_from_the_checkpoint_not_the_hf_config(tiny: Any, tmp_path: Path) -> None:
    """An HF config that disagrees (rope, norm eps) changes nothing: TensorRT-LLM never reads it."""
    ckpt = write_checkpoint(tiny, tmp_path / "ck")
    engine = write_engine(ckpt, tmp_path / "engine", tiny)
    lying = {**tiny.config.to_dict(), "rope_parameters": {"rope_type": "default", "rope_theta": 1.0},
             "rms_norm_eps": 0.5}
    (engine / "hf_config.json").write_text(json.dumps(lying))
    runtime = ReferenceRuntime.load(engine)
    assert runtime.config.rope_parameters["rope_theta"] == 10000.0 and runtime.config.rms_norm_eps == tiny.config.rms_norm_eps
    prompt = list(range(1, 40))
    assert runtime.generate(prompt, max_tokens=12) == hf_greedy(tiny, prompt, 12)


def test_far_off_rotary_base_turns_the_output_to_garbage(tiny: Any, tiny_runtime: ReferenceRuntime,
                                                          tmp_path: Path) -> None:
    ckpt = write_checkpoint(tiny, tmp_path / "ck")
    bad = edited_checkpoint(ckpt, tmp_path / "bad", rotary_base=1.0)
    off = ReferenceRuntime.load(write_engine(bad, tmp_path / "engine", tiny))
    prompt = list(range(1, 60))
    assert off.generate(prompt, max_tokens=12) != tiny_runtime.generate(prompt, max_tokens=12)
    missing = ReferenceRuntime.load(write_engine(edited_checkpoint(ckpt, tmp_path / "default", rotary_base=None),
                                                 tmp_path / "engine2", tiny))
    assert missing.config.rope_parameters["rope_theta"] == 10000.0  # TensorRT-LLM's default when absent


def test_llama3_rope_scaling_is_applied_as_transformers_does(tmp_path: Path) -> None:
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    model = tiny_llama(rope_parameters=llama3)
    ckpt = write_checkpoint(model, tmp_path / "ck")
    assert json.loads((ckpt / "config.json").read_text())["rotary_scaling"]["type"] == "llama3"
    runtime = ReferenceRuntime.load(write_engine(ckpt, tmp_path / "engine", model))
    prompt = list(range(1, 120))
    with torch.inference_mode():
        want = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    got = last_logits(runtime, prompt)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-4 * scale  # same float32 maths, only summation order differs
    unscaled = ReferenceRuntime.load(write_engine(edited_checkpoint(ckpt, tmp_path / "plain", rotary_scaling=None),
                                                  tmp_path / "engine2", model))
    assert (last_logits(unscaled, prompt) - want).abs().max().item() > 1e-2 * scale


def test_missing_keys_take_trtllm_defaults_and_non_llama_is_refused(tmp_path: Path) -> None:
    where = tmp_path / "config.json"
    minimal = {"architecture": "LlamaForCausalLM", "dtype": "float32", "num_hidden_layers": 2,
               "num_attention_heads": 4, "hidden_size": 64, "vocab_size": 128, "hidden_act": "silu",
               "position_embedding_type": "rope_gpt_neox"}
    arch = checkpoint_architecture(minimal, where)
    assert (arch["num_key_value_heads"], arch["head_size"], arch["intermediate_size"]) == (4, 16, 256)
    assert (arch["norm_epsilon"], arch["rotary_base"], arch["rotary_scaling"]) == (1e-5, 10000.0, None)
    for change, words in (({"position_embedding_type": None}, "learned_absolute"), ({"attn_bias": True}, "attn_bias"),
                          ({"rotary_pct": 0.5}, "partial rotary"), ({"hidden_act": None}, "gelu"),
                          ({"vocab_size": None}, "vocab_size missing")):
        config = {k: v for k, v in {**minimal, **change}.items() if v is not None}
        with pytest.raises(StageError, match=words):
            checkpoint_architecture(config, where)


def test_chunked_prefill_gives_the_same_tokens(tiny: Any, tmp_path: Path) -> None:
    ckpt = write_checkpoint(tiny, tmp_path / "ck")
    engine = write_engine(ckpt, tmp_path / "engine", tiny)
    settings = json.loads((engine / "runtime.json").read_text())
    (engine / "runtime.json").write_text(json.dumps({**settings, "enable_chunked_context": True, "max_num_tokens": 8}))
    chunked = ReferenceRuntime.load(engine)
    assert chunked.prefill_chunk == 8
    prompt = list(range(1, 30))
    assert chunked.generate(prompt, max_tokens=12) == hf_greedy(tiny, prompt, 12)


def test_logit_controls_follow_tensorrt_llm_semantics() -> None:
    logits = torch.tensor([1.0, -1.0, 2.0, 0.5])
    seq = [0, 1, 1]
    rep = LogitControls(repetition_penalty=2.0).apply(logits, seq, 5, set())
    assert rep.tolist() == [0.5, -2.0, 2.0, 0.5]  # positive / 2, negative * 2, unseen unchanged
    pf = LogitControls(presence_penalty=0.25, frequency_penalty=0.5).apply(logits, seq, 5, set())
    assert pf.tolist() == [1.0 - 0.25 - 0.5, -1.0 - 0.25 - 1.0, 2.0, 0.5]
    early = LogitControls(min_tokens=2).apply(logits, seq, 1, {3})
    assert early[3] == float("-inf") and LogitControls(min_tokens=2).apply(logits, seq, 2, {3})[3] == 0.5
    bad = LogitControls(bad_words=[[2], [1, 3], [0, 3]]).apply(logits, seq, 5, set())
    assert bad[2] == float("-inf") and bad[3] == float("-inf")  # [1, 3]: the sequence ends with 1
    assert LogitControls(bad_words=[[0, 3]]).apply(logits, seq, 5, set())[3] == 0.5  # ends with 1, not 0
    biased = LogitControls(embedding_bias=[0.0, 0.0, -5.0, 1.0]).add_bias(logits)
    assert biased.tolist() == [1.0, -1.0, -3.0, 1.5]
    with pytest.raises(RequestError, match="exactly one per token"):
        LogitControls(embedding_bias=[0.0, 1.0]).add_bias(logits)
    assert not LogitControls().active


def test_generate_honours_controls_and_reports_log_probs(tiny_runtime: ReferenceRuntime) -> None:
    prompt = [3, 1, 4, 1, 5]
    full = tiny_runtime.generate(prompt, max_tokens=8)
    banned = tiny_runtime.generate(prompt, max_tokens=8, controls=LogitControls(bad_words=[[full[0]]]))
    assert banned[0] != full[0] and full[0] not in banned
    ended = tiny_runtime.generate(prompt, max_tokens=8, end_id=full[1])
    assert len(ended) == 1
    held = tiny_runtime.generate(prompt, max_tokens=8, end_id=full[1], controls=LogitControls(min_tokens=4))
    assert len(held) >= 4 and held[:1] == full[:1]
    lps: list[float] = []
    assert tiny_runtime.generate(prompt, max_tokens=8, log_probs=lps) == full
    assert len(lps) == 8 and all(lp <= 0 for lp in lps)
    with pytest.raises(RequestError, match="min_tokens"):
        tiny_runtime.generate(prompt, max_tokens=2, controls=LogitControls(min_tokens=3))


def test_temperature_comes_before_the_penalties(tiny_runtime: ReferenceRuntime) -> None:
    """TensorRT-LLM scales by 1/temperature, then subtracts presence/frequency penalties: l/T - p, not (l - p)/T."""
    prompt = [3, 1, 4, 1, 5]
    controls = LogitControls(presence_penalty=0.7)
    seen: list[float] = []
    (token,) = tiny_runtime.generate(prompt, max_tokens=1, temperature=2.0, seed=1, controls=controls, log_probs=seen)
    with torch.inference_mode():
        raw = tiny_runtime.model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    trt_order = torch.log_softmax(controls.apply(raw / 2.0, prompt, 0, set()), dim=-1)[token]
    other_order = torch.log_softmax(controls.apply(raw, prompt, 0, set()) / 2.0, dim=-1)[token]
    assert abs(float(trt_order) - float(other_order)) > 1e-3  # the orders differ here, so the next line can fail
    assert seen == [pytest.approx(float(trt_order), abs=1e-4)]


def test_stop_conditions_and_streaming(tiny_runtime: ReferenceRuntime) -> None:
    prompt = [3, 1, 4, 1, 5]
    full = tiny_runtime.generate(prompt, max_tokens=12)
    assert len(full) == 12
    assert tiny_runtime.generate(prompt, max_tokens=5) == full[:5]
    assert tiny_runtime.generate(prompt, max_tokens=12, end_id=full[4]) == full[: full.index(full[4])]
    assert tiny_runtime.generate(prompt, max_tokens=12, stop_words=[full[2:4]]) == full[:4]
    seen: list[int] = []
    assert tiny_runtime.generate(prompt, max_tokens=12, on_token=seen.append) == full == seen
    cancelled = tiny_runtime.generate(prompt, max_tokens=12, on_token=lambda t: len(seen) < 0)
    assert cancelled == full[:1]


def test_sampling_is_seeded_and_restricted(tiny_runtime: ReferenceRuntime) -> None:
    prompt = [11, 12, 13]
    greedy = tiny_runtime.generate(prompt, max_tokens=10)
    a = tiny_runtime.generate(prompt, max_tokens=10, temperature=1.5, seed=7)
    assert a == tiny_runtime.generate(prompt, max_tokens=10, temperature=1.5, seed=7)
    others = {tuple(tiny_runtime.generate(prompt, max_tokens=10, temperature=1.5, seed=s)) for s in range(5)}
    assert len(others) > 1
    assert tiny_runtime.generate(prompt, max_tokens=10, temperature=1.5, top_k=1, seed=3) == greedy
    assert tiny_runtime.generate(prompt, max_tokens=10, temperature=1.0, top_p=1e-6, seed=3) == greedy


def test_pick_token_top_k_and_top_p() -> None:
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0, 1.0])
    gen = torch.Generator().manual_seed(0)
    picks = {pick_token(logits, 1.0, 2, 1.0, gen) for _ in range(200)}
    assert picks == {1, 2}
    # probabilities ~ [.02, .47, .43, .01, .06]: nucleus 0.4 is token 1 alone, 0.5 needs token 2 as well
    assert {pick_token(logits, 1.0, 0, 0.4, gen) for _ in range(200)} == {1}
    assert {pick_token(logits, 1.0, 0, 0.5, gen) for _ in range(200)} == {1, 2}
    assert pick_token(logits, 0.0, 0, 1.0, gen) == 1


def test_bad_requests_are_clear(tiny_runtime: ReferenceRuntime) -> None:
    with pytest.raises(RequestError, match="empty"):
        tiny_runtime.generate([], max_tokens=3)
    with pytest.raises(RequestError, match="max_seq_len"):
        tiny_runtime.generate([1] * 300, max_tokens=3)
    with pytest.raises(RequestError, match="out of range"):
        tiny_runtime.generate([100000], max_tokens=3)
    with pytest.raises(RequestError, match="top_p"):
        tiny_runtime.generate([1], max_tokens=3, top_p=0.0)
    assert len(tiny_runtime.generate([1] * 250, max_tokens=50)) == 6  # clamped to max_seq_len 256


def test_concurrent_requests_do_not_mix(tiny_runtime: ReferenceRuntime) -> None:
    requests = [([1, 2, 3], {}), ([9, 8], {"temperature": 1.2, "seed": 5}), ([50, 60, 70, 80], {}),
                ([4], {"temperature": 0.8, "top_k": 5, "seed": 1})]
    alone = [tiny_runtime.generate(p, max_tokens=16, **kw) for p, kw in requests]
    results: dict[int, list[int]] = {}
    streamed: dict[int, list[int]] = {i: [] for i in range(len(requests))}

    def worker(i: int) -> None:
        prompt, kw = requests[i]
        results[i] = tiny_runtime.generate(prompt, max_tokens=16, on_token=streamed[i].append, **kw)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(requests))] == alone
    assert [streamed[i] for i in range(len(requests))] == alone


def test_missing_runtime_json_is_clear(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="runtime.json: missing"):
        ReferenceRuntime.load(tmp_path)


# ---------------------------------------------------------------------------------------------
# Quantized KV cache (needs trtkv.kvcache.cache from the kvcache task)


def decode_logits(runtime: ReferenceRuntime, prompt: list[int], steps: int = 3) -> torch.Tensor:
    """Logits of `steps` greedy decode steps after the prompt, read back through the runtime's own KV cache."""
    cache = runtime.new_cache()
    out = []
    with torch.inference_mode():
        step = torch.tensor([prompt])
        for _ in range(steps):
            logits = runtime.model(input_ids=step, past_key_values=cache, use_cache=True).logits[0, -1]
            out.append(logits.clone())
            step = torch.tensor([[int(torch.argmax(logits))]])
    return torch.stack(out)


@needs_cache
def test_fp8_kv_runtime_uses_checkpoint_scales(tiny: Any, tmp_path: Path) -> None:
    """The per-layer kv_cache_scaling_factor reaches the cache: 0.02 clips this model's K/V (|x| > 448 x 0.02), 1.0
    does not, so the decode logits must differ between the two checkpoints (and from the unquantized cache)."""
    small = write_checkpoint(tiny, tmp_path / "ck_small", weights="fp8", kv="FP8", kv_factor=0.02)
    one = write_checkpoint(tiny, tmp_path / "ck_one", weights="fp8", kv="FP8", kv_factor=1.0)
    runtime = ReferenceRuntime.load(write_engine(small, tmp_path / "engine_small", tiny))
    unit = ReferenceRuntime.load(write_engine(one, tmp_path / "engine_one", tiny))
    assert runtime.kv_format == "fp8" and runtime.kv_scales == pytest.approx([0.02, 0.02])
    assert unit.kv_scales == [1.0, 1.0]
    assert type(runtime.new_cache()).__name__ == "QuantizedKVCache"
    prompt = [5, 6, 7, 8, 9]
    small_logits, one_logits = decode_logits(runtime, prompt), decode_logits(unit, prompt)
    none_logits = decode_logits(runtime.with_kv_format("none"), prompt)
    assert (small_logits - one_logits).abs().max() > 1e-2, "the checkpoint's KV scale made no difference"
    assert (small_logits - none_logits).abs().max() > 1e-2
    out = unit.generate(prompt, max_tokens=12)
    base = unit.with_kv_format("none").generate(prompt, max_tokens=12)
    assert len(out) == 12
    assert sum(a == b for a, b in zip(out, base, strict=True)) >= 6  # FP8 KV at scale 1.0 rarely flips tokens


@needs_cache
def test_calibrated_and_built_checkpoint_matches_transformers(tmp_path: Path, engines_tmp: Path) -> None:
    """The whole chain on a tiny random Llama: ModelOpt export (trtkv.calibrate) -> trtkv build (reference) ->
    ReferenceRuntime. With an unquantized KV cache and unquantized weights its greedy tokens and logits equal
    transformers' on the original model, so the TensorRT-LLM name mapping (fc = gate_proj, gate = up_proj, the
    fused q/k/v split) is checked against ModelOpt's real export, not against our own inverse mapping."""
    from tests.calibrate.test_calibrate import quiet, tiny_tokenizer, write_recipe
    from trtkv.build.stage import build
    from trtkv.calibrate import calibrate
    from trtkv.recipe import load_recipe

    model = tiny_llama(vocab=256, layers=2)
    with torch.no_grad():  # bfloat16-representable weights: the bfloat16 export is then lossless
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model_dir = tmp_path / "tiny_hf"
    model.save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    recipe = load_recipe(write_recipe(tmp_path, model_dir, "tiny_chain", kv="fp8", weights="none", samples=4,
                                      dtype="bfloat16", layers=2))
    calibrate(recipe, log=quiet)
    engine = build(recipe, log=quiet).output
    runtime = ReferenceRuntime.load(engine, threads=1)
    assert runtime.kv_format == "fp8" and len(runtime.kv_scales or []) == 2
    plain = runtime.with_kv_format("none")
    for prompt in ([5, 17, 99, 3], list(range(40, 70))):
        assert plain.generate(prompt, max_tokens=16) == hf_greedy(model, prompt, 16)
        with torch.inference_mode():
            want = model(torch.tensor([prompt])).logits[0]
            got = plain.model(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(runtime.generate([5, 17, 99, 3], max_tokens=8)) == 8  # and the calibrated FP8 cache decodes


@needs_cache
def test_int8_kv_runtime_runs(tiny: Any, tmp_path: Path) -> None:
    ckpt = write_checkpoint(tiny, tmp_path / "ck", kv="INT8", kv_factor=0.05)
    runtime = ReferenceRuntime.load(write_engine(ckpt, tmp_path / "engine", tiny))
    assert runtime.kv_format == "int8" and runtime.kv_scales == pytest.approx([0.05, 0.05])
    assert len(runtime.generate([1, 2, 3], max_tokens=8)) == 8


# ---------------------------------------------------------------------------------------------
# The real model (SmolLM2-135M-Instruct)


@pytest.fixture(scope="module")
def smollm2_model(smollm2_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.mark.e2e  # runs the real model: not in `make check`
@pytest.mark.slow
def test_smollm2_unquantized_matches_transformers(smollm2_model: Any, smollm2_dir: Path, tmp_path: Path) -> None:
    ckpt = write_checkpoint(smollm2_model, tmp_path / "ck", dtype="bfloat16")  # bf16 on disk: lossless
    runtime = ReferenceRuntime.load(write_engine(ckpt, tmp_path / "engine", smollm2_model, smollm2_dir, 4096))
    ids = runtime.tokenizer("Q: What is the capital of France?\nA:", add_special_tokens=False)["input_ids"]
    got = runtime.generate(ids, max_tokens=16, end_id=-1)
    assert got == hf_greedy(smollm2_model, ids, 16)
    assert "Paris" in runtime.tokenizer.decode(got)


@pytest.mark.e2e  # runs the real model: not in `make check`
@pytest.mark.slow
@needs_cache
def test_smollm2_fp8_kv_quiz_agreement(smollm2_model: Any, smollm2_dir: Path, tmp_path: Path) -> None:
    """FP8 weights + FP8 KV (scale 1.0, what TensorRT-LLM's clamped factor gives on SmolLM2) vs unquantized KV."""
    from trtkv.core.texts import quiz_items
    from trtkv.runtime.quiz import quiz_agreement

    ckpt = write_checkpoint(smollm2_model, tmp_path / "ck", weights="fp8", kv="FP8", dtype="bfloat16")
    runtime = ReferenceRuntime.load(write_engine(ckpt, tmp_path / "engine", smollm2_model, smollm2_dir, 4096))
    result = quiz_agreement(runtime, quiz_items()[:12], max_tokens=8)
    print(f"FP8 KV vs unquantized KV greedy quiz agreement: {result['agree']}/{result['items']}")
    assert result["agreement"] >= 0.6, result["differences"]
