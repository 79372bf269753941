"""trtkv/data/kv_scale_loaders.json against the engines themselves: the pairing tables are complete, and
the installed vLLM 0.32.0 and SGLang 0.5.23 (their own venvs; SGLang's class and function run from its
installed source, its package not importing on this CPU) do what the table says with every class of K
and V value (their BaseKVCacheMethod.process_weights_after_loading on a layer holding those values) and
with every scale name the tests inject (vLLM's AutoWeightsLoader name map for Llama; SGLang's
maybe_remap_kv_scale_name against a Llama attention's parameters)."""

from __future__ import annotations

import itertools
import json

import pytest

from tests.support import side_python
from trtkv.core import paths
from trtkv.engines.kv_scale_loaders import CLASSES, EngineScales, engine_scales

VALUES = {"positive": (0.05, 0.03), "zero": (0.0, 0.0), "negative": (-0.5, -0.5), "nan": ("nan", "nan"),
          "absent": (None, None)}
NAMES = [f"model.layers.0.{rest}" for rest in (
    "self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale", "self_attn.k_scale", "self_attn.v_scale",
    "self_attn.attn.k_scale", "self_attn.attn.v_scale", "self_attn.qkv_proj.k_scale", "self_attn.kv_scale",
    "self_attn.k_proj.v_scale", "mixer.k_proj.k_scale", "self_attn.k_cache.scale", "attention.k_scale",
    "self_attn.k_proj.output_scale", "self_attn.q_scale")]

VLLM_PAIRING = r"""
import json, sys, torch
from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
out = {}
for key, (k, v) in json.loads(sys.stdin.read()).items():
    layer = torch.nn.Module()
    layer.kv_cache_dtype = "fp8"
    for n in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale", "_k_scale_cpu", "_v_scale_cpu"):
        setattr(layer, n, torch.tensor(1.0))
    BaseKVCacheMethod(None).create_weights(layer)
    for param, value in ((layer.k_scale, k), (layer.v_scale, v)):
        if value is not None:
            param.data.fill_(float(value))
    try:
        BaseKVCacheMethod(None).process_weights_after_loading(layer)
        out[key] = [layer._k_scale_float, layer._v_scale_float]
    except AssertionError:
        out[key] = "crash"
print(json.dumps(out))
"""

# SGLang 0.5.23's srt package does not import in this CPU venv (sglang.kernels needs tvm_ffi), so its own
# source is read from the installed wheel and the one class / function run as written, with its imports
# stubbed: QuantizeMethodBase and QuantizationConfig as object, is_fp8_fnuz as False (CUDA), the warning
# printer as a no-op.
SGLANG_SOURCE = r"""
import ast, importlib.util, logging, pathlib, torch
root = pathlib.Path(importlib.util.find_spec("sglang").submodule_search_locations[0])

def engine_code(relative, name):
    text = (root / relative).read_text()
    node = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    scope = {"torch": torch, "logger": logging.getLogger("sglang"), "QuantizeMethodBase": object,
             "QuantizationConfig": object, "is_fp8_fnuz": lambda: False, "Optional": __import__("typing").Optional,
             "print_warning_once": lambda *a, **k: None}
    exec(compile(ast.Module([node], []), str(root / relative), "exec"), scope)
    return scope[name]
"""

SGLANG_PAIRING = SGLANG_SOURCE + r"""
import json, sys
BaseKVCacheMethod = engine_code("srt/layers/quantization/kv_cache.py", "BaseKVCacheMethod")
out = {}
for key, (k, v) in json.loads(sys.stdin.read()).items():
    layer = torch.nn.Module()
    BaseKVCacheMethod(None).create_weights(layer)
    for param, value in ((layer.k_scale, k), (layer.v_scale, v)):
        if value is not None:
            param.data.fill_(float(value))
    try:
        BaseKVCacheMethod(None).process_weights_after_loading(layer)
        out[key] = [layer.k_scale_float, layer.v_scale_float]
    except AssertionError:
        out[key] = "crash"
print(json.dumps(out))
"""

VLLM_NAMES = r"""
import json, re, sys
from vllm.model_executor.layers.quantization.modelopt import ModelOptFp8Config
from vllm.model_executor.models.llama import LlamaForCausalLM
names = json.loads(sys.stdin.read())
qc = ModelOptFp8Config.from_config({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})
mapper = LlamaForCausalLM.hf_to_vllm_mapper | qc.get_cache_scale_mapper()  # as AutoWeightsLoader combines them
print(json.dumps({n: mapper.map_name(n) for n in names}))
"""

SGLANG_NAMES = SGLANG_SOURCE + r"""
import json, sys
maybe_remap_kv_scale_name = engine_code("srt/model_loader/weight_utils.py", "maybe_remap_kv_scale_name")
names = json.loads(sys.stdin.read())
params = {f"model.layers.0.self_attn.attn.{k}_scale": None for k in "kv"}
params |= {f"model.layers.0.self_attn.{p}.weight": None for p in ("qkv_proj", "o_proj")}
print(json.dumps({n: maybe_remap_kv_scale_name(n, params) for n in names}))
"""


def engine_named(name: str) -> EngineScales:
    return next(row for row in engine_scales() if row.engine == name)


def cases() -> dict[str, list]:
    return {f"{k}/{v}": [VALUES[k][0], VALUES[v][1]] for k, v in itertools.product(CLASSES, CLASSES)}


def expected(engine: str, key: str) -> object:
    k, v = key.split("/")
    case = engine_named(engine).pair(k, v, "absent")
    kv, vv = VALUES[k][0], VALUES[v][1]
    return {"crash": "crash", "unity": [1.0, 1.0], "separate": [kv, vv], "k_for_both": [kv, kv]}[case.uses]


def test_every_pairing_table_covers_each_class_pair_once() -> None:
    for engine in engine_scales():
        if engine.reads == "hf":
            for k, v in itertools.product(CLASSES, CLASSES):
                hits = [c for c in engine.pairing if k in c.k and v in c.v]
                assert len(hits) == 1, (engine.engine, k, v, hits)
        else:
            assert all(sum(x in c.kv for c in engine.pairing) == 1 for x in CLASSES), engine.engine


def _run(python: str, code: str, payload: object, preload: str | list[str]) -> dict:
    result = side_python.run([python, "-c", code], input=json.dumps(payload), timeout=300, cwd="/", preload=preload)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _python(venv: str) -> str:
    python = paths.project_root() / venv / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} is missing: `make install-{venv.split('-')[-1]}` installs it")
    return str(python)


@pytest.mark.slow
def test_vllm_pairs_k_and_v_as_the_table_says() -> None:
    seen = _run(_python(".venv-vllm"), VLLM_PAIRING, cases(), "vllm")
    for key, got in seen.items():
        want = expected("vllm", key)
        assert got == want if want == "crash" else got == pytest.approx(want), (key, got, want)


@pytest.mark.slow
def test_sglang_pairs_k_and_v_as_the_table_says() -> None:
    seen = _run(_python(".venv-sglang"), SGLANG_PAIRING, cases(), ["torch"])
    for key, got in seen.items():
        want = expected("sglang", key)
        assert got == want if want == "crash" else got == pytest.approx(want), (key, got, want)


@pytest.mark.slow
def test_vllm_maps_names_as_the_table_says() -> None:
    """A name the table loads maps onto the attention's own parameter; one it crashes on maps elsewhere."""
    mapped = _run(_python(".venv-vllm"), VLLM_NAMES, NAMES, "vllm")
    loader = engine_named("vllm").loader_for("LlamaForCausalLM")
    assert loader is not None
    for name, target in mapped.items():
        rule = loader.rule_for(name)
        lands = target is not None and target.split(".")[-3:-1] == ["self_attn", "attn"]
        assert (rule.then == "load") == lands, (name, target, rule.then)
        if lands:
            assert target.rsplit(".", 1)[1] == f"{rule.kind_for(name, '?')}_scale", (name, target)


@pytest.mark.slow
def test_sglang_llama_remaps_names_as_the_table_says() -> None:
    mapped = _run(_python(".venv-sglang"), SGLANG_NAMES, NAMES, ["torch"])
    loader = engine_named("sglang").loader_for("LlamaForCausalLM")
    assert loader is not None
    params = {f"model.layers.0.self_attn.attn.{k}_scale" for k in "kv"}
    for name, target in mapped.items():
        rule = loader.rule_for(name)
        assert (rule.then == "load") == (target in params), (name, target, rule.then)
        if target in params:
            assert target.endswith(f".{rule.kind_for(name, '?')}_scale"), (name, target)
