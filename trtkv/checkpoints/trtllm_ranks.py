"""The rank files of a TensorRT-LLM checkpoint (`rank{r}.safetensors`), checked without loading the
weights: every rank present for `mapping.world_size`, each decoder layer's tensors on every rank of
its pipeline stage (layer indices local to the stage), the embedding on the first stage and the
final norm and lm_head on the last, shapes per tensor parallel split, one finite positive F32
`kv_cache_scaling_factor` per layer when the KV cache is quantized and none when it is not. Also the
problem list every check of trtkv.checkpoints.trtllm_checkpoint adds to."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError

KV_FACTOR = "attention.kv_cache_scaling_factor"
LAYER_RE = re.compile(r"^transformer\.layers\.(\d+)\.(.+)$")
# per decoder layer, present on every rank (the gate projection is required for gated activations;
# the KV factor only when the KV cache is quantized)
LAYER_TENSORS = (
    "input_layernorm.weight",
    "post_layernorm.weight",
    "attention.qkv.weight",
    "attention.dense.weight",
    "mlp.fc.weight",
    "mlp.proj.weight",
    KV_FACTOR,
)
GATED_ACTS = ("silu", "swiglu", "gelu_pytorch_tanh", "geglu")


class Problems:
    """Collects every problem so a corrupted checkpoint is described in one round trip."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: Path | str, msg: str) -> None:
        self.items.append(f"{where}: {msg}")

    def raise_if_any(self, ckpt_dir: Path) -> None:
        if self.items:
            raise StageError(
                f"TensorRT-LLM checkpoint {ckpt_dir} is not valid, found "
                f"{StageError.listing(self.items)}\nNext: rerun `trtkv calibrate <recipe> --force` "
                "to re-export it."
            )


def _stage_layers(config: dict[str, Any]) -> int:
    return int(config["num_hidden_layers"]) // int(config["mapping"]["pp_size"])


def check_ranks(ckpt_dir: Path, config: dict[str, Any], problems: Problems) -> list[dict[str, Any]]:
    """Open every rank file and check its tensors; returns [{file, rank, pp_rank, tensors: {name:
    info}}]."""
    mapping = config["mapping"]
    world, tp = int(mapping["world_size"]), int(mapping["tp_size"])
    ranks = []
    for rank in range(world):
        path = ckpt_dir / f"rank{rank}.safetensors"
        if not path.is_file():
            problems.add(
                path, f"missing (mapping.world_size = {world} needs rank0..rank{world - 1})"
            )
            continue
        tensors: dict[str, dict[str, Any]] = {}
        if not read_tensor_infos(path, "scaling_factor", tensors, problems.items):
            continue
        info = {"file": path, "rank": rank, "pp_rank": rank // tp, "tensors": tensors}
        _check_rank(info, config, problems)
        ranks.append(info)
    for extra in sorted(ckpt_dir.glob("rank*.safetensors")):
        match = re.fullmatch(r"rank(\d+)\.safetensors", extra.name)
        if match and int(match.group(1)) >= world:
            problems.add(extra, f"unexpected: mapping.world_size = {world}")
    return ranks


def read_tensor_infos(
    path: Path, scale_end: str, out: dict[str, dict[str, Any]], problems: list[str], **extra: Any
) -> bool:
    """Adds name -> {shape, dtype, values (names ending in `scale_end` only), **extra} of each
    tensor of one safetensors file to `out`, without loading the weights; False, the problem said,
    when it cannot be read (the TensorRT-LLM rank files and the HF export are checked alike)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                sl = fh.get_slice(name)
                entry: dict[str, Any] = {"shape": list(sl.get_shape()), "dtype": sl.get_dtype()}
                if name.endswith(scale_end):
                    entry["values"] = fh.get_tensor(name).float().flatten().tolist()
                out[name] = {**entry, **extra}
    except (SafetensorError, OSError, RuntimeError) as exc:
        problems.append(f"{path}: not a readable safetensors file ({exc})")
        return False
    return True


def _expected_shapes(config: dict[str, Any]) -> dict[str, list[int]]:
    """Shapes per rank of the weights TensorRT-LLM loads (unquantized or FP8 weights, TP split)."""
    tp = int(config["mapping"]["tp_size"])
    hidden, heads, kv_heads = (
        int(config[k]) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")
    )
    head = int(config.get("head_size") or hidden // heads)
    shapes = {
        "input_layernorm.weight": [hidden],
        "post_layernorm.weight": [hidden],
        "attention.qkv.weight": [(heads + 2 * kv_heads) * head // tp, hidden],
        "attention.dense.weight": [hidden, heads * head // tp],
    }
    if config.get("intermediate_size"):
        inter = int(config["intermediate_size"]) // tp
        shapes.update(
            {
                "mlp.fc.weight": [inter, hidden],
                "mlp.gate.weight": [inter, hidden],
                "mlp.proj.weight": [hidden, inter],
            }
        )
    return shapes


def _check_rank(info: dict[str, Any], config: dict[str, Any], problems: Problems) -> None:
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
        problems.add(
            path,
            f"layers {unexpected} present, but this pipeline stage holds {n_layers} layers "
            f"(num_hidden_layers / pp_size); layer indices are local to the stage",
        )
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
        problems.add(
            path,
            f"layers {stray} hold {KV_FACTOR}, but quantization.kv_cache_quant_algo is null "
            f"(recipe quantization.kv_cache none): an unquantized KV cache has no scaling factors",
        )
    _check_stage_tensors(info, config, pp_rank, pp, tp, problems)
    _check_shapes_and_scales(path, tensors, config, problems)


def _check_stage_tensors(
    info: dict[str, Any],
    config: dict[str, Any],
    pp_rank: int,
    pp: int,
    tp: int,
    problems: Problems,
) -> None:
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
            problems.add(
                path, f"tensor {name} has shape {tensors[name]['shape']}, expected {shape}"
            )


def _check_shapes_and_scales(
    path: Path, tensors: dict[str, dict[str, Any]], config: dict[str, Any], problems: Problems
) -> None:
    shapes = _expected_shapes(config)
    check_shapes = config["quantization"].get("quant_algo") in (None, "FP8")
    for name, entry in sorted(tensors.items()):
        match = LAYER_RE.match(name)
        suffix = match.group(2) if match else None
        if check_shapes and suffix in shapes and entry["shape"] != shapes[suffix]:
            problems.add(
                path,
                f"tensor {name} has shape {entry['shape']}, expected {shapes[suffix]} "
                f"(tp_size {config['mapping']['tp_size']})",
            )
        if "values" in entry:
            values = entry["values"]
            if suffix == KV_FACTOR and (entry["shape"] not in ([1], []) or entry["dtype"] != "F32"):
                problems.add(
                    path, f"tensor {name} is {entry['dtype']} {entry['shape']}, expected F32 [1]"
                )
            bad = [v for v in values if not (math.isfinite(v) and v > 0)]
            if bad or not values:
                problems.add(
                    path,
                    f"tensor {name} holds {bad[:3] or 'no values'}: scaling factors must be "
                    f"finite and > 0",
                )


def layer_factors(ranks: list[dict[str, Any]], config: dict[str, Any]) -> list[float]:
    """The kv_cache_scaling_factor of every global layer (from the first TP rank of each stage)."""
    n_layers = _stage_layers(config)
    factors: list[float] = []
    for info in sorted(
        (r for r in ranks if r["rank"] % int(config["mapping"]["tp_size"]) == 0),
        key=lambda r: r["rank"],
    ):
        for i in range(n_layers):
            entry = info["tensors"].get(f"transformer.layers.{i}.{KV_FACTOR}")
            if entry and entry.get("values"):
                factors.append(entry["values"][0])
    return factors
