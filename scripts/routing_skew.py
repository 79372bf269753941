"""How skewed MoE routing is, measured, and what a skew would do to trtkv's step model (issue #49; evidence, not held:
trtkv prices uniform routing, trtkv.plan.moe_step.ROUTING).

--fingerprints DIR reads the per-layer expert frequencies of gpt-oss-20b's decode tokens that
AmanPriyanshu/GPT-OSS-MoE-ExpertFingerprinting publishes (its data/ folder at 72b368f60045: 24 layers x 32 experts, each
file a benchmark category's mean `count_frequency`, the share of tokens that picked the expert, weighted here by
sample_count x num_think_tokens) and prints the distinct experts N independent tokens read, sum_e 1 - (1 - q_e)^N,
against uniform routing's E (1 - (1 - k/E)^N) and against a log-normal expert popularity of spread sigma (the sigma
closest to the measured ratios is printed).

Without it: trtkv's step model under a log-normal popularity of --sigma (each step's tokens routed by seeded draws:
popularity per layer, then each token's top-k by Gumbel top-k, the busiest EP rank's distinct experts and pairs) beside
uniform routing, on the published measurements (tests/plan/test_published_speed.py), aiconfigurator's silicon slices
(tests/plan/test_silicon_samples.py) and its recorded MoE answers (tests/plan/test_aic_moe_cases.py).
Usage: .venv/bin/python scripts/routing_skew.py [--sigma 0.9] [--fingerprints DIR]"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtkv.plan import moe_step  # noqa: E402

DRAWS = 64  # popularity draws per step shape (seeded)
LEVELS = (4, 8, 16, 32, 64, 128)


def uniform(experts: int, top_k: int, tokens: int) -> float:
    return experts * (1 - (1 - top_k / experts) ** tokens)


def lognormal_distinct(experts: int, top_k: int, tokens: int, sigma: float) -> float:
    """Expected distinct experts of N independent tokens under a log-normal popularity (seeded draws)."""
    rng = np.random.default_rng(0)
    out = 0.0
    for _ in range(DRAWS):
        w = np.exp(sigma * rng.standard_normal(experts))
        q = np.minimum(1.0, top_k * w / w.sum())
        out += float((1 - (1 - q) ** tokens).sum())
    return out / DRAWS


def fingerprints(folder: Path) -> int:
    experts, top_k, layers = 32, 4, 24
    total = np.zeros((layers, experts))
    weight = 0.0
    files = [p for p in folder.rglob("*.json") if not p.name.endswith(("_examples.json", "map.json"))]
    for path in files:
        doc = json.loads(path.read_text())
        w = doc.get("sample_count", 0) * doc.get("num_think_tokens", 0)
        if "think_expert_analytics" not in doc or w <= 0:
            continue
        weight += w
        for layer in range(layers):
            for e, v in doc["think_expert_analytics"].get(f"layer_{layer}", {}).items():
                total[layer, int(e)] += w * v["count_frequency"]
    if not weight:
        raise SystemExit(f"{folder}: no think_expert_analytics files (the repository's data/ folder?)")
    q = total / weight
    measured = {n: float(np.mean([(1 - (1 - np.minimum(q[i], 1)) ** n).sum() for i in range(layers)])) for n in LEVELS}
    ratio = {n: measured[n] / uniform(experts, top_k, n) for n in LEVELS}
    mean = q.sum(axis=1) / experts
    print(f"{len(files)} files, {weight:,.0f} decode tokens weighted; per-layer busiest expert / mean: median "
          f"{statistics.median(q.max(axis=1) / mean):.2f}, range {min(q.max(axis=1) / mean):.2f}-"
          f"{max(q.max(axis=1) / mean):.2f}")
    print("N tokens      " + "".join(f"{n:>8}" for n in LEVELS))
    print("measured      " + "".join(f"{measured[n]:8.2f}" for n in LEVELS))
    print("uniform       " + "".join(f"{uniform(experts, top_k, n):8.2f}" for n in LEVELS))
    print("ratio         " + "".join(f"{ratio[n]:8.2f}" for n in LEVELS))
    fits = {}
    for sigma in np.arange(0.5, 1.31, 0.05):
        model = {n: lognormal_distinct(experts, top_k, n, float(sigma)) / uniform(experts, top_k, n) for n in LEVELS}
        fits[round(float(sigma), 2)] = sum((model[n] - ratio[n]) ** 2 for n in LEVELS)
    best = min(fits, key=lambda s: fits[s])
    print(f"log-normal popularity closest to the measured ratios: sigma {best:.2f}")
    return 0


@functools.lru_cache(maxsize=8192)
def skewed_load(experts: int, top_k: int, tokens: int, ep: int, sigma: float) -> tuple[float, float]:
    """(distinct experts, token-expert pairs) of the busiest of `ep` ranks, log-normal popularity, seeded draws."""
    rng = np.random.default_rng(0)
    group = experts // ep
    seen = pairs = 0.0
    for _ in range(DRAWS):
        logw = sigma * rng.standard_normal(experts)
        if tokens <= 1024:
            pick = np.argpartition(-(rng.gumbel(size=(tokens, experts)) + logw), top_k - 1, axis=1)[:, :top_k]
            per = np.bincount(pick.ravel(), minlength=experts).reshape(ep, group)
            r = int(np.argmax(per.sum(axis=1)))
            seen += float((per[r] > 0).sum())
            pairs += float(per[r].sum())
        else:  # a prefill chunk: the expectation (every rank reads nearly all its experts)
            w = np.exp(logw)
            q = np.minimum(1.0, top_k * w / w.sum()).reshape(ep, group)
            r = int(np.argmax(q.sum(axis=1)))
            seen += float((1 - (1 - q[r]) ** tokens).sum())
            pairs += tokens * float(q[r].sum())
    return seen / DRAWS, pairs / DRAWS


def figures() -> dict[str, list[float]]:
    from tests.support import aic_moe_cases as mc
    from tests.support import silicon
    from tests.support import speed_cases as sc

    out: dict[str, list[float]] = {}
    for r in sc.step_model_comparisons():
        if r["figure"] != "ttft_p50_ms":
            out[f"published {r['measurement']} {r['figure']}"] = [r["error"]]
    rows = silicon.read(silicon.SUBSET)
    for s in silicon.SLICES:
        out[f"silicon {s.model} {s.system} {s.backend} {s.isl}/{s.osl}"] = [
            float(c["error"]) for c in silicon.comparisons(rows, s)]
    mc._own_rows.cache_clear()  # trtkv's rows under the routing in force now, not a cached earlier one
    out["aiconfigurator MoE ITL"] = [c.error for c in mc.moe_comparisons("itl_ms")]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sigma", type=float, default=0.9, help="log-normal spread of expert popularity")
    ap.add_argument("--fingerprints", type=Path, help="GPT-OSS-MoE-ExpertFingerprinting's data/ folder")
    args = ap.parse_args()
    if args.fingerprints:
        return fingerprints(args.fingerprints)
    base = figures()
    real = moe_step.rank_load

    def skewed(experts: int, top_k: int, tokens: int, ep: int = 1, routing: str = moe_step.ROUTING):
        if tokens > 0 and routing == moe_step.ROUTING:
            return skewed_load(experts, top_k, int(tokens), ep, args.sigma)
        return real(experts, top_k, tokens, ep, routing)

    moe_step.rank_load = skewed  # what tests/plan/test_published_speed.py's routing test swaps, the same way
    try:
        other = figures()
    finally:
        moe_step.rank_load = real
    print(f"{'figures (decode ITL/TPOT errors)':<56} {'within 25%: uniform':>20} {'sigma ' + str(args.sigma):>10}  "
          f"median error: uniform, sigma {args.sigma}")
    for key, errs in base.items():
        alt = other[key]
        inside = sum(abs(e) <= 0.25 for e in errs), sum(abs(e) <= 0.25 for e in alt)
        print(f"{key:<56} {inside[0]:>14} of {len(errs):<3} {inside[1]:>6} of {len(alt):<3}  "
              f"{statistics.median(errs):+7.1%} {statistics.median(alt):+7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
