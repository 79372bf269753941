"""scripts/routing_skew.py (issue #49's routing evidence, docs/plan.md): its seeded token-routing draws, with no skew,
are uniform routing as trtkv prices it (trtkv.plan.moe_step.rank_load), so the figures it prints under a skew differ
from trtkv's by the skew alone; and a skew reads fewer distinct experts than uniform at a mid-size step, none fewer at
one token."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from trtkv.plan import moe_step

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("routing_skew", ROOT / "scripts" / "routing_skew.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("experts,top_k,tokens,ep", [(128, 4, 16, 1), (128, 4, 64, 2), (256, 8, 8, 8), (32, 4, 4, 1)])
def test_no_skew_is_uniform_routing(script, experts: int, top_k: int, tokens: int, ep: int) -> None:
    seen, _ = script.skewed_load(experts, top_k, tokens, ep, 0.0)
    uniform, _ = moe_step.rank_load(experts, top_k, tokens, ep)
    # 64 seeded draws of the busiest rank: within 6% of the closed form
    assert seen == pytest.approx(uniform, rel=0.06)


def test_skew_reads_fewer_experts_at_a_mid_size_step(script) -> None:
    assert script.lognormal_distinct(128, 4, 32, 0.9) < 0.9 * script.uniform(128, 4, 32)
    assert script.lognormal_distinct(128, 4, 1, 0.9) == pytest.approx(4.0, rel=0.02)
