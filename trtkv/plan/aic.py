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
from trtkv.plan.moe_step import MXFP4_TABLE, MXFP8_TABLE, expert_bytes
from trtkv.plan.speed import AIC_SYSTEM
from trtkv.recipe import WeightQuant, resolved_moe_activations
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
    """A case aiconfigurator could not estimate (its KV and concurrency, where the tool names
    them)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")
    error: str = ""
    kv: str | None = Field(None, max_length=99)
    concurrency: int | None = Field(None, gt=0, le=1 << 20)


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
    # (kv, concurrency, error) of each failed case, where the tool named them
    failures: tuple[tuple[str | None, int | None, str], ...] = ()

    def source(self, r: AicRow) -> str:
        return f"aiconfigurator {self.version} ({r.backend} {r.backend_version} data, {r.system})"

    def row_at(self, fmt: KVFormat, concurrency: int) -> AicRow | None:
        """Its row for this format at this level; None where it has no data for the format or the
        case failed."""
        kv = AIC_KV.get(fmt)
        return next((r for r in self.rows if r.kv == kv and r.concurrency == concurrency), None)

    def failure_at(self, fmt: KVFormat, concurrency: int) -> str | None:
        """Why the case of this format at this level failed, where the tool said."""
        kv = AIC_KV.get(fmt)
        return next((e for k, c, e in self.failures if k == kv and c == concurrency), None)


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
        tuple(said_error(e.error) for e in checked.errors),
        tuple((e.kv, e.concurrency, said_error(e.error)) for e in checked.errors),
    )


ERROR_CHARS = 300  # of one aiconfigurator failure, as the estimate prints it


def said_error(text: str) -> str:
    """One aiconfigurator failure as the estimate prints it: its data paths from the package on
    (`aiconfigurator_core/systems/data/...`, not the venv this machine put it in), on one line,
    cut at a word within ERROR_CHARS with `...` where it was cut."""
    line = " ".join(
        w[w.index("site-packages/") + len("site-packages/") :] if "site-packages/" in w else w
        for w in text.split()
    )
    if len(line) <= ERROR_CHARS:
        return line
    cut = line[: ERROR_CHARS - 4]
    return (cut[: cut.rfind(" ")] if " " in cut else cut) + " ..."


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


def moe_parallelism(tp: int, ep: int = 1, attention_dp: int = 1) -> dict[str, int]:
    """A MoE deployment's parallelism in aiconfigurator's terms (aiconfigurator-core 0.12.0
    sdk/config.py ModelConfig.resolve_moe_parallelism: tp_size x attention_dp_size = moe_tp_size x
    moe_ep_size, the GPUs of one pipeline stage). `tp`: the attention's tensor-parallel size within
    one attention-data-parallel rank; `attention_dp`: the attention's data-parallel ranks (each
    with its own sequences); `ep`: the ranks the routed experts are spread over, each expert split
    over the rest by tensor parallelism. The defaults (no EP, no attention DP) shard every expert
    over the TP group: moe_tp_size = tp, moe_ep_size 1."""
    for name, value in (("tp", tp), ("ep", ep), ("attention_dp", attention_dp)):
        if value < 1:
            raise TrtkvError(f"MoE parallelism: {name} = {value}; it must be >= 1.")
    width = tp * attention_dp
    if width % ep:
        allowed = ", ".join(str(d) for d in range(1, width + 1) if width % d == 0)
        raise TrtkvError(
            f"MoE parallelism: ep = {ep} does not divide tp x attention_dp = {tp} x "
            f"{attention_dp} = {width} GPUs (aiconfigurator's moe_tp_size x moe_ep_size must equal "
            f"them); allowed ep: {allowed}. Next: set ep to one of those."
        )
    return {
        "tp_size": tp,
        "attention_dp_size": attention_dp,
        "moe_tp_size": width // ep,
        "moe_ep_size": ep,
    }


def request(
    recipe: Recipe,
    arch: Architecture,
    kvs: Sequence[str],
    concurrency: Sequence[int],
    model_path: str,
) -> dict[str, Any]:
    b = recipe.bench
    # a MoE model: aiconfigurator refuses it without its expert parallelism (moe_parallelism), the
    # recipe's (Recipe.parallelism: aiconfigurator's tp is one attention-DP group's)
    par = recipe.parallelism
    moe = (
        moe_parallelism(par.attention_tp, par.ep, par.attention_dp) if arch.moe is not None else {}
    )
    return {
        "model_path": model_path,
        "system": AIC_SYSTEM[recipe.hardware.gpu],
        "backend": SPEED_ENGINE[recipe.build.backend],
        "backend_version": None,
        "tp": par.attention_tp,
        "pp": recipe.build.pp_size,
        "isl": b.input_tokens,
        "osl": b.output_tokens,
        "gemm_quant_mode": GEMM_MODE.get(
            recipe.quantization.weights, "bfloat16" if not arch.stored_weights_bytes else None
        ),
        "max_seq_len": max(recipe.build.max_seq_len, b.input_tokens + b.output_tokens),
        "cases": [{"kv": kv, "concurrency": c} for kv in kvs for c in concurrency],
        # tools/aic_estimate.py's names: tp above, the rest without "_size"
        **{k.removesuffix("_size"): v for k, v in moe.items() if k != "tp_size"},
        **moe_quant_mode(recipe, arch),
    }


def moe_quant_mode(recipe: Recipe, arch: Architecture) -> dict[str, str]:
    """MXFP4 experts the engine runs with MXFP8 activations: aiconfigurator's rows for those (it
    infers its BF16-activation rows from the checkpoint's mxfp4, bar TensorRT-LLM on Blackwell)."""
    if arch.moe is None or not arch.expert_parameters:
        return {}
    mxfp4 = expert_bytes(arch, recipe, 2.0)[3] == MXFP4_TABLE
    if mxfp4 and resolved_moe_activations(recipe) == "mxfp8":
        return {"moe_quant_mode": MXFP8_TABLE}
    return {}


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
    # which case failed, and why, is said once where its level falls back (estimate.one_source_rows)
    return answer, said + (f"; {len(answer.errors)} case(s) failed" if answer.errors else "")
