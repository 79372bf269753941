"""Recipes: a pydantic schema (extra keys forbidden), `include:`, overrides, and one report of every problem.

A recipe is a YAML file under `recipes/` (or any path). Loading it:
  1. reads the YAML and its `include:` files (relative to the including file; local keys win; cycles are errors),
  2. applies command-line overrides `section.key=value` (they win over the files),
  3. validates the result against `Recipe`, then the cross-field rules (and the backend's, trtkv.backends),
and reports every problem at once, each naming the file, the field, the value and the allowed values.

Recipe names are checked where a recipe is found (`check_recipe_name`, for other stages to reuse too), and the YAML
is read as plain data: bounded in bytes, nesting and aliases, duplicate keys refused.

The public names live here; the work is in private modules: `schema` (enums and sections; the bench section in
`bench_section`), `loader` (files, includes, overrides, error messages), `names` (the recipe-name rule), `plain_yaml`
(bounded YAML), `rules` (cross-field rules), `reference` (the recipe table in docs/recipes.md).
"""

from trtkv.recipe.backend_rules import BACKEND_RULES
from trtkv.recipe.loader import (
    apply_overrides,
    dump_yaml,
    find_recipe,
    list_recipes,
    load_recipe,
    load_tree,
    parse_override,
    recipe_name,
    validate_data,
)
from trtkv.recipe.names import RECIPE_NAME_RE, RECIPE_NAME_RULE, check_recipe_name, fold_recipe_name
from trtkv.recipe.plain_yaml import MAX_ALIASES, MAX_DEPTH, MAX_FILE_BYTES
from trtkv.recipe.reference import reference_markdown
from trtkv.recipe.rules import cross_field_problems
from trtkv.recipe.schema import (
    KV_CACHE_ALIASES,
    PACKAGED_MODELS,
    SLO_PATTERN,
    Backend,
    BatchingStrategy,
    BenchConfig,
    BenchTask,
    BuildConfig,
    CalibrationConfig,
    GemmPlugin,
    HardwareConfig,
    KVCacheQuant,
    KVScaleStrategy,
    ModelConfig,
    ModelDtype,
    ProbeConfig,
    Protocol,
    QuantizationConfig,
    Recipe,
    SchedulerPolicy,
    TritonConfig,
    WeightQuant,
)

__all__ = [
    "MAX_ALIASES", "MAX_DEPTH", "MAX_FILE_BYTES", "RECIPE_NAME_RE", "RECIPE_NAME_RULE", "check_recipe_name",
    "fold_recipe_name", "BACKEND_RULES", "KV_CACHE_ALIASES", "PACKAGED_MODELS", "SLO_PATTERN", "Backend",
    "BatchingStrategy", "BenchConfig", "BenchTask", "BuildConfig", "CalibrationConfig", "GemmPlugin", "HardwareConfig",
    "KVCacheQuant", "KVScaleStrategy", "ModelConfig", "ModelDtype", "ProbeConfig", "Protocol", "QuantizationConfig",
    "Recipe", "SchedulerPolicy", "TritonConfig", "WeightQuant", "apply_overrides", "cross_field_problems", "dump_yaml",
    "find_recipe", "list_recipes", "load_recipe", "load_tree", "parse_override", "recipe_name", "reference_markdown",
    "validate_data",
]
