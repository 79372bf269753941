"""The probe's settings, constants and the loaded model + evaluation text."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trtkv.core.errors import StageError, TrtkvError
from trtkv.kvcache.names import FormatChoice, parse_format
from trtkv.platform.host import auto_threads
from trtkv.probe.placement import LOGIT_CHUNK  # noqa: F401 - the probe's constants in one place

if TYPE_CHECKING:
    from trtkv.recipe import Recipe


# bump when the numbers a cached result holds would change (4: EOS-joined calibration batches)
METHOD_VERSION = 4
REFERENCE = "fp16"
DECODE_PROMPT = 1024
DECODE_STEPS = 32
# a windowed model's LM head runs at this many evenly spaced positions of the longest pass
HEAD_POSITIONS = 2048
# default needle lengths: the longest sweep length <= this (keeps the default sweep ~15 min)
NEEDLE_DEFAULT_MAX = 512
SEMANTICS = {
    "fp16": "reference: K/V stored as float16 (float32 compute); KL 0 by construction",
    "bf16": "K/V stored as bfloat16 (what a bf16 deployment of this model caches)",
    "fp8": "HF/vLLM: E4M3, separate static K and V scales per layer = calibrated amax/448 "
    "(unclamped), x/scale saturated at +-448",
    "fp8_scale1": "vLLM without scales (scale 1.0); also TensorRT-LLM <= 1.2 whenever the model's "
    "KV amax < 448, because ModelOpt clamps the exported FP8 kv_cache_scaling_factor to >= 1.0",
    "fp8_affine": "ModelOpt 0.47 --kv_cache_qformat fp8_affine: E4M3 of (x - bias) * scale, scale "
    "= float32(448/amax), read back as code * float32(1/scale) + bias; per layer one amax of x - "
    "bias for K and one for V and a bias per (KV head, channel), from the probe's own calibration "
    "pass collected as ModelOpt does; no serving engine reads the bias (see "
    "trtkv/data/kv_formats.json)",
    "int8": "TensorRT-LLM int8_kv_cache: ONE static scale per layer shared by K and V = "
    "max(k_amax, v_amax)/127, round-half-even(x * 1/scale), saturated to [-128, 127]",
    "int8_split": "trtkv variant: int8 with separate static K and V scales (amax/127 each); no "
    "TensorRT-LLM <= 1.2 equivalent",
}


def semantics(choice: FormatChoice) -> str:
    """What runtime a probed format follows: the hand-written line above, else its row in
    trtkv/data/kv_formats.json (engine, version, value, and the numerics' element/scale/rotation;
    the storage's description for a format no engine serves)."""
    if choice.name in SEMANTICS:
        return SEMANTICS[choice.name]
    from trtkv.kvcache.engines import load_table

    row = load_table().for_probe(choice.name)
    if row is None:
        return choice.base.value
    if row.storage and not row.engines:
        return row.storage.description
    engines = ", ".join(f"{e.engine} {e.version} {e.config} {e.value}" for e in row.engines)
    num = row.numerics
    return f"{engines}: {num['element']}; {num['scale']}; rotation: {num['rotation']}"


@dataclass
class ProbeSettings:
    """What one probe run measures."""

    formats: list[str]
    lengths: list[int]
    needle_lengths: list[int]
    needle_depths: list[float]
    needle_seeds: int
    decode_prompt: int = DECODE_PROMPT
    decode_steps: int = DECODE_STEPS
    scales_path: Path | None = None
    threads: int | None = None
    progress: bool = True
    needle_formats: list[str] | None = None  # formats scored on needles (None: every format)
    ruler: Any = None  # trtkv.probe.ruler.RulerPlan (the bench's RULER items); None: RULER not run
    # cache_only first, then engine modes
    attention: list[str] = field(default_factory=lambda: ["cache_only"])
    attention_reasons: dict[str, str] = field(default_factory=dict)
    # weights/compute dtype (trtkv.probe.placement.probe_dtype); None: resolved at load
    dtype: str | None = None
    prefill_chunk: int | None = None  # tokens per prefill chunk (None: one pass)
    offload: bool = False  # layers no GPU holds go to CPU memory


@dataclass
class Loaded:
    """The model, its tokenizer and the text the probe runs on."""

    model: Any
    tokenizer: Any
    device: torch.device
    model_dir: Path
    text_ids: list[int]
    haystack_ids: list[int]
    key: str
    info: dict = field(default_factory=dict)
    # trtkv.probe.needles.NeedlePlan: the needles written into text_ids (a windowed model's)
    needles: Any = None
    # the baseline format: fp16 (float32 compute), bf16 (the model in bf16)
    reference: str = REFERENCE
    prefill_chunk: int | None = None
    # trtkv.probe.placement.Placement of a model sharded over GPUs; None: one device
    placement: Any = None


# ----------------------------------------------------------------------------- settings


def default_settings(
    recipe: Recipe,
    formats: list[str] | None = None,
    lengths: list[int] | None = None,
    needle_lengths: list[int] | None = None,
    attention: str | None = None,
    cuda: bool | None = None,
) -> ProbeSettings:
    """Settings from the recipe's probe section, overridden by the CLI's lists; `cuda`: whether the
    run has GPUs (None: torch says), which picks the dtype (and with it the baseline's name) and the
    prefill chunk."""
    from trtkv.probe.attention import resolve_modes
    from trtkv.probe.placement import GPU_PREFILL_CHUNK, probe_dtype, reference_format

    cuda = torch.cuda.is_available() if cuda is None else cuda
    dtype = probe_dtype(recipe, cuda)
    reference = reference_format(dtype)
    fmts = [parse_format(f).name for f in (formats or list(recipe.probe.formats))]
    fmts = [reference] + [f for f in dict.fromkeys(fmts) if f != reference]
    lens = sorted(set(lengths or recipe.probe.lengths))
    max_pos = recipe.model.max_position_embeddings
    if max_pos and max(lens) > max_pos:
        raise TrtkvError(
            f"probe lengths {lens}: {max(lens)} exceeds the model's max_position_embeddings "
            f"{max_pos}. Next: pass --lengths up to {max_pos}."
        )
    if any(n < 16 for n in lens):
        raise TrtkvError(f"probe lengths {lens}: every length must be >= 16 tokens.")
    if needle_lengths is None:
        short = [n for n in lens if n <= NEEDLE_DEFAULT_MAX]
        needle_lengths = [max(short)] if short else [min(lens)]
    if any(n < 64 for n in needle_lengths):
        raise TrtkvError(
            f"needle lengths {needle_lengths}: each must be >= 64 tokens (haystack + passkey + "
            "question)."
        )
    modes, reasons = resolve_modes(recipe, attention)
    chunk = recipe.probe.prefill_chunk or (GPU_PREFILL_CHUNK if cuda else None)
    return ProbeSettings(
        formats=fmts,
        lengths=lens,
        needle_lengths=sorted(set(needle_lengths)),
        needle_depths=list(recipe.probe.needle_depths),
        needle_seeds=recipe.probe.needle_seeds,
        attention=modes,
        attention_reasons=reasons,
        dtype=dtype,
        prefill_chunk=chunk,
        offload=recipe.probe.offload,
    )


# ----------------------------------------------------------------------------- loading


def _file_digest(path: Path, limit: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(limit))
    h.update(str(path.stat().st_size).encode())
    return h.hexdigest()[:16]


def load_model(recipe: Recipe, settings: ProbeSettings) -> Loaded:
    """The recipe's model in float32 (CUDA when present), its tokenizer and the eval text as token
    ids."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trtkv.checkpoints.models import resolve_model_dir
    from trtkv.core.paths import project_root
    from trtkv.core.texts import EVAL_LONG_TEXT, eval_long_text

    torch.set_num_threads(settings.threads or auto_threads())
    model_dir = resolve_model_dir(recipe)
    cuda = torch.cuda.is_available()
    dtype = settings.dtype or ("bfloat16" if cuda else "float32")
    from trtkv.probe.window import layer_types, sliding_window

    config = AutoConfig.from_pretrained(str(model_dir))
    window = sliding_window(config)
    extra: dict[str, Any] = {}
    # the windowed path: SDPA where exact (no attention logit softcapping), sampled LM head
    if window:
        text = config.get_text_config(decoder=True)
        exact = getattr(text, "attn_logit_softcapping", None) is None
        extra = {"attn_implementation": "sdpa" if exact else "eager"}
    placement = place(config, dtype, max(settings.lengths), settings) if cuda else None
    if placement is not None:
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype), device_map=placement.device_map, **extra
        ).eval()
        device = torch.device(next(iter(placement.device_map.values())))
    else:
        device = torch.device("cpu")
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype), **extra
        )
        model = model.to(device).eval()  # type: ignore[arg-type]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    texts = eval_long_text()
    need = max(settings.lengths)
    plan = None
    # the needles ride in the KL pass's text (trtkv.probe.needles)
    if window and settings.needle_lengths:
        from trtkv.probe.needles import place_needles, plan_needles

        if max(settings.needle_lengths) > need:
            raise TrtkvError(
                f"needle lengths {settings.needle_lengths}: on a sliding-window model the needles "
                f"are asked from the KL pass, which is {need} tokens. Next: --needle-lengths up to "
                f"{need}."
            )
        needles = plan_needles(
            tokenizer, settings.needle_lengths, settings.needle_depths, settings.needle_seeds
        )
        raw = _tokens(tokenizer, texts, need + sum(len(n.ids) for n in needles))
        text_ids, plan = place_needles(raw, needles, need)
    else:
        text_ids = _tokens(tokenizer, texts, need)
    # the needle's haystack: another part of the text (none needed with --no-needle)
    haystack_ids = (
        _tokens(tokenizer, list(reversed(texts)), max(settings.needle_lengths))
        if settings.needle_lengths
        else []
    )
    weights = sorted(model_dir.glob("*.safetensors"))
    key_src = {
        "config": (model_dir / "config.json").read_text(),
        "weights": [(w.name, w.stat().st_size) for w in weights],
        "eval": _file_digest(project_root() / EVAL_LONG_TEXT),
        "method": METHOD_VERSION,
        "device": device.type,
    }
    # keyed only off the CPU default, so caches made before dtypes were chosen stay valid
    if dtype != "float32":
        key_src["dtype"] = dtype
    windowed: dict[str, Any] = {}
    if window:
        kinds = layer_types(config)
        windowed = {
            "sliding_window": window,
            "head_positions": HEAD_POSITIONS,
            "attn_implementation": extra["attn_implementation"],
            "full_layers": [i for i, k in enumerate(kinds) if k != "sliding_attention"],
        }
        key_src["windowed"] = windowed
        key_src["needles"] = plan.describe() if plan is not None else None
    key = hashlib.sha256(json.dumps(key_src, sort_keys=True).encode()).hexdigest()[:16]
    return Loaded(
        model,
        tokenizer,
        device,
        model_dir,
        text_ids,
        haystack_ids,
        key,
        {
            "model_dir": str(model_dir),
            "device": str(device),
            "threads": torch.get_num_threads(),
            "compute_dtype": dtype,
            "num_layers": model.config.num_hidden_layers,
            "num_kv_heads": model.config.num_key_value_heads,
            "head_dim": getattr(model.config, "head_dim", None)
            or model.config.hidden_size // model.config.num_attention_heads,
            **windowed,
            **({"device_map": placement.device_map} if placement is not None else {}),
        },
        plan,
        reference=reference_name(dtype),
        prefill_chunk=settings.prefill_chunk,
        placement=placement,
    )


def reference_name(dtype: str) -> str:
    from trtkv.probe.placement import reference_format

    return reference_format(dtype)


def place(config: Any, dtype: str, length: int, settings: ProbeSettings) -> Any:
    """The placement over this machine's GPUs, from each one's free memory (trtkv.probe.placement);
    a TrtkvError with the plan when it does not fit."""
    from trtkv.platform.host import host_memory_bytes
    from trtkv.probe.placement import plan_placement

    caps = {
        f"cuda:{i}": float(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())
    }
    placement = plan_placement(
        config,
        dtype,
        length,
        caps,
        settings.prefill_chunk,
        settings.offload,
        host_bytes=host_memory_bytes() or 0.0,
    )
    if not placement.fits:
        raise TrtkvError(
            "the probe's model does not fit this machine's GPUs:\n"
            + "\n".join(placement.lines())
            + "\nNext: probe.offload=true (layers that do not fit go to CPU memory), shorter "
            "--lengths, or a smaller probe.prefill_chunk."
        )
    return placement


def _tokens(tokenizer, texts: list[str], need: int) -> list[int]:  # noqa: ANN001
    ids: list[int] = []
    for text in texts:
        ids += tokenizer(text + "\n\n", add_special_tokens=False).input_ids
        if len(ids) >= need:
            return ids[:need]
    raise StageError(
        f"the evaluation text has only {len(ids)} tokens, the probe needs {need}. "
        f"Next: pass shorter --lengths."
    )


def write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(path)
