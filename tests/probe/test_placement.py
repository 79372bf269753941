"""Where the probe runs the model: the placement over GPUs from their memory (balanced layers, each with its KV and
working memory; offload to the CPU when asked), the dry run of the recipe's hardware from the config alone checked
against the planner's numbers, and a model dispatched by an explicit accelerate device map with an offloaded layer
(the hooks move its weights in, as a second device would) computing what the plain model computes, its quantized
cache layer by layer where that layer ran."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.models import tiny_llama
from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.formats import KVFormat
from trtkv.probe.placement import dry_run, plan_placement
from trtkv.probe.setup import default_settings
from trtkv.recipe import load_recipe
from trtkv.units import GIB


def _config():  # noqa: ANN202
    return tiny_llama(6, 2, 64, 4096).config


def test_layers_are_balanced_over_the_gpus_with_their_kv_and_working_memory() -> None:
    config = _config()
    roomy = plan_placement(config, "bfloat16", 2048, {"cuda:0": 2 * GIB, "cuda:1": 2 * GIB}, 512)
    assert roomy.fits, roomy.lines()
    layers = [d.layers for d in roomy.devices]
    assert layers == [[0, 1, 2], [3, 4, 5]]  # balanced by bytes, in order
    assert roomy.device_map["model.embed_tokens"] == "cuda:0" and roomy.device_map["lm_head"] == "cuda:1"
    per_layer_kv = 2 * 2 * 64 * 2 * 2048  # K and V x KV heads x head_dim x bf16 bytes x tokens
    assert [d.kv_bytes for d in roomy.devices] == [3 * per_layer_kv] * 2
    assert roomy.devices[1].work_bytes > roomy.devices[0].work_bytes  # the LM head's logits and hidden states


def test_what_no_gpu_holds_is_offloaded_only_when_asked() -> None:
    from trtkv.probe.placement import layer_kv_bytes, meta_model, module_sizes, work_bytes

    config = _config()
    _, layers, others = module_sizes(meta_model(config, "bfloat16"), "bfloat16")
    kv = layer_kv_bytes(config, "bfloat16", 2048)
    # room for the working memory, the embedding and head, and three of the six layers
    room = work_bytes(config, "bfloat16", 2048, 512, True) + sum(others.values()) + 3.5 * (layers[0] + kv[0])
    tight = {"cuda:0": room}
    refused = plan_placement(config, "bfloat16", 2048, tight, 512)
    assert not refused.fits and "cuda:0 needs" in refused.why
    offloaded = plan_placement(config, "bfloat16", 2048, tight, 512, offload=True, host_bytes=64 * GIB)
    assert offloaded.fits, offloaded.lines()
    on_cpu = [int(k.rsplit(".", 1)[1]) for k, v in offloaded.device_map.items() if v == "cpu"]
    assert on_cpu and on_cpu == sorted(on_cpu) and on_cpu[-1] == 5  # the tail of the stack
    assert offloaded.device_map["lm_head"] == "cuda:0"


def test_dry_run_of_llama70b_at_32k_on_4_h100_fits_and_agrees_with_the_planner() -> None:
    from trtkv.plan.model import resolve_architecture, seq_bytes

    recipe = load_recipe("llama70b_fp8kv")
    settings = default_settings(recipe, lengths=[32768], cuda=True)
    placement, lines = dry_run(recipe, settings)
    assert placement.fits, lines
    assert [d.device for d in placement.devices] == [f"cuda:{i}" for i in range(4)]
    assert sum(len(d.layers) for d in placement.devices) == 80
    arch = resolve_architecture(recipe)
    # the planner's parameter count (the recipe's 70.6e9, three significant figures) x bf16 bytes
    assert placement.weights_bytes == pytest.approx(arch.parameters() * 2, rel=0.05 / 70.6)
    assert placement.kv_bytes == pytest.approx(seq_bytes(arch, [KVFormat.BF16] * arch.num_layers, 32768))
    assert any("trtllm_fp8_fmha_sm90" in line for line in lines)
    assert all(d.total_bytes < d.capacity_bytes for d in placement.devices)


def test_dry_run_cli_prints_the_plan_and_exits_1_when_it_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    assert main(["probe", "llama70b_fp8kv", "--lengths", "32768", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "cuda:3: layers" in out
    assert main(["probe", "llama70b_fp8kv", "hardware.count=1", "build.tp_size=1", "--lengths", "32768",
                 "--dry-run"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_an_offloaded_layer_computes_what_the_plain_model_does_and_its_cache_follows_it(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    plain = tiny_llama(3, 2, 64, 512, seed=4)
    plain.save_pretrained(tmp_path / "model")
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.layers.2": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    placed = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32, device_map=device_map,
                                                  offload_folder=str(tmp_path / "offload")).eval()
    assert getattr(placed.model.layers[1], "_hf_hook", None) is not None  # accelerate moves its weights in per call
    assert placed.model.layers[1].self_attn.q_proj.weight.device.type == "meta"  # held on disk, not in the module
    ids = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want = plain(ids, past_key_values=QuantizedKVCache(plain.config, "int8_token"), use_cache=True).logits
        cache = QuantizedKVCache(placed.config, "int8_token")
        got = placed(ids, past_key_values=cache, use_cache=True).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert all(t.device.type == "cpu" for layer in cache.qlayers for t in layer.k_store.view().values())  # where it ran
    assert [layer.stored_tokens for layer in cache.qlayers] == [40, 40, 40]


def test_the_baseline_is_the_models_16_bit_dtype_on_gpus_and_fp16_on_the_cpu() -> None:
    """bf16 weights on GPUs keep a bf16 baseline cache (named bf16 in probe.json and its cache files); the CPU's
    float32 run keeps the fp16 baseline it always had, so its cached results and old probe.json stay valid."""
    recipe = load_recipe("llama70b_fp8kv")
    gpu = default_settings(recipe, lengths=[1024], cuda=True)
    cpu = default_settings(load_recipe("smollm2_fp8kv"), lengths=[512], cuda=False)
    assert (gpu.dtype, gpu.formats[0], gpu.prefill_chunk) == ("bfloat16", "bf16", 2048)
    assert (cpu.dtype, cpu.formats[0], cpu.prefill_chunk) == ("float32", "fp16", None)
    assert default_settings(recipe, lengths=[1024], cuda=True).attention == ["cache_only", "trtllm_fp8_fmha_sm90"]
    forced = default_settings(load_recipe("llama70b_fp8kv", ["probe.dtype=float32"]), lengths=[1024], cuda=True)
    assert (forced.dtype, forced.formats[0]) == ("float32", "fp16")
