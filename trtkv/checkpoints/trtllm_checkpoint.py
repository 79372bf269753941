"""Validation of a TensorRT-LLM checkpoint: what `trtllm-build` / the runtime will read, checked
against the recipe.

Checks `config.json` (architecture, dtype, layer/head counts, `mapping`, quantization fields, RoPE
against the source model's `hf_config.json`: `rotary_base`/`rotary_scaling`, and `hf/config.json`'s
`rope_theta`) and every `rank{r}.safetensors` (tensor names and shapes per rank, one finite positive
`kv_cache_scaling_factor` per layer when the KV cache is quantized and none when
`kv_cache_quant_algo` is null (recipe kv_cache none), finite positive scaling factors:
trtkv.checkpoints.trtllm_ranks). Every problem is collected and reported at once in one StageError.
An architecture ModelOpt exports only as the HF checkpoint
(trtkv.recipe.backend_rules.HF_EXPORT_ONLY: Gemma 3) is refused with the reason and the alternative
before anything is read. Used by `trtkv calibrate` after export and by the build stage's preflight.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.checkpoints.trtllm_ranks import Problems, check_ranks, layer_factors
from trtkv.core.errors import StageError
from trtkv.recipe.layout import HF, HF_CONFIG, WEIGHT_ALGOS

if TYPE_CHECKING:
    from trtkv.recipe import Recipe

CONFIG = "config.json"
# recipe enum -> TensorRT-LLM QuantAlgo strings in config.json: trtkv.recipe.layout.WEIGHT_ALGOS and
# the KV-format registry row's checkpoint_algo (Recipe.kv_row)
REQUIRED_CONFIG = (
    "architecture",
    "dtype",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "vocab_size",
    "mapping",
    "quantization",
)


def validate_trtllm_checkpoint(ckpt_dir: Path | str, recipe: Recipe) -> dict[str, Any]:
    """Check the checkpoint against the recipe; return a summary or raise StageError listing every
    problem."""
    ckpt_dir = Path(ckpt_dir)
    refuse_hf_export_only(ckpt_dir, recipe)
    problems = Problems()
    config = _read_config(ckpt_dir, problems)
    problems.raise_if_any(ckpt_dir)
    _check_config(config, recipe, ckpt_dir / CONFIG, problems)
    problems.raise_if_any(ckpt_dir)
    _check_rope(ckpt_dir, config, problems)
    ranks = check_ranks(ckpt_dir, config, problems)
    factors = layer_factors(ranks, config)
    _check_kv_scales_json(ckpt_dir, factors, config, problems)
    problems.raise_if_any(ckpt_dir)
    mapping = config["mapping"]
    return {
        "config": str(ckpt_dir / CONFIG),
        "architecture": config["architecture"],
        "dtype": config["dtype"],
        "num_layers": config["num_hidden_layers"],
        "mapping": {k: mapping[k] for k in ("world_size", "tp_size", "pp_size")},
        "quant_algo": config["quantization"].get("quant_algo"),
        "kv_cache_quant_algo": config["quantization"].get("kv_cache_quant_algo"),
        "ranks": [
            {
                "file": r["file"].name,
                "tensors": len(r["tensors"]),
                "bytes": r["file"].stat().st_size,
            }
            for r in ranks
        ],
        "kv_cache_scaling_factors": factors,
    }


def refuse_hf_export_only(ckpt_dir: Path, recipe: Recipe) -> None:
    """No TensorRT-LLM checkpoint exists for an HF-export-only architecture: say why and what serves
    the model."""
    from trtkv.recipe.backend_rules import HF_EXPORT_ONLY

    arch = recipe.model.architecture
    reason = HF_EXPORT_ONLY.get(arch.lower())
    if reason:
        raise StageError(
            f"{ckpt_dir}: recipe {recipe.name or '<recipe>'} (model.architecture {arch!r}) has no "
            f"TensorRT-LLM checkpoint: {reason}. The engine path (build.backend tensorrt, and the "
            "reference runtime reading a TensorRT-LLM checkpoint) cannot run this model. Next: "
            f"build.backend vllm or llmapi, which serve the HF export {ckpt_dir / HF} that `trtkv "
            "calibrate` writes."
        )


def _read_config(ckpt_dir: Path, problems: Problems) -> dict[str, Any]:
    path = ckpt_dir / CONFIG
    if not path.is_file():
        problems.add(path, "missing (no TensorRT-LLM checkpoint here)")
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError) as exc:
        problems.add(path, f"not readable JSON ({exc})")
        return {}
    if not isinstance(data, dict):
        problems.add(path, "expected a JSON object")
        return {}
    for field in REQUIRED_CONFIG:
        if field not in data:
            problems.add(path, f"field {field!r} is missing")
    for field in ("mapping", "quantization"):
        if field in data and not isinstance(data[field], dict):
            problems.add(path, f"field {field!r} must be an object, got {data[field]!r}")
    return data


def _expect(problems: Problems, path: Path, field: str, got: Any, want: Any, source: str) -> None:
    if want is not None and got != want:
        problems.add(path, f"{field} = {got!r}, but {source} = {want!r}")


def _check_config(config: dict[str, Any], recipe: Recipe, path: Path, problems: Problems) -> None:
    """Compare the config fields TensorRT-LLM reads with the recipe."""
    m, b, q = recipe.model, recipe.build, recipe.quantization
    decoder = str(config.get("decoder") or config.get("architecture", "")).lower()
    if m.architecture.lower() not in decoder:
        problems.add(
            path,
            f"architecture/decoder = {config.get('architecture')!r}/{config.get('decoder')!r} does "
            f"not match recipe model.architecture = {m.architecture!r}",
        )
    _expect(problems, path, "dtype", config["dtype"], m.dtype.value, "recipe model.dtype")
    for field, want, source in (
        ("num_hidden_layers", m.num_layers, "model.num_layers"),
        ("num_attention_heads", m.num_attention_heads, "model.num_attention_heads"),
        ("num_key_value_heads", m.num_kv_heads, "model.num_kv_heads"),
        ("head_size", m.head_dim, "model.head_dim"),
        ("hidden_size", m.hidden_size, "model.hidden_size"),
        ("vocab_size", m.vocab_size, "model.vocab_size"),
    ):
        if field in config or want is not None:
            _expect(problems, path, field, config.get(field), want, f"recipe {source}")
    mapping = config["mapping"]
    for field, want in (
        ("world_size", recipe.world_size),
        ("tp_size", b.tp_size),
        ("pp_size", b.pp_size),
    ):
        _expect(
            problems, path, f"mapping.{field}", mapping.get(field), want, f"recipe build ({field})"
        )
    quant = config["quantization"]
    _expect_algo(
        problems,
        path,
        "quantization.quant_algo",
        quant.get("quant_algo"),
        WEIGHT_ALGOS[q.weights],
        "quantization.weights",
        q.weights.value,
    )
    _expect_algo(
        problems,
        path,
        "quantization.kv_cache_quant_algo",
        quant.get("kv_cache_quant_algo"),
        (recipe.kv_row.choice.checkpoint_algo,),
        "quantization.kv_cache",
        q.kv_cache.value,
    )
    layers, pp = config.get("num_hidden_layers"), mapping.get("pp_size")
    if isinstance(layers, int) and isinstance(pp, int) and pp > 0 and layers % pp:
        problems.add(
            path, f"num_hidden_layers = {layers} is not divisible by mapping.pp_size = {pp}"
        )


def _expect_algo(
    problems: Problems,
    path: Path,
    field: str,
    got: Any,
    allowed: tuple[str | None, ...],
    recipe_field: str,
    value: str,
) -> None:
    if got not in allowed:
        want = repr(allowed[0]) if len(allowed) == 1 else f"one of {list(allowed)}"
        problems.add(path, f"{field} = {got!r}, but recipe {recipe_field} = {value!r} needs {want}")


def _check_rope(ckpt_dir: Path, config: dict[str, Any], problems: Problems) -> None:
    """RoPE in config.json (and hf/config.json) must be the source model's (hf_config.json, saved by
    calibrate)."""
    from trtkv.checkpoints import rope

    source_path = ckpt_dir / HF_CONFIG
    if not source_path.is_file():
        return
    try:
        source = json.loads(source_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        problems.add(source_path, f"not readable JSON ({exc})")
        return
    hf_path = ckpt_dir / HF / CONFIG
    hf_export = None
    if hf_path.is_file():
        try:
            hf_export = json.loads(hf_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            problems.add(hf_path, f"not readable JSON ({exc})")
    for problem in rope.rope_problems(rope.from_hf(source), config, hf_export):
        where, _, msg = problem.partition(": ")
        problems.add(ckpt_dir / where, f"{msg} (from {HF_CONFIG})")


def _check_kv_scales_json(
    ckpt_dir: Path, factors: list[float], config: dict[str, Any], problems: Problems
) -> None:
    """When kv_scales.json is present its algorithm and factors must be the ones in config.json and
    the rank files."""
    from trtkv.contracts.artifacts import KVScalesFile

    path = KVScalesFile.path(ckpt_dir)
    try:
        scales = KVScalesFile.load(ckpt_dir)
    except StageError as exc:
        problems.add(
            path,
            f"not readable: {str(exc).removeprefix(str(path)).split('. Next:')[0].lstrip(': ')}",
        )
        return
    if scales is None:
        return
    listed = [layer.kv_cache_scaling_factor for layer in scales.layers]
    algo = config["quantization"].get("kv_cache_quant_algo")
    if scales.kv_cache_quant_algo != algo:
        problems.add(
            path,
            f"kv_cache_quant_algo = {scales.kv_cache_quant_algo!r}, but config.json "
            f"quantization.kv_cache_quant_algo = {algo!r}",
        )
    if len(listed) != len(factors):
        problems.add(
            path,
            f"lists {len(listed)} layers, the rank files hold {len(factors)} "
            "kv_cache_scaling_factor",
        )
        return
    for i, (a, b) in enumerate(zip(listed, factors, strict=True)):
        if not math.isclose(a, b, rel_tol=1e-5):
            problems.add(
                path, f"layer {i}: kv_cache_scaling_factor {a} differs from the rank files' {b}"
            )
