"""Issue 51: `quantization.kv_cache none` on a checkpoint whose config declares a KV-cache quantization, where the
engine runs that declaration under the setting trtkv serves none with -- TensorRT-LLM's LLM API keeps the checkpoint's
kv_cache_quant_algo under kv_cache_config.dtype auto (FP8 at scale 1.0), vLLM 0.32 resolves --kv-cache-dtype auto to it
(FP8 with the checkpoint's scales) -- is refused by `trtkv init` and `trtkv plan` with the kv_cache that says what
runs. On main init wrote the recipe and plan priced a 16-bit cache the server would not hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.checkpoints.test_checkpoint_quant import CT_FP8_DYNAMIC, MODELOPT_FP8
from tests.support import side_python
from trtkv.backends.vllm_command import vllm_python
from trtkv.cli.init import write_recipe
from trtkv.core.errors import RecipeError
from trtkv.kvcache.formats import KVFormat
from trtkv.plan.planner import plan
from trtkv.recipe import Backend, load_recipe
from trtkv.recipe.backend_rules import BACKEND_ROWS

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
CT_FP8_PER_TENSOR_KV = {**CT_FP8_DYNAMIC, "kv_cache_scheme": {**CT_FP8_DYNAMIC["kv_cache_scheme"], "strategy": "tensor"}}
LEGACY = {"producer": {"name": "modelopt", "version": "0.47.0"},
          "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}


def _checkpoint(folder: Path, quant: dict | None, legacy: dict | None = None) -> Path:
    """Llama-3.1-8B's config.json with `quant` as its quantization_config (ModelOpt >= 0.31 and llm-compressor write it
    there) and `legacy` as hf_quant_config.json (ModelOpt's own file, which TensorRT-LLM reads first)."""
    folder.mkdir()
    config = json.loads((CONFIGS / "llama3_1_8b" / "config.json").read_text())
    if quant is not None:
        config["quantization_config"] = quant
    (folder / "config.json").write_text(json.dumps(config))
    if legacy is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(legacy))
    return folder


def _init(folder: Path, tmp_path: Path, backend: str, kv: str | None) -> Path:
    return write_recipe("r", folder, tmp_path / "r.yaml", "H100-80GB", kv_cache=kv, backend=backend, force=True,
                        warn=lambda _line: None)


@pytest.mark.parametrize(("backend", "quant", "legacy", "runs"), [
    ("llmapi", MODELOPT_FP8, LEGACY, "fp8_cast"),
    ("llmapi", CT_FP8_DYNAMIC, None, "fp8_cast"),
    ("vllm", MODELOPT_FP8, LEGACY, "fp8"),
    ("vllm", CT_FP8_DYNAMIC, None, "fp8"),
    ("sglang", MODELOPT_FP8, LEGACY, "fp8"),
    ("sglang", CT_FP8_PER_TENSOR_KV, None, "fp8"),
])
def test_kv_cache_none_on_a_checkpoint_declaring_fp8_kv_is_refused_with_what_runs(
        tmp_path: Path, backend: str, quant: dict, legacy: dict | None, runs: str) -> None:
    folder = _checkpoint(tmp_path / "c", quant, legacy)
    with pytest.raises(RecipeError) as err:
        _init(folder, tmp_path, backend, "none")
    said = str(err.value)
    assert "quantization.kv_cache (from --kv-cache none)" in said and f"Use kv_cache {runs} (what it runs" in said
    assert str(folder) in said and "16-bit" in said and not (tmp_path / "r.yaml").exists()
    # the value that says what runs is written and plans; none put back by hand is refused by plan
    recipe = load_recipe(_init(folder, tmp_path, backend, runs))
    assert plan(recipe).recipe_kv_format == (KVFormat.FP8_SCALE1 if runs == "fp8_cast" else KVFormat.FP8).value
    with pytest.raises(RecipeError, match=f"quantization.kv_cache: none on build.backend {backend}, but the checkpoint"):
        plan(load_recipe(recipe.path, ["quantization.kv_cache=none"]))


def test_the_source_each_refusal_cites_and_an_nvfp4_declaration(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "c", MODELOPT_FP8, LEGACY)
    for backend, where in (("llmapi", "ModelLoader._update_from_hf_quant_config"),
                           ("vllm", "resolve_kv_cache_dtype_string"), ("sglang", "kv_cache_dtype.py:49-57")):
        with pytest.raises(RecipeError, match=where):
            _init(folder, tmp_path, backend, "none")
    # TensorRT-LLM follows an NVFP4 declaration too (its scales read): kv_cache nvfp4 says so; SGLang's auto does not
    (folder / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {**LEGACY["quantization"], "kv_cache_quant_algo": "NVFP4"}}))
    with pytest.raises(RecipeError, match="declares a KV cache of NVFP4: .* Use kv_cache nvfp4"):
        _init(folder, tmp_path, "llmapi", "none")
    assert load_recipe(_init(folder, tmp_path, "sglang", "none")).quantization.kv_cache.value == "none"


@pytest.mark.parametrize(("backend", "quant", "legacy"), [
    ("llmapi", {**MODELOPT_FP8, "kv_cache_scheme": None}, {**LEGACY, "quantization": {"quant_algo": "FP8"}}),
    ("llmapi", None, None),  # a 16-bit checkpoint
    ("vllm", {**MODELOPT_FP8, "kv_cache_scheme": None}, None),
    ("sglang", CT_FP8_DYNAMIC, None),  # a per-head kv_cache_scheme: SGLang's auto stays 16-bit
])
def test_nothing_is_refused_where_no_kv_is_declared(
        tmp_path: Path, backend: str, quant: dict | None, legacy: dict | None) -> None:
    recipe = load_recipe(_init(_checkpoint(tmp_path / "c", quant, legacy), tmp_path, backend, "none"))
    assert recipe.quantization.kv_cache.value == "none" and plan(recipe).recipe_kv_format in ("bf16", "fp16")


RESOLVE = r"""
import json, sys, types
from vllm.utils.torch_utils import resolve_kv_cache_dtype_string
out = [resolve_kv_cache_dtype_string(dtype, types.SimpleNamespace(hf_config=types.SimpleNamespace(
    quantization_config=quant))) for quant, dtype in json.loads(sys.stdin.read())]
print(json.dumps(out))
"""


def test_vllm_resolves_auto_to_the_checkpoints_kv_declaration_as_the_refusal_cites() -> None:
    """vLLM 0.32.0's own resolve_kv_cache_dtype_string (.venv-vllm) turns --kv-cache-dtype auto into fp8_e4m3 for a
    ModelOpt config declaring FP8 KV (an explicit bfloat16 wins); a compressed-tensors kv_cache_scheme is followed
    later, in Attention.__init__, at the lines its backend row cites."""
    py = vllm_python()
    if not py.is_file():
        pytest.skip(f"needs vLLM's side venv at {py} (make install-vllm)")
    cases = [(MODELOPT_FP8, "auto"), (MODELOPT_FP8, "bfloat16"), ({**MODELOPT_FP8, "kv_cache_scheme": None}, "auto"),
             (CT_FP8_DYNAMIC, "auto"), ({"quant_method": "fp8"}, "auto")]
    proc = side_python.run([str(py), "-c", RESOLVE], input=json.dumps(cases), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["fp8_e4m3", "bfloat16", "auto", "auto", "auto"]
    follows = BACKEND_ROWS[Backend.VLLM].kv_from_checkpoint
    assert follows is not None
    why, runs, _ignored = follows
    assert runs["fp8"].value == "fp8" and "torch_utils.py:457-530" in why and "attention.py:287-291" in why
    site = next(py.parents[1].glob("lib/python3*/site-packages/vllm"))
    lines = (site / "model_executor/layers/attention/attention.py").read_text().splitlines()[286:291]
    assert "kv_cache_scheme is not None and kv_cache_dtype == \"auto\"" in "\n".join(lines)
    assert 'cache_config.cache_dtype = "fp8"' in lines[-1]
    torch_utils = (site / "utils/torch_utils.py").read_text().splitlines()
    assert torch_utils[456].startswith("def get_kv_cache_quant_algo_string") and torch_utils[529].strip() == 'return "auto"'


SGLANG_AUTO = r"""
import ast, importlib.util, json, pathlib, sys, types, typing, torch
root = pathlib.Path(importlib.util.find_spec("sglang").submodule_search_locations[0])

def code(relative, *path):
    node = ast.parse((root / relative).read_text())
    for name in path:  # a module function, or a method by its class
        node = next(n for n in node.body if getattr(n, "name", None) == name)
    node.decorator_list = []
    scope = {"torch": torch, "nn": torch.nn, "Optional": typing.Optional, "Dict": dict, "Any": typing.Any,
             "fp8_dtype": torch.float8_e4m3fn, "_is_hip": False,
             "TORCH_DTYPE_TO_KV_CACHE_STR": {torch.float8_e4m3fn: "fp8_e4m3"}}
    exec(compile(ast.Module([node], []), str(root / relative), "exec"), scope)
    return scope[path[-1]]

configure = code("srt/mem_cache/kv_cache_dtype.py", "configure_kv_cache_dtype")
supported = code("srt/layers/quantization/compressed_tensors/compressed_tensors.py",
                 "CompressedTensorsKVCacheMethod", "is_supported_scheme")
out = []
for algo, scheme in json.loads(sys.stdin.read()):
    model = types.SimpleNamespace(quant_config=types.SimpleNamespace(kv_cache_quant_algo=algo))
    got = configure(server_args_kv_cache_dtype="auto", model=model, model_dtype=torch.bfloat16,
                    is_draft_worker=False, is_dflash=False, speculative_draft_attention_backend="")
    out.append([str(got[1]), supported(scheme)])
print(json.dumps(out))
"""


def test_sglang_resolves_auto_to_an_fp8_declaration_but_not_to_a_per_head_scheme() -> None:
    """SGLang 0.5.23's own configure_kv_cache_dtype (.venv-sglang, its source run as written: srt does not import on
    this CPU) gives auto FP8 E4M3 for kv_cache_quant_algo FP8 and the model dtype otherwise; compressed-tensors'
    config reports FP8 only for a static per-tensor kv_cache_scheme (is_supported_scheme), not a per-head one."""
    py = Path(__file__).resolve().parents[2] / ".venv-sglang" / "bin" / "python"
    if not py.is_file():
        pytest.skip(f"needs SGLang's side venv at {py} (make install-sglang)")
    cases = [("FP8", CT_FP8_PER_TENSOR_KV["kv_cache_scheme"]), (None, CT_FP8_DYNAMIC["kv_cache_scheme"]),
             ("NVFP4", {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": True})]
    proc = side_python.run([str(py), "-c", SGLANG_AUTO], input=json.dumps(cases), timeout=300, preload=["torch"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == [["torch.float8_e4m3fn", True], ["torch.bfloat16", False], ["torch.bfloat16", False]]
    follows = BACKEND_ROWS[Backend.SGLANG].kv_from_checkpoint
    assert follows is not None and set(follows.runs) == {"fp8"} and follows.ignored == ("fp8 per head",)
