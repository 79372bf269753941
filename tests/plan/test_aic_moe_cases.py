"""trtkv's speed model against aiconfigurator's recorded mixture-of-experts estimates (tests/data/aiconfigurator/
moe_cases.json, `scripts/record_aiconfigurator.py --moe`): gpt-oss-20b, gpt-oss-120b and Qwen3-30B-A3B, none used to
fit the model, each within the issue's bounds (#49: ITL 25%, TTFT 30%)."""

from __future__ import annotations

import statistics

import pytest

from tests.support import aic_moe_cases as mc
from trtkv.plan import aic


def test_the_recorded_moe_cases_are_aiconfigurators_answers_with_their_parallelism() -> None:
    doc = mc.moe_cases()
    assert doc["aiconfigurator"] == aic.AIC_VERSION and doc["cases"]
    models = {c["id"].split("/")[0] for c in doc["cases"]}
    assert {"gpt_oss_20b", "gpt_oss_120b", "qwen3_30b_a3b"} <= models, models
    for case in doc["cases"]:
        assert case["used_to_fit"] is False, case["id"]
        req = case["request"]
        assert req["tp"] * req["attention_dp"] == req["moe_tp"] * req["moe_ep"], case["id"]
        assert aic.moe_parallelism(case["tp"]) == {"tp_size": req["tp"], "attention_dp_size": req["attention_dp"],
                                                   "moe_tp_size": req["moe_tp"], "moe_ep_size": req["moe_ep"]}
    assert not any("moe_tp_size or moe_ep_size" in e["error"] for e in doc["errors"])


@pytest.mark.parametrize("metric, bound", [("itl_ms", mc.ITL_BOUND), ("ttft_ms", mc.TTFT_BOUND)])
def test_own_model_within_the_issues_bounds_on_moe(metric: str, bound: float,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rows = [c for c in mc.moe_comparisons(metric)]
    with capsys.disabled():
        print(f"\n{'MoE case':<56} {'aiconfigurator ' + metric:>22} {'trtkv':>10} {'error':>8}")
        for c in rows:
            print(f"{c.case:<56} {c.reference_ms:>22.2f} {c.trtkv_ms:>10.2f} {c.error:>+8.1%}")
        print(f"{metric}: median abs error {statistics.median(abs(c.error) for c in rows):.1%}, worst "
              f"{max(rows, key=lambda c: abs(c.error)).error:+.1%} over {len(rows)} cases")
    worst = max(rows, key=lambda c: abs(c.error))
    assert abs(worst.error) <= bound, worst
