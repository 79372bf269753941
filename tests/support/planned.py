"""`trtkv deploy`'s library calls with the recipe's plan handed in, as the CLI hands it
(trtkv.plan.figures -> trtkv.contracts.PlanFigures): the deploy stage never imports the planner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv import deploy as stage
from trtkv.deploy import sizing
from trtkv.plan import figures
from trtkv.recipe import Recipe


def deploy(recipe: Recipe, *args: Any, **kwargs: Any) -> Path:
    return stage.deploy(recipe, *args, planned=figures(recipe), **kwargs)


def size(recipe: Recipe, *args: Any, **kwargs: Any) -> sizing.Sizing:
    return sizing.size(recipe, figures(recipe), *args, **kwargs)
