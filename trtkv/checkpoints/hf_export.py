"""Validation of ModelOpt's unified HF checkpoint (checkpoint/hf/): what TensorRT-LLM's LLM API and vLLM load.

Checks `config.json` (a Llama, layer/head/vocabulary sizes against the recipe, RoPE as transformers 4.x reads it
against the source model's `hf_config.json`), `hf_quant_config.json` (`quant_algo`, `kv_cache_quant_algo` against
the recipe) and the safetensors (every decoder tensor present; FP8 weights stored as float8_e4m3fn with a finite
positive `weight_scale`; per layer one `k_proj.k_scale` and one `v_proj.v_scale`, float32, finite and > 0 when the KV
cache is quantized, none when it is not). Every problem is collected and reported in one StageError.
Used by `trtkv calibrate` after export and by the llmapi backend's build.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.core.errors import StageError
from trtkv.recipe import WeightQuant
from trtkv.recipe.layout import HF_CONFIG, KV_ALGO

if TYPE_CHECKING:
    from trtkv.recipe import Recipe

QUANT_CONFIG = "hf_quant_config.json"
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
KV_SCALES = ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale")
# hf_quant_config.json quant_algo for each recipe weight choice the HF export supports
HF_WEIGHT_ALGO: dict[WeightQuant, str | None] = {WeightQuant.FP8: "FP8", WeightQuant.NONE: None}


def _load_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        problems.append(f"{path}: missing")
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path}: not readable as JSON ({exc})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path}: not a JSON object")
        return None
    return data


def _tensors(hf_dir: Path, problems: list[str]) -> dict[str, dict[str, Any]]:
    """name -> {dtype, shape, values (scales only)} over every *.safetensors, without loading the weights."""
    from safetensors import SafetensorError, safe_open

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        problems.append(f"{hf_dir}: no *.safetensors")
    out: dict[str, dict[str, Any]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                    sl = fh.get_slice(name)
                    entry: dict[str, Any] = {"dtype": sl.get_dtype(), "shape": list(sl.get_shape()), "file": path}
                    if name.endswith("scale"):
                        entry["values"] = fh.get_tensor(name).float().flatten().tolist()
                    out[name] = entry
        except (SafetensorError, OSError, RuntimeError) as exc:
            problems.append(f"{path}: not a readable safetensors file ({exc})")
    return out


def _positive_scale(name: str, entry: dict[str, Any] | None, problems: list[str], where: Path) -> float | None:
    if entry is None:
        problems.append(f"{where}: {name} missing")
        return None
    values = entry.get("values") or []
    if entry["dtype"] != "F32" or len(values) != 1:
        problems.append(f"{entry['file']}: {name} is {entry['dtype']} {entry['shape']}, expected one float32 value")
        return None
    if not (math.isfinite(values[0]) and values[0] > 0):
        problems.append(f"{entry['file']}: {name} = {values[0]}, a scale must be finite and > 0")
        return None
    return float(values[0])


def _check_config(hf_dir: Path, recipe: Recipe, problems: list[str]) -> dict[str, Any] | None:
    path = hf_dir / "config.json"
    config = _load_json(path, problems)
    if config is None:
        return None
    if (config.get("architectures") or [None])[0] != "LlamaForCausalLM" and recipe.model.architecture == "llama":
        problems.append(f"{path}: architectures = {config.get('architectures')!r}, expected ['LlamaForCausalLM']")
    m = recipe.model
    for field, want, source in (("num_hidden_layers", m.num_layers, "model.num_layers"),
                                ("num_attention_heads", m.num_attention_heads, "model.num_attention_heads"),
                                ("num_key_value_heads", m.num_kv_heads, "model.num_kv_heads"),
                                ("hidden_size", m.hidden_size, "model.hidden_size"),
                                ("vocab_size", m.vocab_size, "model.vocab_size")):
        if want is not None and config.get(field) != want:
            problems.append(f"{path}: {field} = {config.get(field)!r}, but recipe {source} = {want!r}")
    return config


def _check_rope(ckpt_dir: Path, config: dict[str, Any], problems: list[str]) -> None:
    from trtkv.checkpoints import rope

    source_path = ckpt_dir / HF_CONFIG
    source = _load_json(source_path, problems) if source_path.is_file() else None
    if source is None:
        return
    for problem in rope.rope_problems(rope.from_hf(source), None, config):
        problems.append(f"{ckpt_dir / problem.partition(': ')[0]}: {problem.partition(': ')[2]} (from {HF_CONFIG})")


def _check_quant_config(hf_dir: Path, recipe: Recipe, problems: list[str]) -> tuple[str | None, str | None]:
    q = recipe.quantization
    want_w, want_kv = HF_WEIGHT_ALGO.get(q.weights), KV_ALGO[q.kv_cache]
    path = hf_dir / QUANT_CONFIG
    if not path.is_file():
        if want_w is not None or want_kv is not None:
            problems.append(f"{path}: missing, but recipe quantization is weights {q.weights.value}, kv_cache "
                            f"{q.kv_cache.value}")
        return None, None
    data = _load_json(path, problems) or {}
    quant: dict[str, Any] = data["quantization"] if isinstance(data.get("quantization"), dict) else {}
    got_w, got_kv = quant.get("quant_algo"), quant.get("kv_cache_quant_algo")
    if got_w != want_w:
        problems.append(f"{path}: quantization.quant_algo = {got_w!r}, but recipe quantization.weights = "
                        f"{q.weights.value!r} needs {want_w!r}")
    if got_kv != want_kv:
        problems.append(f"{path}: quantization.kv_cache_quant_algo = {got_kv!r}, but recipe quantization.kv_cache = "
                        f"{q.kv_cache.value!r} needs {want_kv!r}")
    return got_w, got_kv


def validate_hf_checkpoint(ckpt_dir: Path | str, recipe: Recipe) -> dict[str, Any]:
    """Check checkpoint/hf/ against the recipe; a summary (per-layer k/v scales) or a StageError with every problem."""
    ckpt_dir = Path(ckpt_dir)
    hf_dir = ckpt_dir / "hf"
    problems: list[str] = []
    if recipe.quantization.weights not in HF_WEIGHT_ALGO:
        raise StageError(f"{hf_dir}: the HF export carries fp8 or unquantized weights, the recipe asks for "
                         f"{recipe.quantization.weights.value}")
    config = _check_config(hf_dir, recipe, problems)
    if config is not None:
        _check_rope(ckpt_dir, config, problems)
    weight_algo, kv_algo = _check_quant_config(hf_dir, recipe, problems)
    tensors = _tensors(hf_dir, problems)
    layers = int((config or {}).get("num_hidden_layers") or recipe.model.num_layers or 0)
    fp8 = recipe.quantization.weights is WeightQuant.FP8
    k_scales: list[float | None] = []
    v_scales: list[float | None] = []
    for i in range(layers):
        pre = f"model.layers.{i}."
        for norm in NORMS:
            if pre + norm not in tensors:
                problems.append(f"{hf_dir}: {pre + norm} missing")
        for proj in PROJECTIONS:
            weight = tensors.get(f"{pre}{proj}.weight")
            if weight is None:
                problems.append(f"{hf_dir}: {pre}{proj}.weight missing")
                continue
            if fp8:
                if weight["dtype"] != "F8_E4M3":
                    problems.append(f"{weight['file']}: {pre}{proj}.weight is {weight['dtype']}, recipe weights fp8 "
                                    f"needs F8_E4M3")
                _positive_scale(f"{pre}{proj}.weight_scale", tensors.get(f"{pre}{proj}.weight_scale"), problems, hf_dir)
        if KV_ALGO[recipe.quantization.kv_cache] is not None:
            k_scales.append(_positive_scale(pre + KV_SCALES[0], tensors.get(pre + KV_SCALES[0]), problems, hf_dir))
            v_scales.append(_positive_scale(pre + KV_SCALES[1], tensors.get(pre + KV_SCALES[1]), problems, hf_dir))
        else:
            extra = [pre + s for s in KV_SCALES if pre + s in tensors]
            if extra:
                problems.append(f"{hf_dir}: {', '.join(extra)} present, but recipe quantization.kv_cache is none")
    if "model.embed_tokens.weight" not in tensors:
        problems.append(f"{hf_dir}: model.embed_tokens.weight missing")
    if problems:
        body = "\n".join(f"  - {p}" for p in problems)
        raise StageError(f"HF checkpoint {hf_dir} is not valid, found {len(problems)} problem(s):\n{body}\n"
                         f"Next: rerun `trtkv calibrate {recipe.name or '<recipe>'} --force` to re-export it.")
    return {"hf_dir": "hf", "quant_algo": weight_algo, "kv_cache_quant_algo": kv_algo, "num_layers": layers,
            "k_scales": k_scales, "v_scales": v_scales, "tensors": len(tensors)}
