"""The one adapter to NVIDIA aiconfigurator: builds a request, runs tools/aic_estimate.py with
.venv-aic's python (a subprocess: aiconfigurator needs numpy >= 2.1, trtkv's venv cannot hold it)
and reads its JSON answer, bounded in bytes and time and checked field by field. `make
install-aiconfigurator` makes .venv-aic (aiconfigurator 0.12.0 and aiconfigurator-core 0.12.0,
pinned); without it the estimate says so and uses trtkv's own model.

aiconfigurator 0.12.0 has measured data for h100_sxm, h200_sxm, b200_sxm, b300_sxm, gb200, gb300,
a100_sxm, l40s and rtx_pro_6000_server (trtkv.plan.speed.AIC_SYSTEM maps trtkv's GPUs onto them;
gb300 has no trtkv GPU); backends TensorRT-LLM 1.3.0rc20, vLLM 0.24.0, SGLang 0.5.14; KV bfloat16
and fp8 only. For any other GPU it is not asked: the estimate says so, names the GPUs it covers, and
trtkv's model answers.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtkv.core.errors import TrtkvError
from trtkv.core.files import strict_json
from trtkv.core.readback import ReadBackError, tool_answer
from trtkv.kvcache.formats import KVFormat
from trtkv.plan import aic_where
from trtkv.plan.speed import AIC_SYSTEM
from trtkv.recipe import WeightQuant
from trtkv.recipe.backend_rules import SPEED_ENGINE

if TYPE_CHECKING:
    from trtkv.plan.model import Architecture
    from trtkv.recipe import Recipe

AIC_VENV = aic_where.AIC_VENV
AIC_VERSION = "0.12.0"
MAX_ANSWER_BYTES = 1 << 20
TIMEOUT_S = 600.0
# KV formats aiconfigurator has kernel data for, by its name
AIC_KV = {
    KVFormat.BF16: "bfloat16",
    KVFormat.FP16: "bfloat16",
    KVFormat.FP8: "fp8",
    KVFormat.FP8_SCALE1: "fp8",
}
GEMM_MODE = {WeightQuant.FP8: "fp8", WeightQuant.INT8_SQ: "sq", WeightQuant.INT4_AWQ: "int4_wo"}
# a row's figures: finite and at most these (a week in ms, a billion tokens per second)
MAX_MS = 7 * 24 * 3600 * 1000.0
MAX_TOKENS_PER_S = 1e9
_MS = Field(ge=0, le=MAX_MS, allow_inf_nan=False)
_RATE = Field(ge=0, le=MAX_TOKENS_PER_S, allow_inf_nan=False)
_NAME = Field(max_length=99)


class AicRow(BaseModel):
    """One estimate in tools/aic_estimate.py's answer (its other fields are not read)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")
    kv: str = _NAME
    concurrency: int = Field(gt=0, le=1 << 20)
    ttft_ms: float = _MS
    itl_ms: float = _MS
    tokens_per_s_per_gpu: float = _RATE
    tokens_per_s_per_user: float = _RATE
    backend: str = _NAME
    backend_version: str = _NAME
    system: str = _NAME


class AicFailure(BaseModel):
    """A case aiconfigurator could not estimate."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")
    error: str = ""


class AicDoc(BaseModel):
    """tools/aic_estimate.py's answer to one request, typed: anything else is refused."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")
    aiconfigurator: str = Field("?", max_length=40)
    aiconfigurator_core: str = Field("?", max_length=40)
    rows: list[AicRow] = Field(max_length=1 << 16)
    errors: list[AicFailure] = Field([], max_length=1 << 16)


@dataclass(frozen=True)
class AicAnswer:
    version: str
    core_version: str
    rows: tuple[AicRow, ...]
    errors: tuple[str, ...]

    def source(self, r: AicRow) -> str:
        return f"aiconfigurator {self.version} ({r.backend} {r.backend_version} data, {r.system})"


def covered_gpus() -> str:
    """`A100-80GB (a100_sxm), H100-80GB (h100_sxm), ...`: the GPUs aiconfigurator has measured data
    for."""
    return "it has data for " + ", ".join(
        f"{g.value} ({system})" for g, system in AIC_SYSTEM.items()
    )


def python_path() -> Path:
    """aiconfigurator's python: `$TRTKV_AICONFIGURATOR`, else the first `.venv-aic` found under
    `$TRTKV_HOME` or beside the installed trtkv (trtkv.plan.aic_where)."""
    return aic_where.python_path()


def parse_answer(text: str | bytes, where: str = "tools/aic_estimate.py") -> AicAnswer:
    """The tool's JSON (strict: no NaN or Infinity), every field checked by AicDoc; anything else
    is one TrtkvError line naming the field."""
    return answer_of(_strict(text, where, MAX_ANSWER_BYTES), where)


def answer_of(doc: Any, where: str) -> AicAnswer:
    """A parsed answer checked by AicDoc: one TrtkvError line naming the first wrong field."""
    if not isinstance(doc, dict) or "rows" not in doc:
        raise TrtkvError(f"{where}: expected an object with `rows`; got {str(doc)[:200]!r}")
    try:
        checked = AicDoc.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        value = repr(err.get("input"))[:80]
        raise TrtkvError(
            f"{where}: {field.lstrip('.')} = {value} is not valid: {err['msg']}"
        ) from None
    return AicAnswer(
        checked.aiconfigurator,
        checked.aiconfigurator_core,
        tuple(checked.rows),
        tuple(e.error[:300] for e in checked.errors),
    )


def _strict(text: str | bytes, where: str, limit: int) -> Any:
    if len(text) > limit:
        raise TrtkvError(f"{where}: answer larger than {limit} bytes.")
    try:
        return strict_json(text)
    except ValueError as exc:
        first = text[:200]
        raise TrtkvError(f"{where}: not JSON ({str(exc)[:200]}); first bytes: {first!r}") from None


def _synthetic_config(arch: Architecture, folder: Path) -> Path:
    """A Llama-style config.json from the architecture (a recipe without a local config), for
    aiconfigurator."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "vocab_size": arch.vocab_size,
        "max_position_embeddings": arch.max_position_embeddings or 131072,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "rope_theta": 500000.0,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def request(
    recipe: Recipe,
    arch: Architecture,
    kvs: Sequence[str],
    concurrency: Sequence[int],
    model_path: str,
) -> dict[str, Any]:
    b = recipe.bench
    return {
        "model_path": model_path,
        "system": AIC_SYSTEM[recipe.hardware.gpu],
        "backend": SPEED_ENGINE[recipe.build.backend],
        "backend_version": None,
        "tp": recipe.build.tp_size,
        "pp": recipe.build.pp_size,
        "isl": b.input_tokens,
        "osl": b.output_tokens,
        "gemm_quant_mode": GEMM_MODE.get(
            recipe.quantization.weights, "bfloat16" if not arch.stored_weights_bytes else None
        ),
        "max_seq_len": max(recipe.build.max_seq_len, b.input_tokens + b.output_tokens),
        "cases": [{"kv": kv, "concurrency": c} for kv in kvs for c in concurrency],
    }


def run(req: dict[str, Any], python: Path | None = None, timeout: float = TIMEOUT_S) -> AicAnswer:
    """One subprocess: the request on stdin, the answer on stdout (bounded), aiconfigurator's
    chatter on stderr."""
    return parse_answer(_invoke(req, python or python_path(), timeout))


def run_many(
    req: dict[str, Any], python: Path | None = None, timeout: float = TIMEOUT_S
) -> list[AicAnswer]:
    """Several requests ({"requests": [...]}) in one process: one answer each, in order."""
    limit = 64 * MAX_ANSWER_BYTES
    doc = _strict(
        _invoke(req, python or python_path(), timeout, limit), aic_where.TOOL_NAME.name, limit
    )
    answers = doc.get("answers") if isinstance(doc, dict) else None
    if not isinstance(answers, list):
        raise TrtkvError(
            f"tools/aic_estimate.py: expected {{'answers': [...]}}; got {str(doc)[:200]!r}"
        )
    return [answer_of(a, f"tools/aic_estimate.py answers[{i}]") for i, a in enumerate(answers)]


def _invoke(
    req: dict[str, Any], python: Path, timeout: float, limit: int = MAX_ANSWER_BYTES
) -> bytes:
    """The tool's stdout, read while it runs: at most `limit` + 1 bytes and `timeout` seconds, the
    tool killed past either (trtkv.core.readback.tool_answer)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONNOUSERSITE": "1"}
    tool = aic_where.tool_path()
    try:
        code, out, err = tool_answer(
            [str(python), str(tool)], json.dumps(req).encode(), limit, timeout, env
        )
    except ReadBackError as exc:
        raise TrtkvError(f"aiconfigurator ({python} {tool}): {exc.problem}.") from None
    if code != 0:
        raise TrtkvError(f"aiconfigurator ({python} {tool}) exited {code}: {err}")
    return out


def run_for(
    recipe: Recipe,
    arch: Architecture,
    formats: Sequence[tuple[str, KVFormat]],
    concurrency: Sequence[int],
) -> tuple[AicAnswer | None, str]:
    """aiconfigurator's answer for the formats it covers, and a line saying what was used (or why
    not)."""
    from trtkv.engines.sizing import model_config_path

    kvs = sorted({AIC_KV[f] for label, f in formats if f in AIC_KV and label == f.value})
    if recipe.hardware.gpu not in AIC_SYSTEM:
        return None, (
            f"aiconfigurator {AIC_VERSION} has no data for {recipe.hardware.gpu.value} "
            f"({covered_gpus()}): trtkv model for every row"
        )
    if not kvs:
        return None, "no format aiconfigurator covers (it has bfloat16 and fp8 KV): trtkv model"
    python = python_path()
    tool = aic_where.tool_path()
    if not tool.is_file():
        return None, (
            f"{tool} not found (it ships with a trtkv checkout; trtkv looked in "
            f"{', '.join(str(f) for f in aic_where.folders())}): trtkv model for every row"
        )
    if not python.is_file():
        return None, (
            f"aiconfigurator not installed ({aic_where.install_hint(AIC_VERSION)}): trtkv model "
            "for every row"
        )
    cfg = model_config_path(recipe)
    with tempfile.TemporaryDirectory(prefix="trtkv-aic-") as tmp:
        model_path = str(cfg.parent) if cfg else str(_synthetic_config(arch, Path(tmp)))
        try:
            answer = run(request(recipe, arch, kvs, concurrency, model_path))
        except TrtkvError as exc:
            return None, f"aiconfigurator failed ({exc}): trtkv model"
    if not answer.rows:
        first = answer.errors[0] if answer.errors else "no rows"
        return None, f"aiconfigurator {answer.version} gave no estimate ({first}): trtkv model"
    said = f"aiconfigurator {answer.version} (core {answer.core_version}) for {', '.join(kvs)} KV"
    return answer, said + (
        f"; {len(answer.errors)} case(s) failed: {answer.errors[0]}" if answer.errors else ""
    )


def rows_for(answer: AicAnswer, fmt: KVFormat, concurrency: Sequence[int]) -> list[AicRow] | None:
    """The answer's rows for this format at every level, or None when any is missing (then trtkv's
    model answers)."""
    kv = AIC_KV.get(fmt)
    by = {r.concurrency: r for r in answer.rows if r.kv == kv}
    got = [by.get(c) for c in concurrency]
    return None if kv is None or any(r is None for r in got) else [r for r in got if r is not None]
