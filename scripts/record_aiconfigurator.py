"""Record aiconfigurator's estimates for the cases of tests/support/speed_cases.py into
tests/data/aiconfigurator/cases.json (what `make check` compares trtkv's own model with, no side venv needed).

Needs .venv-aic (`make install-aiconfigurator`); one aiconfigurator process for every case (~3-4 min on 2 cores).
`--moe`: the mixture-of-experts cases of tests/support/aic_moe_cases.py instead (MOE_CASE_SETS, and the expert- and
attention-data-parallel MOE_LAYOUT_SETS), into tests/data/aiconfigurator/moe_cases.json, each sent with its MoE
parallelism (trtkv.plan.aic.moe_parallelism) and
marked "used_to_fit": false (trtkv's model reads kernel rows only, tools/aic_kernels.py).
Usage: .venv/bin/python scripts/record_aiconfigurator.py [--moe]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import aic_moe_cases as mc  # noqa: E402
from tests.support import speed_cases as sc  # noqa: E402
from trtkv.plan import aic  # noqa: E402
from trtkv.plan.model import resolve_architecture  # noqa: E402


def main() -> int:
    if "--moe" in sys.argv[1:]:
        return record_moe()
    requests, keys = [], []
    for model, config, tp, weights, backends in sc.CASE_SETS:
        for gpu in sc.GPUS:
            for backend in backends:
                for isl, osl in sc.WORKLOADS:
                    recipe = sc.recipe_for(config, gpu, backend, "bf16", isl, osl, list(sc.CONCURRENCY), isl + 16,
                                           weights=weights, tp=tp)
                    req = aic.request(recipe, resolve_architecture(recipe), ["bfloat16", "fp8"], sc.CONCURRENCY,
                                      str(sc.ROOT / config))
                    requests.append(req)
                    keys.append((model, config, gpu, backend, isl, osl, req, tp, weights))
    answers = aic.run_many({"requests": requests}, timeout=3600)
    cases = []
    for (model, config, gpu, backend, isl, osl, req, tp, weights), answer in zip(keys, answers, strict=True):
        for row in answer.rows:
            cases.append({"id": f"{model}/tp{tp}/{gpu}/{backend}/{isl}x{osl}/{row.kv}/c{row.concurrency}",
                          "model_config": config, "gpu": gpu, "backend": backend, "kv": row.kv, "isl": isl, "osl": osl,
                          "concurrency": row.concurrency, "tp": tp, "weights": weights,
                          "request": {k: v for k, v in req.items() if k != "cases"},
                          "row": row.__dict__})
    doc = {"about": "aiconfigurator's own estimates (tools/aic_estimate.py in .venv-aic), recorded by "
                    "scripts/record_aiconfigurator.py; none of these cases is a shape trtkv's efficiencies were read at "
                    "(tools/aic_kernels.py).",
           "aiconfigurator": answers[0].version if answers else None,
           "aiconfigurator_core": answers[0].core_version if answers else None,
           "errors": [e for a in answers for e in a.errors], "cases": cases}
    sc.AIC_CASES.parent.mkdir(parents=True, exist_ok=True)
    sc.AIC_CASES.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(cases)} rows, {len(doc['errors'])} errors -> {sc.AIC_CASES}")
    return 0


def record_moe() -> int:
    # (model, config, GPU, engine, tp, ep, attention_dp, weights, concurrency levels)
    setups = [(model, config, gpu, backend, tp, 1, 1, weights, mc.MOE_CONCURRENCY)
              for model, config, tp, weights, backends, gpus in mc.MOE_CASE_SETS for gpu in gpus for backend in backends]
    setups += [(model, config, gpu, backend, tp, ep, adp, "none", mc.MOE_LAYOUT_CONCURRENCY)
               for model, config, gpu, backend, tp, ep, adp in mc.MOE_LAYOUT_SETS]
    requests, keys = [], []
    for model, config, gpu, backend, tp, ep, adp, weights, levels in setups:
        for isl, osl in mc.MOE_WORKLOADS:
            recipe = sc.recipe_for(config, gpu, backend, "bf16", isl, osl, list(levels), isl + 16, weights=weights,
                                   tp=tp, ep=ep, attention_dp=adp)
            req = aic.request(recipe, resolve_architecture(recipe), ["bfloat16", "fp8"], levels, str(sc.ROOT / config))
            requests.append(req)
            keys.append((model, config, gpu, backend, isl, osl, req, tp, ep, adp, weights))
    answers = aic.run_many({"requests": requests}, timeout=3600)
    cases, errors = [], []
    for (model, config, gpu, backend, isl, osl, req, tp, ep, adp, weights), answer in zip(keys, answers, strict=True):
        # the request as sent, its model path relative to the checkout (the same on every machine)
        sent = {k: v for k, v in req.items() if k != "cases"} | {"model_path": config}
        where = f"{model}/{mc.layout_name(tp, ep, adp)}/{gpu}/{backend}/{isl}x{osl}"
        for row in answer.rows:
            cases.append({"id": f"{where}/{row.kv}/c{row.concurrency}",
                          "model_config": config, "gpu": gpu, "backend": backend, "kv": row.kv, "isl": isl, "osl": osl,
                          "concurrency": row.concurrency, "tp": tp, "ep": ep, "attention_dp": adp, "weights": weights,
                          "used_to_fit": False, "request": sent, "row": row.__dict__})
        errors += [{"id": f"{where}/{kv}/c{c}", "error": e.replace(f"{sc.ROOT}/", "")} for kv, c, e in answer.failures]
    doc = {"about": "aiconfigurator's own estimates for mixture-of-experts models (tools/aic_estimate.py in .venv-aic), "
                    "recorded by `scripts/record_aiconfigurator.py --moe`, each request with its MoE parallelism in "
                    "aiconfigurator's terms (attention_dp, moe_tp, moe_ep: trtkv/plan/aic.py moe_parallelism). "
                    "used_to_fit: whether the case set any parameter of trtkv's model (none did: it reads kernel rows "
                    "only, tools/aic_kernels.py).",
           "aiconfigurator": answers[0].version if answers else None,
           "aiconfigurator_core": answers[0].core_version if answers else None,
           "errors": errors, "cases": cases}
    mc.MOE_CASES.parent.mkdir(parents=True, exist_ok=True)
    mc.MOE_CASES.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(cases)} rows, {len(errors)} errors -> {mc.MOE_CASES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
