"""Small quantized checkpoints the tests build on the CPU from the packaged SmolLM2-135M (its first LAYERS decoder
layers, real weights): ModelOpt's own export (mtq.quantize + export_hf_checkpoint) for FP8 (with FP8 KV), NVFP4
and INT4 AWQ. Each is cached under <trtkv cache>/test-checkpoints/<name>-<hash of its inputs> (format, layer
count, ModelOpt / torch / transformers versions, the builder's source, the converted model's mark), like the other
caches, so a suite pays the export once per machine."""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

LAYERS = 2
AWQ_ALPHA_STEP = 0.5  # AWQ-lite's grid: alphas 0, 0.5, 1
INT4_GROUP = 64  # INT4 AWQ's group: SmolLM2's hidden 576 and intermediate 1536 are multiples of 64, not of 128
# mtq preset per format, and whether the checkpoint also declares an FP8 KV cache (ModelOpt's FP8 KV preset)
MODELOPT = {"fp8": ("FP8_DEFAULT_CFG", True), "nvfp4": ("NVFP4_DEFAULT_CFG", False),
            "int4_awq": ("INT4_AWQ_CFG", False)}
TEXT = ("The quick brown fox jumps over the lazy dog. A checkpoint arrives quantized; the planner reads its "
        "headers and prices the weights as they are stored, group by group.")


def _key(*parts: str) -> str:
    """The inputs' hash; the versions read from the installed metadata (the same strings as the packages'
    __version__), so a cached checkpoint costs no ModelOpt / torch import."""
    from importlib.metadata import version

    data = [*parts, LAYERS, *(version(p) for p in ("nvidia-modelopt", "torch", "transformers"))]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:12]


def _cached(name: str, key: str, build: object) -> Path:
    """<cache>/test-checkpoints/<name>-<key>, built into a temporary sibling and renamed into place."""
    from trtkv.core.paths import cache_dir

    root = cache_dir() / "test-checkpoints"
    out = root / f"{name}-{key}"
    if (out / "config.json").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        build(tmp)  # type: ignore[operator]
        os.replace(tmp, out) if not out.exists() else shutil.rmtree(tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def modelopt_checkpoint(fmt: str, source: Path) -> Path:
    """ModelOpt's unified HF export of SmolLM2's first LAYERS layers in `fmt` (fp8, nvfp4, int4_awq)."""
    mark = (source / "trtkv_converted.json").read_text()
    key = _key("modelopt", fmt, mark, inspect.getsource(_export), json.dumps(MODELOPT[fmt]), TEXT, str(INT4_GROUP),
               str(AWQ_ALPHA_STEP))
    return _cached(f"modelopt-{fmt}", key, lambda out: _export(fmt, source, out))


def _export(fmt: str, source: Path, out: Path) -> None:
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    preset, fp8_kv = MODELOPT[fmt]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(source, num_hidden_layers=LAYERS, dtype=torch.bfloat16).eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    batch = tokenizer([TEXT] * 2, return_tensors="pt")["input_ids"]
    cfg = copy.deepcopy(getattr(mtq, preset))
    if fmt == "int4_awq":  # SmolLM2's 576 columns hold no whole 128-block (ModelOpt packs whole blocks only)
        for entry in cfg["quant_cfg"]:
            if entry.get("quantizer_name") == "*weight_quantizer":
                entry["cfg"]["block_sizes"] = {**entry["cfg"]["block_sizes"], -1: INT4_GROUP}
        # AWQ-lite searches its smoothing exponent over a grid, one fake-quantized forward of every linear per point:
        # 3 points instead of the preset's 11 (alpha_step 0.1) write the same tensors (pre_quant_scale, packed int4,
        # per-group scales) in a third of the time; the fixture is for recognising and pricing the format
        cfg["algorithm"] = {**cfg["algorithm"], "alpha_step": AWQ_ALPHA_STEP}
    if fp8_kv:
        from modelopt.recipe.presets import KV_QUANT_CFG_CHOICES
        from modelopt.torch.quantization.utils.core_utils import update_quant_cfg_with_kv_cache_quant

        cfg = update_quant_cfg_with_kv_cache_quant(cfg, copy.deepcopy(KV_QUANT_CFG_CHOICES["fp8"]["quant_cfg"]))

    def loop(m: torch.nn.Module) -> None:
        with torch.no_grad():
            m(input_ids=batch, use_cache=False)

    mtq.quantize(model, cfg, loop)
    export_hf_checkpoint(model, dtype=torch.bfloat16, export_dir=str(out))
    tokenizer.save_pretrained(out)


# ---------------------------------------------------------------------------------------------------------------
# Layouts as the published checkpoints store them (written with the safetensors library; the values are zeros,
# the names, dtypes and shapes are the published ones)

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
# small dimensions that keep each published layout's divisibility (MXFP4 blocks of 32, FP8 blocks of 128)
GPT_OSS_TINY = {"hidden_size": 128, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256, "num_local_experts": 4,
                "num_experts_per_tok": 2, "experts_per_token": 2,
                "layer_types": ["sliding_attention", "full_attention"]}
QWEN3_MOE_TINY = {"hidden_size": 256, "intermediate_size": 384, "moe_intermediate_size": 128, "num_experts": 4,
                  "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 64, "vocab_size": 320, "max_window_layers": 2}
# Qwen/Qwen3-30B-A3B-FP8 and deepseek-ai/DeepSeek-V3 (tests/data/configs/deepseek_v3): fp8, 128x128 blocks
FP8_BLOCK_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                    "weight_block_size": [128, 128]}


def _write(folder: Path, config: dict, shards: list[dict]) -> Path:
    """config.json plus the shards and their index, as transformers' save_pretrained names them."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    weight_map = {}
    for i, tensors in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def gpt_oss_mxfp4(folder: Path) -> Path:
    """gpt-oss as openai/gpt-oss-20b stores it: BF16 attention (q/k/v/o weights and biases, sinks), router and
    embeddings; each layer's experts as MXFP4 `*_blocks` (U8, two E2M1 per byte, [E, rows, cols/32, 16]) and
    `*_scales` (U8 E8M0, [E, rows, cols/32]) with BF16 biases (the shapes vLLM 0.32's gpt_oss.py views as
    (E, 2N, -1) and (E, -1, N/2))."""
    import torch

    cfg = {**json.loads((CONFIGS / "gpt_oss_20b" / "config.json").read_text()), **GPT_OSS_TINY}
    h, n, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    bf16, u8 = torch.bfloat16, torch.uint8
    shards = [{"model.embed_tokens.weight": torch.zeros(cfg["vocab_size"], h, dtype=bf16),
               "model.norm.weight": torch.zeros(h, dtype=bf16)},
              {"lm_head.weight": torch.zeros(cfg["vocab_size"], h, dtype=bf16)}]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        layer = {p + "input_layernorm.weight": torch.zeros(h, dtype=bf16),
                 p + "post_attention_layernorm.weight": torch.zeros(h, dtype=bf16),
                 p + "self_attn.sinks": torch.zeros(cfg["num_attention_heads"], dtype=bf16),
                 p + "mlp.router.weight": torch.zeros(e, h, dtype=bf16), p + "mlp.router.bias": torch.zeros(e, dtype=bf16),
                 p + "mlp.experts.gate_up_proj_blocks": torch.zeros(e, 2 * n, h // 32, 16, dtype=u8),
                 p + "mlp.experts.gate_up_proj_scales": torch.zeros(e, 2 * n, h // 32, dtype=u8),
                 p + "mlp.experts.gate_up_proj_bias": torch.zeros(e, 2 * n, dtype=bf16),
                 p + "mlp.experts.down_proj_blocks": torch.zeros(e, h, n // 32, 16, dtype=u8),
                 p + "mlp.experts.down_proj_scales": torch.zeros(e, h, n // 32, dtype=u8),
                 p + "mlp.experts.down_proj_bias": torch.zeros(e, h, dtype=bf16)}
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            layer[p + f"self_attn.{name}.weight"] = torch.zeros(rows, h, dtype=bf16)
            layer[p + f"self_attn.{name}.bias"] = torch.zeros(rows, dtype=bf16)
        layer[p + "self_attn.o_proj.weight"] = torch.zeros(h, q, dtype=bf16)
        layer[p + "self_attn.o_proj.bias"] = torch.zeros(h, dtype=bf16)
        shards[i % 2].update(layer)
    return _write(folder, cfg, shards)


def qwen3_moe_fp8_block(folder: Path) -> Path:
    """Qwen3-MoE as Qwen/Qwen3-30B-A3B-FP8 stores it (DeepSeek-V3's layout too): every linear weight F8_E4M3 with
    a float32 `weight_scale_inv` of [ceil(out/128), ceil(in/128)] (vLLM 0.32 fp8_utils.create_fp8_scale_parameter),
    BF16 router (`mlp.gate`), norms and embeddings."""
    import torch

    cfg = {**json.loads((CONFIGS / "qwen3_30b_a3b" / "config.json").read_text()), **QWEN3_MOE_TINY,
           "quantization_config": FP8_BLOCK_CONFIG}
    h, w, e = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    q, kv, d = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["head_dim"]
    bf16 = torch.bfloat16

    def fp8(prefix: str, rows: int, cols: int) -> dict:
        return {prefix + ".weight": torch.zeros(rows, cols, dtype=torch.float8_e4m3fn),
                prefix + ".weight_scale_inv": torch.zeros(-(-rows // 128), -(-cols // 128), dtype=torch.float32)}

    shards: list[dict] = [{"model.embed_tokens.weight": torch.zeros(cfg["vocab_size"], h, dtype=bf16),
                           "lm_head.weight": torch.zeros(cfg["vocab_size"], h, dtype=bf16),
                           "model.norm.weight": torch.zeros(h, dtype=bf16)}]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        layer = {p + "input_layernorm.weight": torch.zeros(h, dtype=bf16),
                 p + "post_attention_layernorm.weight": torch.zeros(h, dtype=bf16),
                 p + "self_attn.q_norm.weight": torch.zeros(d, dtype=bf16),
                 p + "self_attn.k_norm.weight": torch.zeros(d, dtype=bf16),
                 p + "mlp.gate.weight": torch.zeros(e, h, dtype=bf16),
                 **fp8(p + "self_attn.q_proj", q, h), **fp8(p + "self_attn.k_proj", kv, h),
                 **fp8(p + "self_attn.v_proj", kv, h), **fp8(p + "self_attn.o_proj", h, q)}
        for x in range(e):
            layer.update({**fp8(p + f"mlp.experts.{x}.gate_proj", w, h), **fp8(p + f"mlp.experts.{x}.up_proj", w, h),
                          **fp8(p + f"mlp.experts.{x}.down_proj", h, w)})
        shards.append(layer)
    return _write(folder, cfg, shards)


# ---------------------------------------------------------------------------------------------------------------
# compressed-tensors, written by the compressed-tensors library in vLLM's side venv (tests/support/ct_writer.py)

CT_WRITER = Path(__file__).with_name("ct_writer.py")


def compressed_tensors_checkpoint(preset: str, source: Path) -> Path | None:
    """compressed-tensors' own export of SmolLM2's first LAYERS layers in `preset` (FP8_DYNAMIC, W4A16) with an FP8
    per-tensor kv_cache_scheme; None when vLLM's side venv (which ships compressed-tensors) is not installed."""
    import subprocess

    from trtkv.backends import vllm_command

    python = vllm_command.vllm_python()
    if not python.is_file():
        return None
    site = sorted(python.parent.parent.glob("lib/python*/site-packages/compressed_tensors-*.dist-info"))
    if not site:
        return None
    mark = (source / "trtkv_converted.json").read_text()
    key = _key("compressed-tensors", preset, site[-1].name, CT_WRITER.read_text(), mark, str(INT4_GROUP))

    def build(out: Path) -> None:
        proc = subprocess.run([str(python), str(CT_WRITER), str(source), str(out), preset, str(LAYERS), str(INT4_GROUP)],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{CT_WRITER.name} {preset} failed:\n{proc.stderr[-3000:]}")

    return _cached(f"ct-{preset.lower()}", key, build)
