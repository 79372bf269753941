"""Validation of ModelOpt's unified HF checkpoint (checkpoint/hf/): what TensorRT-LLM's LLM API and
vLLM load.

Checks `config.json` (the architecture the recipe names: LlamaForCausalLM or Gemma3ForCausalLM;
layer/head/vocabulary sizes against the recipe; RoPE as transformers 4.x reads it against the source
model's `hf_config.json`; for Gemma 3 also its sliding-window layout, per-layer-type RoPE and
attention scalar, see `_check_gemma3`), `hf_quant_config.json` (`quant_algo`, `kv_cache_quant_algo`
against the recipe) and the safetensors (every decoder tensor present, Gemma 3's extra norms
included; FP8 weights stored as float8_e4m3fn with a finite positive `weight_scale`; per layer one
`k_proj.k_scale` and one `v_proj.v_scale`, float32, finite and > 0 when the KV cache is quantized,
none when it is not). Every problem is collected and reported in one StageError. Used by `trtkv
calibrate` after export and by the llmapi and vllm backends' build.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.core.errors import StageError, TrtkvError
from trtkv.recipe import WeightQuant
from trtkv.recipe.layout import HF, HF_CONFIG

if TYPE_CHECKING:
    from trtkv.recipe import Recipe

QUANT_CONFIG = "hf_quant_config.json"
PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
# recipe model.architecture -> the HF class the export must name (config.json architectures[0])
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# Gemma 3's four (1 + w) RMSNorms per layer and its QK norms (transformers' Gemma3DecoderLayer /
# Gemma3Attention; vLLM's gemma3.py loads the same names)
GEMMA3_NORMS = (
    *NORMS,
    "pre_feedforward_layernorm.weight",
    "post_feedforward_layernorm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
)
# Gemma 3 config fields the export must carry as the source model has them (vLLM's gemma3.py and
# TensorRT-LLM's GemmaConfig read them): the attention scale, soft caps, the sliding window and the
# per-layer attention types
GEMMA3_FIELDS = (
    "query_pre_attn_scalar",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "sliding_window",
    "layer_types",
    "hidden_activation",
    "rms_norm_eps",
)
GEMMA3_ROPE_TYPES = ("sliding_attention", "full_attention")
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
    """name -> {dtype, shape, values (scales only)} over every *.safetensors, without loading the
    weights."""
    from trtkv.checkpoints.trtllm_ranks import read_tensor_infos

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        problems.append(f"{hf_dir}: no *.safetensors")
    out: dict[str, dict[str, Any]] = {}
    for path in files:
        read_tensor_infos(path, "scale", out, problems, file=path)
    return out


def _positive_scale(
    name: str, entry: dict[str, Any] | None, problems: list[str], where: Path
) -> float | None:
    if entry is None:
        problems.append(f"{where}: {name} missing")
        return None
    values = entry.get("values") or []
    if entry["dtype"] != "F32" or len(values) != 1:
        problems.append(
            f"{entry['file']}: {name} is {entry['dtype']} {entry['shape']}, expected one float32 "
            "value"
        )
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
    want_arch = HF_ARCHITECTURES.get(recipe.model.architecture.lower())
    if want_arch and (config.get("architectures") or [None])[0] != want_arch:
        problems.append(
            f"{path}: architectures = {config.get('architectures')!r}, but recipe "
            f"model.architecture = {recipe.model.architecture!r} needs [{want_arch!r}]"
        )
    m = recipe.model
    for field, want, source in (
        ("num_hidden_layers", m.num_layers, "model.num_layers"),
        ("num_attention_heads", m.num_attention_heads, "model.num_attention_heads"),
        ("num_key_value_heads", m.num_kv_heads, "model.num_kv_heads"),
        ("head_dim", m.head_dim if "head_dim" in config else None, "model.head_dim"),
        ("hidden_size", m.hidden_size, "model.hidden_size"),
        ("vocab_size", m.vocab_size, "model.vocab_size"),
    ):
        if want is not None and config.get(field) != want:
            problems.append(
                f"{path}: {field} = {config.get(field)!r}, but recipe {source} = {want!r}"
            )
    return config


def _source_config(ckpt_dir: Path, problems: list[str]) -> dict[str, Any] | None:
    source_path = ckpt_dir / HF_CONFIG
    return _load_json(source_path, problems) if source_path.is_file() else None


def _check_rope(ckpt_dir: Path, config: dict[str, Any], problems: list[str]) -> None:
    from trtkv.checkpoints import rope

    source = _source_config(ckpt_dir, problems)
    if source is None:
        return
    for problem in rope.rope_problems(rope.from_hf(source), None, config):
        problems.append(
            f"{ckpt_dir / problem.partition(': ')[0]}: {problem.partition(': ')[2]} (from "
            f"{HF_CONFIG})"
        )


def gemma3_legacy_rope(source: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's RoPE in transformers 4.x's keys (Gemma3TextConfig: `rope_theta` global,
    `rope_local_base_freq` local, `rope_scaling` global), which TensorRT-LLM's LLM API (transformers
    4.57) and GemmaConfig read; transformers 5 (and vLLM 0.32: `config.rope_parameters[layer_type]`)
    keep them in `rope_parameters` per layer type."""
    params = source.get("rope_parameters") or {}
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    scaling = {k: v for k, v in full.items() if k != "rope_theta"}
    return {
        "rope_theta": full.get("rope_theta", source.get("rope_theta")),
        "rope_local_base_freq": local.get("rope_theta", source.get("rope_local_base_freq")),
        "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling,
    }


def _check_gemma3(
    ckpt_dir: Path, config: dict[str, Any], recipe: Recipe, problems: list[str]
) -> None:
    """Gemma 3: hybrid sliding/full layout, per-layer-type RoPE (both spellings) and scalars as the
    source has them."""
    from trtkv.checkpoints.hf_config import read_model_facts
    from trtkv.recipe.attention import parse_layers

    path = ckpt_dir / HF / "config.json"
    types = config.get("layer_types")
    if (
        not isinstance(types, list)
        or len(types) != config.get("num_hidden_layers")
        or not set(types) <= set(GEMMA3_ROPE_TYPES)
    ):
        problems.append(
            f"{path}: layer_types = {types!r}, expected one of {list(GEMMA3_ROPE_TYPES)} per layer "
            f"(num_hidden_layers {config.get('num_hidden_layers')!r})"
        )
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or set(GEMMA3_ROPE_TYPES) - set(rope):
        problems.append(
            f"{path}: rope_parameters = {rope!r}, expected one entry per layer type "
            f"{list(GEMMA3_ROPE_TYPES)} (vLLM reads config.rope_parameters[layer_type])"
        )
    if not isinstance(config.get("query_pre_attn_scalar"), (int, float)):
        problems.append(
            f"{path}: query_pre_attn_scalar = {config.get('query_pre_attn_scalar')!r}, a number is "
            "needed (the attention scale is query_pre_attn_scalar ** -0.5)"
        )
    if m_layers := recipe.model.attention_layers:
        try:
            got = tuple(x.label for x in read_model_facts(path).layers)
        except TrtkvError as exc:
            problems.append(f"{path}: attention layout not readable ({type(exc).__name__}: {exc})")
        else:
            want = tuple(x.label for x in parse_layers(m_layers))
            if got != want:
                problems.append(
                    f"{path}: attention layers {list(got)}, but recipe model.attention_layers "
                    f"gives {list(want)}"
                )
    source = _source_config(ckpt_dir, problems)
    if source is None:
        return
    for field in (*GEMMA3_FIELDS, "rope_parameters"):
        if field in source and config.get(field) != source[field]:
            problems.append(
                f"{path}: {field} = {config.get(field)!r}, but the model has {source[field]!r} "
                f"(from {HF_CONFIG})"
            )
    for field, want in gemma3_legacy_rope(source).items():
        if config.get(field, "absent") != want:
            problems.append(
                f"{path}: {field} = {config.get(field, 'absent')!r}, but transformers 4.x "
                f"(TensorRT-LLM's LLM API) needs {want!r} for this model's RoPE (from {HF_CONFIG} "
                "rope_parameters)"
            )


def _check_quant_config(
    hf_dir: Path, recipe: Recipe, problems: list[str]
) -> tuple[str | None, str | None]:
    q = recipe.quantization
    want_w, want_kv = HF_WEIGHT_ALGO.get(q.weights), recipe.kv_row.choice.checkpoint_algo
    path = hf_dir / QUANT_CONFIG
    if not path.is_file():
        if want_w is not None or want_kv is not None:
            problems.append(
                f"{path}: missing, but recipe quantization is weights {q.weights.value}, kv_cache "
                f"{q.kv_cache.value}"
            )
        return None, None
    data = _load_json(path, problems) or {}
    quant: dict[str, Any] = (
        data["quantization"] if isinstance(data.get("quantization"), dict) else {}
    )
    got_w, got_kv = quant.get("quant_algo"), quant.get("kv_cache_quant_algo")
    if got_w != want_w:
        problems.append(
            f"{path}: quantization.quant_algo = {got_w!r}, but recipe quantization.weights = "
            f"{q.weights.value!r} needs {want_w!r}"
        )
    if got_kv != want_kv:
        problems.append(
            f"{path}: quantization.kv_cache_quant_algo = {got_kv!r}, but recipe "
            f"quantization.kv_cache = {q.kv_cache.value!r} needs {want_kv!r}"
        )
    return got_w, got_kv


def is_stored(recipe: Recipe) -> bool:
    """The recipe serves a pre-quantized checkpoint's weights as stored (model.checkpoint_quant
    with quantization.weights none): hf/ is then that checkpoint passed on by `trtkv calibrate`
    (trtkv.calibrate.as_stored), not ModelOpt's export of a 16-bit model."""
    return bool(recipe.model.checkpoint_quant) and recipe.quantization.weights is WeightQuant.NONE


def _check_stored_quant(
    hf_dir: Path, config: dict[str, Any], recipe: Recipe, problems: list[str]
) -> tuple[str | None, str | None]:
    """A checkpoint served as stored: its weight format, as trtkv.checkpoints recognises it from
    its own files, is the recipe's model.checkpoint_quant; a KV cache with scales (fp8) needs the
    checkpoint to declare them, any other KV format is set by the engine's KV dtype, whatever the
    checkpoint declares (TensorRT-LLM's PyTorch backend runs an FP8 KV cache at scale 1.0,
    trtkv.runtime.hf_checkpoint), but for kv_cache none, which the engine may run in the declared
    format (trtkv.recipe.stored.declared_kv_problems). The (stored format, declared KV algo)."""
    from trtkv.checkpoints.checkpoint_quant import declared_kv_algo, read_checkpoint_quant
    from trtkv.recipe import declared_kv_problems

    want = recipe.model.checkpoint_quant or ""
    parts = [config, config.get("text_config")]
    quant = next(
        (
            p["quantization_config"]
            for p in parts
            if isinstance(p, dict) and isinstance(p.get("quantization_config"), dict)
        ),
        None,
    )
    notes: list[str] = []
    try:
        found = read_checkpoint_quant(quant, hf_dir, notes)
    except TrtkvError as exc:
        problems.append(f"{hf_dir}: quantization not readable ({exc})")
        return None, None
    got = found.stored_format if found is not None else None
    if (got or "").lower() != want.lower():
        problems.append(
            f"{hf_dir}: the weights are stored as {got or '16-bit (no quantization recognised)'}"
            f", but recipe model.checkpoint_quant = {want!r} (quantization.weights none: the "
            f"weights as stored){' ' + ' '.join(notes) if notes else ''}"
        )
    declared = found.kv_cache if found is not None else None
    if recipe.kv_row.choice.checkpoint_algo is not None and declared is None:
        problems.append(
            f"{hf_dir}: declares no KV-cache scales, but recipe quantization.kv_cache = "
            f"{recipe.quantization.kv_cache.value!r} serves the scales the checkpoint carries"
        )
    kv_algo = declared_kv_algo(hf_dir, declared)  # as TensorRT-LLM reads it
    problems += [
        f"{hf_dir}: recipe {where}: {msg}"
        for where, msg in declared_kv_problems(recipe, kv_algo, str(hf_dir))
    ]
    return got, kv_algo


def validate_hf_checkpoint(ckpt_dir: Path | str, recipe: Recipe) -> dict[str, Any]:
    """Check checkpoint/hf/ against the recipe; a summary (per-layer k/v scales) or a StageError
    with every problem. A checkpoint served as stored (is_stored) is checked as the user's: its
    own quantization, the KV algo the engine runs, the k/v scales it carries allowed, its weight
    tensors under its own names (calibrate checked the shards byte-identical)."""
    ckpt_dir = Path(ckpt_dir)
    stored = is_stored(recipe)
    hf_dir = ckpt_dir / HF
    problems: list[str] = []
    if recipe.quantization.weights not in HF_WEIGHT_ALGO:
        raise StageError(
            f"{hf_dir}: the HF export carries fp8 or unquantized weights, the recipe asks for "
            f"{recipe.quantization.weights.value}"
        )
    config = _check_config(hf_dir, recipe, problems)
    gemma3 = (config or {}).get("architectures") == [HF_ARCHITECTURES["gemma3"]]
    if config is not None and gemma3:
        _check_gemma3(ckpt_dir, config, recipe, problems)
    elif config is not None:
        _check_rope(ckpt_dir, config, problems)
    if stored:
        weight_algo, kv_algo = _check_stored_quant(hf_dir, config or {}, recipe, problems)
    else:
        weight_algo, kv_algo = _check_quant_config(hf_dir, recipe, problems)
    tensors = _tensors(hf_dir, problems)
    layers = int((config or {}).get("num_hidden_layers") or recipe.model.num_layers or 0)
    fp8 = recipe.quantization.weights is WeightQuant.FP8
    k_scales: list[float | None] = []
    v_scales: list[float | None] = []
    for i in range(layers):
        pre = f"model.layers.{i}."
        for norm in GEMMA3_NORMS if gemma3 else NORMS:
            if pre + norm not in tensors:
                problems.append(f"{hf_dir}: {pre + norm} missing")
        for proj in () if stored else PROJECTIONS:
            weight = tensors.get(f"{pre}{proj}.weight")
            if weight is None:
                problems.append(f"{hf_dir}: {pre}{proj}.weight missing")
                continue
            if fp8:
                if weight["dtype"] != "F8_E4M3":
                    problems.append(
                        f"{weight['file']}: {pre}{proj}.weight is {weight['dtype']}, recipe "
                        "weights fp8 needs F8_E4M3"
                    )
                _positive_scale(
                    f"{pre}{proj}.weight_scale",
                    tensors.get(f"{pre}{proj}.weight_scale"),
                    problems,
                    hf_dir,
                )
        if stored:
            for name, out in zip(KV_SCALES, (k_scales, v_scales), strict=True):
                if pre + name in tensors:
                    out.append(_positive_scale(pre + name, tensors[pre + name], problems, hf_dir))
        elif recipe.kv_row.choice.checkpoint_algo is not None:
            k_scales.append(
                _positive_scale(
                    pre + KV_SCALES[0], tensors.get(pre + KV_SCALES[0]), problems, hf_dir
                )
            )
            v_scales.append(
                _positive_scale(
                    pre + KV_SCALES[1], tensors.get(pre + KV_SCALES[1]), problems, hf_dir
                )
            )
        else:
            extra = [pre + s for s in KV_SCALES if pre + s in tensors]
            if extra:
                problems.append(
                    f"{hf_dir}: {', '.join(extra)} present, but recipe quantization.kv_cache is "
                    "none"
                )
    if "model.embed_tokens.weight" not in tensors:
        problems.append(f"{hf_dir}: model.embed_tokens.weight missing")
    if problems:
        raise StageError(
            f"HF checkpoint {hf_dir} is not valid, found {StageError.listing(problems)}\n"
            "Next: where a problem names a recipe value to use, set it; else rerun `trtkv "
            f"calibrate {recipe.name or '<recipe>'} --force` to re-export it."
        )
    return {
        "hf_dir": "hf",
        "quant_algo": weight_algo,
        "kv_cache_quant_algo": kv_algo,
        "num_layers": layers,
        "k_scales": k_scales,
        "v_scales": v_scales,
        "tensors": len(tensors),
        **({"stored": weight_algo} if stored else {}),
    }
