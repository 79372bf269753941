"""Validation of a TensorRT-LLM checkpoint: what `trtllm-build` / the runtime will read, checked against the recipe.

Checks `config.json` (architecture, dtype, layer/head counts, `mapping`, quantization fields, RoPE against the
source model's `hf_config.json`: `rotary_base`/`rotary_scaling`, and `hf/config.json`'s `rope_theta`) and every
`rank{r}.safetensors` (tensor names and shapes per rank, one finite positive `kv_cache_scaling_factor` per layer
when the KV cache is quantized and none when `kv_cache_quant_algo` is null (recipe kv_cache none), finite positive
scaling factors). Every problem is collected and reported at once in one StageError. An architecture ModelOpt
exports only as the HF checkpoint (trtkv.recipe.backend_rules.HF_EXPORT_ONLY: Gemma 3) is refused with the reason and the
alternative before anything is read. Used by `trtkv calibrate` after export and by the build stage's preflight.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.core.errors import StageError
from trtkv.recipe.layout import HF, HF_CONFIG, KV_ALGO, WEIGHT_ALGOS

if TYPE_CHECKING:
    from trtkv.recipe import Recipe

CONFIG = "config.json"
KV_FACTOR = "attention.kv_cache_scaling_factor"
LAYER_RE = re.compile(r"^transformer\.layers\.(\d+)\.(.+)$")
# recipe enum -> TensorRT-LLM QuantAlgo strings in config.json: trtkv.recipe.layout.WEIGHT_ALGOS and KV_ALGO
REQUIRED_CONFIG = ("architecture", "dtype", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "hidden_size", "vocab_size", "mapping", "quantization")
# per decoder layer, present on every rank (the gate projection is required for gated activations; the KV factor
# only when the KV cache is quantized)
LAYER_TENSORS = ("input_layernorm.weight", "post_layernorm.weight", "attention.qkv.weight", "attention.dense.weight",
                 "mlp.fc.weight", "mlp.proj.weight", KV_FACTOR)
GATED_ACTS = ("silu", "swiglu", "gelu_pytorch_tanh", "geglu")


class _Problems:
    """Collects every problem so a corrupted checkpoint is described in one round trip."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: Path | str, msg: str) -> None:
        self.items.append(f"{where}: {msg}")

    def raise_if_any(self, ckpt_dir: Path) -> None:
        if self.items:
            body = "\n".join(f"  - {p}" for p in self.items)
            raise StageError(f"TensorRT-LLM checkpoint {ckpt_dir} is not valid, found {len(self.items)} problem(s):\n"
                             f"{body}\nNext: rerun `trtkv calibrate <recipe> --force` to re-export it.")


def validate_trtllm_checkpoint(ckpt_dir: Path | str, recipe: Recipe) -> dict[str, Any]:
    """Check the checkpoint against the recipe; return a summary or raise StageError listing every problem."""
    ckpt_dir = Path(ckpt_dir)
    refuse_hf_export_only(ckpt_dir, recipe)
    problems = _Problems()
    config = _read_config(ckpt_dir, problems)
    problems.raise_if_any(ckpt_dir)
    _check_config(config, recipe, ckpt_dir / CONFIG, problems)
    problems.raise_if_any(ckpt_dir)
    _check_rope(ckpt_dir, config, problems)
    ranks = _check_ranks(ckpt_dir, config, problems)
    factors = _layer_factors(ranks, config)
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
        "ranks": [{"file": r["file"].name, "tensors": len(r["tensors"]), "bytes": r["file"].stat().st_size}
                  for r in ranks],
        "kv_cache_scaling_factors": factors,
    }


def refuse_hf_export_only(ckpt_dir: Path, recipe: Recipe) -> None:
    """No TensorRT-LLM checkpoint exists for an HF-export-only architecture: say why and what serves the model."""
    from trtkv.recipe.backend_rules import HF_EXPORT_ONLY

    arch = recipe.model.architecture
    reason = HF_EXPORT_ONLY.get(arch.lower())
    if reason:
        raise StageError(f"{ckpt_dir}: recipe {recipe.name or '<recipe>'} (model.architecture {arch!r}) has no "
                         f"TensorRT-LLM checkpoint: {reason}. The engine path (build.backend tensorrt, and the reference "
                         f"runtime reading a TensorRT-LLM checkpoint) cannot run this model. Next: build.backend vllm "
                         f"or llmapi, which serve the HF export {ckpt_dir / HF} that `trtkv calibrate` writes.")


def _read_config(ckpt_dir: Path, problems: _Problems) -> dict[str, Any]:
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


def _expect(problems: _Problems, path: Path, field: str, got: Any, want: Any, source: str) -> None:
    if want is not None and got != want:
        problems.add(path, f"{field} = {got!r}, but {source} = {want!r}")


def _check_config(config: dict[str, Any], recipe: Recipe, path: Path, problems: _Problems) -> None:
    """Compare the config fields TensorRT-LLM reads with the recipe."""
    m, b, q = recipe.model, recipe.build, recipe.quantization
    decoder = str(config.get("decoder") or config.get("architecture", "")).lower()
    if m.architecture.lower() not in decoder:
        problems.add(path, f"architecture/decoder = {config.get('architecture')!r}/{config.get('decoder')!r} does not "
                           f"match recipe model.architecture = {m.architecture!r}")
    _expect(problems, path, "dtype", config["dtype"], m.dtype.value, "recipe model.dtype")
    for field, want, source in (("num_hidden_layers", m.num_layers, "model.num_layers"),
                                ("num_attention_heads", m.num_attention_heads, "model.num_attention_heads"),
                                ("num_key_value_heads", m.num_kv_heads, "model.num_kv_heads"),
                                ("head_size", m.head_dim, "model.head_dim"),
                                ("hidden_size", m.hidden_size, "model.hidden_size"),
                                ("vocab_size", m.vocab_size, "model.vocab_size")):
        if field in config or want is not None:
            _expect(problems, path, field, config.get(field), want, f"recipe {source}")
    mapping = config["mapping"]
    for field, want in (("world_size", recipe.world_size), ("tp_size", b.tp_size), ("pp_size", b.pp_size)):
        _expect(problems, path, f"mapping.{field}", mapping.get(field), want, f"recipe build ({field})")
    quant = config["quantization"]
    _expect_algo(problems, path, "quantization.quant_algo", quant.get("quant_algo"), WEIGHT_ALGOS[q.weights],
                 "quantization.weights", q.weights.value)
    _expect_algo(problems, path, "quantization.kv_cache_quant_algo", quant.get("kv_cache_quant_algo"),
                 (KV_ALGO[q.kv_cache],), "quantization.kv_cache", q.kv_cache.value)
    layers, pp = config.get("num_hidden_layers"), mapping.get("pp_size")
    if isinstance(layers, int) and isinstance(pp, int) and pp > 0 and layers % pp:
        problems.add(path, f"num_hidden_layers = {layers} is not divisible by mapping.pp_size = {pp}")


def _expect_algo(problems: _Problems, path: Path, field: str, got: Any, allowed: tuple[str | None, ...],
                 recipe_field: str, value: str) -> None:
    if got not in allowed:
        want = repr(allowed[0]) if len(allowed) == 1 else f"one of {list(allowed)}"
        problems.add(path, f"{field} = {got!r}, but recipe {recipe_field} = {value!r} needs {want}")


def _check_rope(ckpt_dir: Path, config: dict[str, Any], problems: _Problems) -> None:
    """RoPE in config.json (and hf/config.json) must be the source model's (hf_config.json, saved by calibrate)."""
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


def _stage_layers(config: dict[str, Any]) -> int:
    return int(config["num_hidden_layers"]) // int(config["mapping"]["pp_size"])


def _check_ranks(ckpt_dir: Path, config: dict[str, Any], problems: _Problems) -> list[dict[str, Any]]:
    """Open every rank file and check its tensors; returns [{file, rank, pp_rank, tensors: {name: info}}]."""
    mapping = config["mapping"]
    world, tp = int(mapping["world_size"]), int(mapping["tp_size"])
    ranks = []
    for rank in range(world):
        path = ckpt_dir / f"rank{rank}.safetensors"
        if not path.is_file():
            problems.add(path, f"missing (mapping.world_size = {world} needs rank0..rank{world - 1})")
            continue
        tensors = _read_tensors(path, problems)
        if tensors is None:
            continue
        info = {"file": path, "rank": rank, "pp_rank": rank // tp, "tensors": tensors}
        _check_rank(info, config, problems)
        ranks.append(info)
    for extra in sorted(ckpt_dir.glob("rank*.safetensors")):
        match = re.fullmatch(r"rank(\d+)\.safetensors", extra.name)
        if match and int(match.group(1)) >= world:
            problems.add(extra, f"unexpected: mapping.world_size = {world}")
    return ranks


def _read_tensors(path: Path, problems: _Problems) -> dict[str, dict[str, Any]] | None:
    """Name -> {shape, dtype, values (only for scaling factors)} without loading the weights."""
    from safetensors import SafetensorError, safe_open

    out: dict[str, dict[str, Any]] = {}
    try:
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                sl = fh.get_slice(name)
                entry: dict[str, Any] = {"shape": list(sl.get_shape()), "dtype": sl.get_dtype()}
                if name.endswith("scaling_factor"):
                    entry["values"] = fh.get_tensor(name).float().flatten().tolist()
                out[name] = entry
    except (SafetensorError, OSError, RuntimeError) as exc:
        problems.add(path, f"not a readable safetensors file ({exc})")
        return None
    return out


def _expected_shapes(config: dict[str, Any]) -> dict[str, list[int]]:
    """Shapes per rank of the weights TensorRT-LLM loads (unquantized or FP8 weights, TP split)."""
    tp = int(config["mapping"]["tp_size"])
    hidden, heads, kv_heads = (int(config[k]) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads"))
    head = int(config.get("head_size") or hidden // heads)
    shapes = {
        "input_layernorm.weight": [hidden],
        "post_layernorm.weight": [hidden],
        "attention.qkv.weight": [(heads + 2 * kv_heads) * head // tp, hidden],
        "attention.dense.weight": [hidden, heads * head // tp],
    }
    if config.get("intermediate_size"):
        inter = int(config["intermediate_size"]) // tp
        shapes.update({"mlp.fc.weight": [inter, hidden], "mlp.gate.weight": [inter, hidden],
                       "mlp.proj.weight": [hidden, inter]})
    return shapes


def _check_rank(info: dict[str, Any], config: dict[str, Any], problems: _Problems) -> None:
    path, tensors, pp_rank = info["file"], info["tensors"], info["pp_rank"]
    pp, tp = int(config["mapping"]["pp_size"]), int(config["mapping"]["tp_size"])
    n_layers = _stage_layers(config)
    layers: dict[int, set[str]] = {}
    for name in tensors:
        match = LAYER_RE.match(name)
        if match:
            layers.setdefault(int(match.group(1)), set()).add(match.group(2))
    unexpected = sorted(i for i in layers if i >= n_layers)
    if unexpected:
        problems.add(path, f"layers {unexpected} present, but this pipeline stage holds {n_layers} layers "
                           f"(num_hidden_layers / pp_size); layer indices are local to the stage")
    kv_quantized = config["quantization"].get("kv_cache_quant_algo") is not None
    required = [t for t in LAYER_TENSORS if kv_quantized or t != KV_FACTOR]
    if str(config.get("hidden_act", "")).lower() in GATED_ACTS:
        required.append("mlp.gate.weight")
    reference = layers.get(0, set()) - ({KV_FACTOR} if not kv_quantized else set())
    for i in range(n_layers):
        have = layers.get(i, set())
        missing = sorted((set(required) | reference) - have)
        for suffix in missing:
            problems.add(path, f"tensor transformer.layers.{i}.{suffix} is missing")
    stray = sorted(i for i, have in layers.items() if KV_FACTOR in have)
    if stray and not kv_quantized:
        problems.add(path, f"layers {stray} hold {KV_FACTOR}, but quantization.kv_cache_quant_algo is null "
                           f"(recipe quantization.kv_cache none): an unquantized KV cache has no scaling factors")
    _check_stage_tensors(info, config, pp_rank, pp, tp, problems)
    _check_shapes_and_scales(path, tensors, config, problems)


def _check_stage_tensors(info: dict[str, Any], config: dict[str, Any], pp_rank: int, pp: int, tp: int,
                         problems: _Problems) -> None:
    """Embedding on the first pipeline stage; final norm and lm_head on the last."""
    path, tensors = info["file"], info["tensors"]
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    vocab_rows = -(-vocab // tp) if config.get("use_parallel_embedding") else vocab
    wanted: dict[str, list[int]] = {}
    if pp_rank == 0:
        wanted["transformer.vocab_embedding.weight"] = [vocab_rows, hidden]
    if pp_rank == pp - 1:
        wanted["transformer.ln_f.weight"] = [hidden]
        if not config.get("share_embedding_table"):
            wanted["lm_head.weight"] = [-(-vocab // tp), hidden]
    for name, shape in wanted.items():
        if name not in tensors:
            problems.add(path, f"tensor {name} is missing (pipeline stage {pp_rank} of {pp})")
        elif tensors[name]["shape"] != shape:
            problems.add(path, f"tensor {name} has shape {tensors[name]['shape']}, expected {shape}")


def _check_shapes_and_scales(path: Path, tensors: dict[str, dict[str, Any]], config: dict[str, Any],
                             problems: _Problems) -> None:
    shapes = _expected_shapes(config)
    check_shapes = config["quantization"].get("quant_algo") in (None, "FP8")
    for name, entry in sorted(tensors.items()):
        match = LAYER_RE.match(name)
        suffix = match.group(2) if match else None
        if check_shapes and suffix in shapes and entry["shape"] != shapes[suffix]:
            problems.add(path, f"tensor {name} has shape {entry['shape']}, expected {shapes[suffix]} "
                               f"(tp_size {config['mapping']['tp_size']})")
        if "values" in entry:
            values = entry["values"]
            if suffix == KV_FACTOR and (entry["shape"] not in ([1], []) or entry["dtype"] != "F32"):
                problems.add(path, f"tensor {name} is {entry['dtype']} {entry['shape']}, expected F32 [1]")
            bad = [v for v in values if not (math.isfinite(v) and v > 0)]
            if bad or not values:
                problems.add(path, f"tensor {name} holds {bad[:3] or 'no values'}: scaling factors must be "
                                   f"finite and > 0")


def _layer_factors(ranks: list[dict[str, Any]], config: dict[str, Any]) -> list[float]:
    """The kv_cache_scaling_factor of every global layer (from the first TP rank of each stage)."""
    n_layers = _stage_layers(config)
    factors: list[float] = []
    for info in sorted((r for r in ranks if r["rank"] % int(config["mapping"]["tp_size"]) == 0),
                       key=lambda r: r["rank"]):
        for i in range(n_layers):
            entry = info["tensors"].get(f"transformer.layers.{i}.{KV_FACTOR}")
            if entry and entry.get("values"):
                factors.append(entry["values"][0])
    return factors


def _check_kv_scales_json(ckpt_dir: Path, factors: list[float], config: dict[str, Any], problems: _Problems) -> None:
    """When kv_scales.json is present its algorithm and factors must be the ones in config.json and the rank files."""
    from trtkv.contracts.artifacts import KVScalesFile

    path = KVScalesFile.path(ckpt_dir)
    try:
        scales = KVScalesFile.load(ckpt_dir)
    except StageError as exc:
        problems.add(path, f"not readable: {str(exc).removeprefix(str(path)).split('. Next:')[0].lstrip(': ')}")
        return
    if scales is None:
        return
    listed = [layer.kv_cache_scaling_factor for layer in scales.layers]
    algo = config["quantization"].get("kv_cache_quant_algo")
    if scales.kv_cache_quant_algo != algo:
        problems.add(path, f"kv_cache_quant_algo = {scales.kv_cache_quant_algo!r}, but config.json "
                           f"quantization.kv_cache_quant_algo = {algo!r}")
    if len(listed) != len(factors):
        problems.add(path, f"lists {len(listed)} layers, the rank files hold {len(factors)} kv_cache_scaling_factor")
        return
    for i, (a, b) in enumerate(zip(listed, factors, strict=True)):
        if not math.isclose(a, b, rel_tol=1e-5):
            problems.add(path, f"layer {i}: kv_cache_scaling_factor {a} differs from the rank files' {b}")
