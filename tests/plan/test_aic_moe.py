"""aiconfigurator reached for mixture-of-experts models, one source per compared level, and `--estimate` for every
workload with at least one output token (issue 49, items 2-4). aiconfigurator itself is stood in for by a small
executable that answers from the request it reads (tests/plan/test_aic_answer.py's way), or, for the tool's own
argument mapping, by a stand-in `aiconfigurator` package on the tool's path; the live one runs in tests/e2e."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import speed_cases as sc
from trtkv.cli import main
from trtkv.core.errors import TrtkvError
from trtkv.kvcache.formats import KVFormat
from trtkv.plan import aic
from trtkv.plan.model import resolve_architecture

ROOT = Path(__file__).resolve().parents[2]
QWEN3_MOE = "tests/data/configs/qwen3_30b_a3b"


@pytest.mark.parametrize("tp, ep, dp, want", [
    (1, 1, 1, (1, 1, 1, 1)),
    (4, 1, 1, (4, 1, 4, 1)),  # the defaults: every expert split over the TP group
    (4, 4, 1, (4, 1, 1, 4)),
    (4, 2, 1, (4, 1, 2, 2)),
    (1, 8, 8, (1, 8, 1, 8)),  # attention DP 8, experts over all 8 GPUs
    (2, 8, 4, (2, 4, 1, 8)),
    (2, 4, 4, (2, 4, 2, 4)),
])
def test_moe_parallelism_is_aiconfigurators_width_rule(tp: int, ep: int, dp: int, want: tuple[int, ...]) -> None:
    got = aic.moe_parallelism(tp, ep, dp)
    assert (got["tp_size"], got["attention_dp_size"], got["moe_tp_size"], got["moe_ep_size"]) == want
    # aiconfigurator-core 0.12.0 sdk/config.py resolve_moe_parallelism: tp x attention_dp = moe_tp x moe_ep
    assert got["tp_size"] * got["attention_dp_size"] == got["moe_tp_size"] * got["moe_ep_size"]
    assert aic.moe_parallelism(tp) == aic.moe_parallelism(tp, 1, 1)


@pytest.mark.parametrize("args, said", [
    ((4, 3, 1), "ep = 3 does not divide tp x attention_dp = 4 x 1 = 4 GPUs"),
    ((2, 8, 1), "allowed ep: 1, 2."),
    ((0, 1, 1), "tp = 0"),
    ((2, 1, 0), "attention_dp = 0"),
])
def test_moe_parallelism_refuses_what_aiconfigurator_would(args: tuple[int, int, int], said: str) -> None:
    with pytest.raises(TrtkvError, match=re.escape(said)):
        aic.moe_parallelism(*args)


def test_a_moe_request_carries_the_recipes_parallelism_and_a_dense_one_none() -> None:
    """Before: a MoE model's request held tp only, and every case failed with aiconfigurator's `At least one of
    moe_tp_size or moe_ep_size must be set for MoE models.`"""
    recipe = sc.recipe_for(QWEN3_MOE, "H100-80GB", "vllm", "bf16", 2048, 256, [1, 16], 2064, tp=2)
    req = aic.request(recipe, resolve_architecture(recipe), ["fp8"], [1, 16], str(ROOT / QWEN3_MOE))
    assert (req["tp"], req["attention_dp"], req["moe_tp"], req["moe_ep"]) == (2, 1, 2, 1)
    dense = sc.recipe_for(sc.MODELS["llama3_1_8b"], "H100-80GB", "vllm", "bf16", 2048, 256, [1], 2064)
    assert not {"moe_tp", "moe_ep", "attention_dp"} & set(aic.request(dense, resolve_architecture(dense), ["fp8"], [1],
                                                                       "x"))


STAND_IN_API = '''
import json, os

class _Result:
    def __init__(self, raw):
        self.raw = raw

def cli_estimate(model_path, system_name, **kw):
    with open(os.environ["AIC_SEEN"], "a") as f:
        f.write(json.dumps(kw) + "\\n")
    if kw.get("moe_tp_size") is None and kw.get("moe_ep_size") is None:
        raise ValueError("At least one of moe_tp_size or moe_ep_size must be set for MoE models.")
    return _Result({"ttft": 10.0, "tpot": 2.0, "tokens/s/gpu": 100.0, "tokens/s/user": 50.0, "backend": "vllm",
                    "version": "0.24.0", "system": system_name, "memory": 1.0, "gemm": "bfloat16", "fmha": "bfloat16"})
'''


def _stand_in_aiconfigurator(folder: Path) -> Path:
    """An `aiconfigurator` package (and both distributions' metadata) whose cli_estimate records its arguments."""
    api = folder / "aiconfigurator" / "cli"
    api.mkdir(parents=True)
    (folder / "aiconfigurator" / "__init__.py").write_text("")
    (api / "__init__.py").write_text("")
    (api / "api.py").write_text(STAND_IN_API)
    for name in ("aiconfigurator", "aiconfigurator_core"):
        meta = folder / f"{name}-0.12.0.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0.12.0\n")
    return folder


@pytest.mark.parametrize("extra, batch", [({}, 16), ({"attention_dp": 4, "moe_tp": 1, "moe_ep": 8}, 4)])
def test_the_tool_passes_the_moe_parallelism_in_aiconfigurators_names(tmp_path: Path, extra: dict[str, int],
                                                                      batch: int) -> None:
    """tools/aic_estimate.py hands moe_tp/moe_ep/attention_dp to cli_estimate as moe_tp_size/moe_ep_size/
    attention_dp_size, and the batch per attention-DP rank (concurrency 16 over 4 ranks: 4 each)."""
    path, seen = _stand_in_aiconfigurator(tmp_path / "site"), tmp_path / "seen.jsonl"
    recipe = sc.recipe_for(QWEN3_MOE, "H100-80GB", "vllm", "bf16", 2048, 256, [16], 2064, tp=2)
    req = aic.request(recipe, resolve_architecture(recipe), ["bfloat16"], [16], str(ROOT / QWEN3_MOE)) | extra
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "aic_estimate.py")], input=json.dumps(req), text=True,
                          capture_output=True, timeout=60, check=True,
                          env={"PYTHONPATH": str(path), "AIC_SEEN": str(seen), "PATH": "/usr/bin:/bin"})
    answer = aic.parse_answer(done.stdout)
    assert not answer.errors and answer.rows[0].itl_ms == 2.0
    kw = json.loads(seen.read_text())
    want = {"tp_size": 2, "attention_dp_size": 1, "moe_tp_size": 2, "moe_ep_size": 1}
    want |= {f"{k}_size": v for k, v in extra.items()}
    assert {k: kw[k] for k in want} == want and kw["batch_size"] == batch


def _answering_from_request(folder: Path, fail: list[tuple[str, int]], record: Path | None = None) -> Path:
    """A stand-in for .venv-aic's python that answers every case of the request it reads (ITL 10 ms bf16, 20 ms fp8:
    far from trtkv's model, so a mixed level would show) except the (kv, concurrency) cases in `fail`."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "python"
    body = f'''
import json, sys
req = json.loads(sys.stdin.read())
{"open(" + repr(str(record)) + ", 'w').write(json.dumps(req))" if record else ""}
fail = {[list(x) for x in fail]!r}
rows, errors = [], []
for case in req["cases"]:
    if [case["kv"], case["concurrency"]] in fail:
        errors.append({{"kv": case["kv"], "concurrency": case["concurrency"], "error": "PerfDataNotAvailableError: no"}})
        continue
    itl = 20.0 if case["kv"] == "fp8" else 10.0
    rows.append({{"kv": case["kv"], "concurrency": case["concurrency"], "ttft_ms": 10 * itl, "itl_ms": itl,
                 "tokens_per_s_per_gpu": 1000 / itl, "tokens_per_s_per_user": 1000 / itl, "backend": "trtllm",
                 "backend_version": "1.3.0rc20", "system": req["system"]}})
sys.stdout.write(json.dumps({{"aiconfigurator": "0.12.0", "aiconfigurator_core": "0.12.0", "rows": rows,
                             "errors": errors}}))
'''
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    return script


def _levels(est: dict[str, Any]) -> dict[int, dict[str, dict[str, Any]]]:
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for fmt, entry in est["formats"].items():
        for level in entry["levels"]:
            out.setdefault(level["concurrency"], {})[fmt] = level
    return out


VERSIONED = re.compile(r"(trtllm|vllm|sglang) \d+\.\d+\.\d+\w* (data|kernel tables)")


def _check_one_source_and_advice(out: dict[str, Any], recipe_fmt: str) -> dict[int, dict[str, dict[str, Any]]]:
    """Every level's rows from one source that names its data's engine version, and every advice line comparing
    formats agreeing with the two rows it cites."""
    est = out["estimate"]
    levels = _levels(est)
    for c, rows in levels.items():
        assert len({r["source"] for r in rows.values()}) == 1, (c, rows)
        assert all(VERSIONED.search(r["source"]) for r in rows.values()), rows
    compared = [a for a in out["advice"] if " KV vs " in a and " at concurrency " in a]
    assert compared and compared == est["advice"], out["advice"]
    for line in compared:
        hit = re.match(rf"{recipe_fmt} KV vs (\w+) at concurrency (\d+) .*: ITL ([+-]\d+)%, TTFT ([+-]\d+)%", line)
        assert hit, line
        q, s = levels[int(hit[2])][recipe_fmt], levels[int(hit[2])][hit[1]]
        assert int(hit[3]) == round(100 * (q["itl_ms"] / s["itl_ms"] - 1)), (line, q, s)
        assert int(hit[4]) == round(100 * (q["ttft_ms"] / s["ttft_ms"] - 1)), (line, q, s)
        assert line.endswith(f"both rows {q['source']}.")
    return levels


def test_the_issues_table_compares_from_one_source_and_the_advice_agrees(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's example, `trtkv plan llama70b_fp8kv --estimate 'bench.concurrency=[1,32]'` with aiconfigurator
    failing one case (bf16 at 32). Before: fp8's whole row was aiconfigurator's (20 ms ITL here) beside bf16 and int8
    from trtkv's model, and the advice line came from another workload. Now every level is trtkv's model (aiconfigurator
    has no int8 KV data), aiconfigurator's figures beside them, the fallback said once with both reasons, and the
    advice reads the rows it cites."""
    monkeypatch.setattr(aic, "python_path", lambda: _answering_from_request(tmp_path, [("bfloat16", 32)]))
    assert main(["plan", "llama70b_fp8kv", "--estimate", "--json", "bench.concurrency=[1,32]"]) == 0
    out = json.loads(capsys.readouterr().out)
    levels = _check_one_source_and_advice(out, "fp8")
    assert all(r["source"].startswith("trtkv model") for rows in levels.values() for r in rows.values())
    assert levels[1]["fp8"]["aiconfigurator"]["itl_ms"] == 20.0 and levels[32]["bf16"]["aiconfigurator"] is None
    assert levels[1]["int8"]["aiconfigurator"] is None
    status = out["estimate"]["aiconfigurator"]
    assert status.count("trtkv model for every row at concurrency 1, 32") == 1, status
    assert "has no KV data for int8" in status and "bf16 case at concurrency 32 failed: PerfDataNotAvailableError" in status
    # the text: aiconfigurator's figures in their own columns, the comparison under the table
    assert main(["plan", "llama70b_fp8kv", "--estimate", "bench.concurrency=[1,32]"]) == 0
    text = capsys.readouterr().out
    assert "aic TTFT" in text and "Compared: fp8 KV vs bf16 at concurrency 32" in text


def test_aiconfigurator_is_the_source_of_a_level_it_answers_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """LLM API on H100 serves fp8 and bf16 KV, both in aiconfigurator's data: a level it answers for both is its own,
    a level where one case failed is trtkv's model for both formats, with the reason."""
    seen = tmp_path / "request.json"
    monkeypatch.setattr(aic, "python_path",
                        lambda: _answering_from_request(tmp_path / "tool", [("fp8", 32)], seen))
    assert main(["plan", "llama70b_fp8kv_llmapi", "--estimate", "--json", "bench.concurrency=[1,32]"]) == 0
    out = json.loads(capsys.readouterr().out)
    levels = _check_one_source_and_advice(out, "fp8")
    assert {r["source"] for r in levels[1].values()} == {"aiconfigurator 0.12.0 (trtllm 1.3.0rc20 data, h100_sxm)"}
    assert all(r["source"].startswith("trtkv model") for r in levels[32].values())
    assert levels[32]["bf16"]["aiconfigurator"]["itl_ms"] == 10.0
    status = out["estimate"]["aiconfigurator"]
    assert "aiconfigurator for every row at concurrency 1" in status and "fp8 case at concurrency 32 failed" in status
    assert "moe_tp" not in json.loads(seen.read_text())  # a dense model: no MoE parallelism sent


def test_fp8_against_nvfp4_is_trtkvs_model_on_both_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """On Blackwell the LLM API also serves NVFP4 KV, which aiconfigurator 0.12 has no data for: every row is trtkv's
    model, and the status says why."""
    monkeypatch.setattr(aic, "python_path", lambda: _answering_from_request(tmp_path, []))
    assert main(["plan", "llama70b_fp8kv_llmapi", "--estimate", "--json", "hardware.gpu=B200",
                 "bench.concurrency=[1,8]"]) == 0
    out = json.loads(capsys.readouterr().out)
    levels = _check_one_source_and_advice(out, "fp8")
    assert all(r["source"].startswith("trtkv model") for rows in levels.values() for r in rows.values())
    assert set(levels[8]) == {"fp8", "bf16", "nvfp4"}
    assert "has no KV data for nvfp4 (it has bfloat16 and fp8)" in out["estimate"]["aiconfigurator"]


@pytest.mark.parametrize("recipe", ["llama70b_fp8kv", "llama70b_fp8kv_sglang"])
def test_one_output_token_is_answered(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `trtkv plan --estimate bench.output_tokens=1` ended in a ZeroDivisionError (the advice divided by an
    ITL of 0). Now TTFT answers, ITL is shown as none, and the advice says there is none."""
    assert main(["plan", recipe, "--estimate", "--no-aiconfigurator", "bench.output_tokens=1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = [lv for f in out["estimate"]["formats"].values() for lv in f["levels"]]
    assert rows and all(r["ttft_ms"] > 0 and r["itl_ms"] == 0 for r in rows)
    assert any("no ITL (one token)" in a for a in out["advice"])
    assert main(["plan", recipe, "--estimate", "--no-aiconfigurator", "bench.output_tokens=1", "--full"]) == 0
    assert "one output token: no inter-token latency" in capsys.readouterr().out
    assert main(["plan", recipe, "bench.output_tokens=1"]) == 0


def test_every_workload_with_an_output_token_is_answered() -> None:
    """Short and long prompts, one and many output tokens, a budget below the prompt (chunked), every level finite."""
    from trtkv.plan.estimate import estimate
    from trtkv.plan.planner import plan

    for isl, osl, budget in ((1, 1, 8192), (1, 2, 8192), (2048, 1, 512), (16384, 3, 8192), (100, 4096, 64)):
        recipe = sc.recipe_for(sc.MODELS["llama3_1_8b"], "H100-80GB", "vllm", "bf16", isl, osl, [1, 64], budget)
        est = estimate(recipe, plan(recipe), use_aiconfigurator=False)
        assert est.rows and all(r.ttft_ms > 0 and r.itl_ms >= 0 and r.output_tokens_per_s > 0 for r in est.rows)
        assert all((r.itl_ms > 0) == (osl > 1) for r in est.rows), (isl, osl)


def test_row_at_and_failure_at_read_the_tools_answer() -> None:
    answer = aic.parse_answer(json.dumps({
        "aiconfigurator": "0.12.0", "rows": [{"kv": "fp8", "concurrency": 4, "ttft_ms": 1.0, "itl_ms": 1.0,
                                             "tokens_per_s_per_gpu": 1.0, "tokens_per_s_per_user": 1.0,
                                             "backend": "vllm", "backend_version": "0.24.0", "system": "h100_sxm"}],
        "errors": [{"kv": "bfloat16", "concurrency": 4, "error": "OOM"}]}))
    assert answer.row_at(KVFormat.FP8, 4) is not None and answer.row_at(KVFormat.FP8, 8) is None
    assert answer.row_at(KVFormat.INT8, 4) is None and answer.row_at(KVFormat.BF16, 4) is None
    assert answer.failure_at(KVFormat.BF16, 4) == "OOM" and answer.failure_at(KVFormat.FP8, 4) is None
