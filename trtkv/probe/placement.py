"""Where the probe runs the model: its dtype, and the layers' devices over the visible GPUs (from
their free memory), CPU offload when asked, the prefill chunk; `trtkv probe RECIPE --dry-run` prints
the same plan from the config alone.

The plan is computed once, from the model's config on the `meta` device (no weights: accelerate's
module sizes in the probe's dtype), and is the device map the real run loads with (transformers'
from_pretrained(device_map=...)): layers in order, balanced over the GPUs, each GPU holding its
layers' weights, their largest KV cache (the 16-bit reference's: a probe pass holds one cache at a
time), the working memory of a prefill chunk and, on the last GPU, the LM head's logits and the
passes' hidden states; what no GPU holds goes to the CPU with `offload`, else the plan does not fit.
A quantized cache layer is created on the device its layer's keys arrive on, so each layer's cache
sits with its layer (tests/probe/test_placement.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trtkv.core.errors import TrtkvError
from trtkv.units import GIB

if TYPE_CHECKING:
    from trtkv.recipe import Recipe

GPU_PREFILL_CHUNK = 2048  # tokens per prefill chunk on GPUs (activations scale with it)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LOGIT_CHUNK = 512  # rows of the LM head at a time (its logits: rows x vocabulary x float32)
# temporaries of trtkv.kvcache.attention per query chunk (scores, P, its FP8 copy, weights)
ENGINE_SCORE_COPIES = 6


def probe_dtype(recipe: Recipe, cuda: bool) -> str:
    """The probe's weights/compute dtype: probe.dtype, or auto = the model's 16-bit dtype on a GPU,
    float32 on the CPU."""
    chosen = recipe.probe.dtype
    if chosen != "auto":
        return chosen
    return recipe.model.dtype.value if cuda else "float32"


def reference_format(dtype: str) -> str:
    """The baseline KV format of a probe run in `dtype`: bf16 where the model runs in bf16 (as the
    engines store a 16-bit cache), else fp16 (float32 compute, K/V stored as float16: the CPU
    probe's baseline since the start)."""
    return "bf16" if dtype == "bfloat16" else "fp16"


@dataclass
class DevicePlan:
    """One device's share: its layers and the bytes it holds."""

    device: str
    capacity_bytes: float
    modules: list[str] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    weights_bytes: float = 0.0
    kv_bytes: float = 0.0
    work_bytes: float = 0.0
    reserve_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes + self.work_bytes + self.reserve_bytes


@dataclass
class Placement:
    """The probe's placement: device map, per-device memory, dtype, prefill chunk; fits or not (and
    why)."""

    dtype: str
    length: int
    chunk: int | None
    devices: list[DevicePlan]
    device_map: dict[str, str]
    fits: bool
    why: str = ""
    weights_bytes: float = 0.0
    kv_bytes: float = 0.0

    def lines(self) -> list[str]:
        """What --dry-run prints."""
        chunk = f"prefill chunks of {self.chunk} tokens" if self.chunk else "one prefill pass"
        out = [
            f"probe placement: {self.dtype} weights, {self.length}-token passes, {chunk}: "
            f"{'fits' if self.fits else 'DOES NOT FIT'}" + (f" ({self.why})" if self.why else "")
        ]
        for d in self.devices:
            if not d.modules:
                continue
            span = f"layers {d.layers[0]}-{d.layers[-1]}" if d.layers else "no decoder layers"
            extra = [m for m in d.modules if not m.startswith("layers.")]
            out.append(
                f"  {d.device}: {span}{' + ' + ', '.join(extra) if extra else ''}; weights "
                f"{d.weights_bytes / GIB:.2f} GiB + KV {d.kv_bytes / GIB:.2f} GiB + working "
                f"{d.work_bytes / GIB:.2f} GiB + reserve {d.reserve_bytes / GIB:.2f} GiB = "
                f"{d.total_bytes / GIB:.2f} of {d.capacity_bytes / GIB:.2f} GiB"
            )
        return out


def meta_model(config: Any, dtype: str) -> Any:
    """The model built from its config on the `meta` device: shapes only, it cannot compute."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))


def module_sizes(model: Any, dtype: str) -> tuple[str, list[int], dict[str, int]]:
    """(the decoder layers' module path, bytes per decoder layer, bytes of every other top-level
    module) in `dtype`."""
    import torch
    from accelerate.utils import compute_module_sizes

    sizes = compute_module_sizes(model, dtype=getattr(torch, dtype))
    inner = next(
        (
            name
            for name in ("model", "model.language_model", "transformer")
            if f"{name}.layers" in sizes or f"{name}.h" in sizes
        ),
        None,
    )
    if inner is None:
        raise TrtkvError(
            f"probe placement: {type(model).__name__} has no model.layers to place. Next: run the "
            "probe on one device (it loads there when no plan is needed)."
        )
    stack = f"{inner}.layers" if f"{inner}.layers" in sizes else f"{inner}.h"
    count = len(dict(model.named_modules())[stack])
    layers = [sizes[f"{stack}.{i}"] for i in range(count)]
    others = {}
    for name, _ in model.named_children():
        if name == inner.split(".")[0]:
            sub = dict(model.named_modules())[inner]
            others.update(
                {
                    f"{inner}.{n}": sizes.get(f"{inner}.{n}", 0)
                    for n, _ in sub.named_children()
                    if f"{inner}.{n}" != stack
                }
            )
        else:
            others[name] = sizes.get(name, 0)
    return stack, layers, others


def layer_kv_bytes(config: Any, dtype: str, length: int) -> list[float]:
    """Per layer, the reference cache's bytes at `length` tokens (16-bit K and V; a sliding layer
    holds its window)."""
    from trtkv.probe.window import layer_types

    text = config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_token = 2 * text.num_key_value_heads * head_dim * min(2, DTYPE_BYTES[dtype])
    window = getattr(text, "sliding_window", None)
    return [
        per_token * (min(length, window) if kind == "sliding_attention" and window else length)
        for kind in layer_types(config)
    ]


def work_bytes(config: Any, dtype: str, length: int, chunk: int | None, last: bool) -> float:
    """Working memory of one device during a pass: a prefill chunk's activations, one layer's
    dequantized K/V, the engine attention's score chunk; on the last device also the LM head's
    logits chunk and the passes' hidden states."""
    from trtkv.kvcache.attention import SCORE_BUDGET_BYTES

    text = config.get_text_config(decoder=True)
    b = DTYPE_BYTES[dtype]
    rows = chunk or length
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    qkv = (text.num_attention_heads + 2 * text.num_key_value_heads) * head_dim
    act = (
        rows
        * b
        * (4 * text.hidden_size + 3 * (text.intermediate_size or 4 * text.hidden_size) + qkv)
    )
    act += rows * length  # the boolean attention mask of a chunk
    dequant = 2 * text.num_key_value_heads * head_dim * length * b
    total = act + dequant + ENGINE_SCORE_COPIES * SCORE_BUDGET_BYTES
    if last:
        total += LOGIT_CHUNK * text.vocab_size * 4 * 3 + 2 * length * text.hidden_size * b
    return float(total)


def plan_placement(
    config: Any,
    dtype: str,
    length: int,
    capacities: dict[str, float],
    chunk: int | None,
    offload: bool = False,
    host_bytes: float | None = None,
    reserve_bytes: float = 0.0,
) -> Placement:
    """Place the model's modules over `capacities` ({"cuda:0": bytes, ...}, in order), balanced by
    bytes; layers no GPU holds go to "cpu" when `offload` (host_bytes: its capacity), else the plan
    does not fit."""
    model = meta_model(config, dtype)
    stack, layers, others = module_sizes(model, dtype)
    kv = layer_kv_bytes(config, dtype, length)
    devices = [
        DevicePlan(name, cap, reserve_bytes=reserve_bytes) for name, cap in capacities.items()
    ]
    if offload:
        devices.append(DevicePlan("cpu", host_bytes if host_bytes is not None else math.inf))
    gpus = [d for d in devices if d.device != "cpu"] or devices
    head = [n for n in others if not n.endswith(("embed_tokens", "wte", "rotary_emb"))]
    first_mods = [n for n in others if n not in head]
    cost = [w + k for w, k in zip(layers, kv, strict=True)]
    target = (sum(cost) + sum(others.values())) / len(gpus)
    dev_i = 0
    device_map: dict[str, str] = {}

    def put(
        d: DevicePlan, name: str, weights: float, kv_b: float = 0.0, layer: int | None = None
    ) -> None:
        d.modules.append(name.split(".", 1)[-1] if layer is None else f"layers.{layer}")
        d.weights_bytes += weights
        d.kv_bytes += kv_b
        if layer is not None:
            d.layers.append(layer)
        device_map[name] = d.device

    for name in first_mods:
        put(devices[0], name, others[name])
    for i, c in enumerate(cost):
        while dev_i < len(devices) - 1:
            d = devices[dev_i]
            room = (
                d.capacity_bytes
                - d.total_bytes
                - work_bytes(config, dtype, length, chunk, dev_i == len(gpus) - 1)
            )
            if c <= room and (
                d.device == "cpu" or sum(cost[j] for j in d.layers) + c <= target or not d.layers
            ):
                break
            dev_i += 1
        put(devices[dev_i], f"{stack}.{i}", layers[i], kv[i], i)
    last = max((d for d in devices if d.modules), key=lambda d: devices.index(d))
    for name in head:
        put(last if last.device != "cpu" else gpus[-1], name, others[name])
    used = [d for d in devices if d.modules]
    for d in used:
        d.work_bytes = work_bytes(
            config, dtype, length, chunk, d is used[-1] or (d is gpus[-1] and d in used)
        )
    over = [d for d in used if d.total_bytes > d.capacity_bytes]
    why = "; ".join(
        f"{d.device} needs {d.total_bytes / GIB:.1f} GiB of {d.capacity_bytes / GIB:.1f}"
        for d in over
    )
    if not offload and any(d.device == "cpu" for d in used):
        why = "layers left for the CPU without offload"
    return Placement(
        dtype,
        length,
        chunk,
        devices,
        device_map,
        fits=not over and not why,
        why=why,
        weights_bytes=sum(layers) + sum(others.values()),
        kv_bytes=sum(kv),
    )


def recipe_config(recipe: Recipe) -> Any:
    """The model's transformers config: its config.json where it is on this machine, else one built
    from the recipe's model section (Llama-family architectures: the recipe names every
    dimension)."""
    from transformers import AutoConfig, LlamaConfig

    from trtkv.checkpoints.models import local_model_dir

    folder = local_model_dir(recipe)
    if folder is not None and (folder / "config.json").is_file():
        return AutoConfig.from_pretrained(str(folder))
    m = recipe.model
    # the recipe's model fields by their LlamaConfig names, in the order a missing one is listed
    fields = {
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_attention_heads",
        "num_key_value_heads": "num_kv_heads",
        "head_dim": "head_dim",
        "hidden_size": "hidden_size",
        "intermediate_size": "intermediate_size",
        "vocab_size": "vocab_size",
    }
    missing = [k for k in fields.values() if getattr(m, k) is None]
    if m.architecture not in ("llama", "mistral") or missing:
        raise TrtkvError(
            f"{recipe.path}: probe --dry-run needs the model's config.json or a Llama-family "
            f"recipe with every dimension (missing: {', '.join(missing) or 'none'}; architecture "
            f"{m.architecture}). Next: put the model's folder where model.source points, or add "
            "the fields."
        )
    dims: dict[str, Any] = {name: getattr(m, k) for name, k in fields.items()}
    return LlamaConfig(
        **dims, max_position_embeddings=m.max_position_embeddings or 8192, tie_word_embeddings=False
    )


def recipe_capacities(recipe: Recipe) -> tuple[dict[str, float], float]:
    """({device: bytes}, per-GPU reserve) of the recipe's hardware: hardware.count GPUs of the
    recipe's GPU (hardware.memory_gib when given), each keeping the CUDA context and torch's own
    allocations that a run on the GPU finds already taken when it reads the free memory
    (trtkv.platform.hardware.CUDA_CONTEXT_GIB, the engine-independent process figure; one process,
    no NCCL); the CPU recipe: host memory."""
    from trtkv.platform.hardware import CUDA_CONTEXT_GIB, GPU, GPU_SPECS
    from trtkv.platform.host import host_memory_bytes

    hw = recipe.hardware
    if hw.gpu is GPU.CPU:
        return {"cpu": host_memory_bytes() or 0.0}, 0.0
    per_gpu = (hw.memory_gib or GPU_SPECS[hw.gpu].memory_gib) * GIB
    return {f"cuda:{i}": per_gpu for i in range(hw.count)}, CUDA_CONTEXT_GIB * GIB


def dry_run(recipe: Recipe, settings: Any) -> tuple[Placement, list[str]]:
    """The placement on the recipe's hardware and the passes the run would make, from the config
    alone."""
    from trtkv.kvcache.attention_modes import load_attention
    from trtkv.kvcache.names import parse_format
    from trtkv.probe.attention import applies

    caps, reserve = recipe_capacities(recipe)
    cuda = not (len(caps) == 1 and "cpu" in caps)
    dtype = settings.dtype or probe_dtype(recipe, cuda)
    chunk = (
        settings.prefill_chunk
        if settings.prefill_chunk is not None
        else (GPU_PREFILL_CHUNK if cuda else None)
    )
    longest = max(settings.lengths)
    placement = plan_placement(
        recipe_config(recipe), dtype, longest, caps, chunk, settings.offload, reserve_bytes=reserve
    )
    table = load_attention()
    passes = [
        f"  passes at {longest} tokens (every length up to it is a prefix): "
        + ", ".join(
            f"{fmt}"
            + "".join(
                f" + {m}"
                for m in settings.attention[1:]
                if applies(table.mode(m), parse_format(fmt))
            )
            for fmt in settings.formats
        )
    ]
    if settings.needle_lengths:
        passes.append(
            f"  needles at {settings.needle_lengths} (depths {settings.needle_depths}, "
            f"{settings.needle_seeds} seeds)"
        )
    engine = [m for m in settings.attention[1:]]
    passes.append(
        f"  prefill vs decode: {settings.decode_prompt}-token prompt + {settings.decode_steps} "
        "decoded tokens per engine mode "
        f"({', '.join(engine) or 'none: cache-only drift is 0 by construction'})"
    )
    reasons = [
        f"  attention {m}: {settings.attention_reasons.get(m, '')}" for m in settings.attention
    ]
    return placement, [*placement.lines(), *passes, *reasons]
