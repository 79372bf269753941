"""Recipes: a pydantic schema (extra keys forbidden), `include:`, overrides, and one report of every
problem.

A recipe is a YAML file under `recipes/` (or any path). Loading it:
  1. reads the YAML and its `include:` files (relative to the including file; local keys win; cycles
     are errors),
  2. applies command-line overrides `section.key=value` (they win over the files),
  3. validates the result against `Recipe`, adds the default bench task the backend row allows,
     then the cross-field rules (and the backend's, trtkv.recipe.backend_rules),
and reports every problem at once, each naming the file, the field, the value and the allowed
values.

Recipe names are checked where a recipe is found (`check_recipe_name`, for other stages to reuse
too), and the YAML is read as plain data: bounded in bytes, nesting and aliases, duplicate keys
refused.

The most used names are importable from here; the work is in the modules: `schema` (enums and
sections; the bench section in `bench_section`, the model section in `model_section`), `loader`
(finding files, validation, error messages; includes and overrides in `tree`), `names` (the
recipe-name rule), `plain_yaml` (bounded YAML), `rules` (cross-field rules; each backend's in
`backend_rules`, `engine_formats`, `memory_knobs`, `kv_tiers`), `reference` (the recipe table in
docs/recipes.md), `layout` (stage folders), `attention` (layer kinds), `settle` (the check of the
text `trtkv init` writes). `__all__` is the package's face: every name other packages import, from
here or from its module (tests/test_exported_members.py).
"""

from typing import TYPE_CHECKING

from trtkv.core.lazy import attach
from trtkv.recipe.attention import (
    ACCOUNTING_TEXT,
    VLLM_BLOCK_CPU,
    VLLM_BLOCK_GPU,
    Accounting,
    AttentionKind,
    KVShape,
    LayerAttention,
    bytes_by_attention,
    compact_layers,
    layer_formats,
    parse_layers,
    stages,
    summary,
    vllm_hybrid_on,
    vllm_layer,
    vllm_padded_counts,
    vllm_tokens,
)
from trtkv.recipe.backend_rules import (
    BACKEND_ROWS,
    HF_EXPORT_BACKENDS,
    HF_EXPORT_ONLY,
    KV_ACCOUNTING,
    SPEED_ENGINE,
    SPEED_ENGINES,
    build_notes,
    gemm_plugin_choice,
    kv_only_compressed_tensors,
)
from trtkv.recipe.bench_section import MAX_SWEEP_LENGTHS
from trtkv.recipe.engine_formats import served_kv_formats
from trtkv.recipe.enums import (
    SLO_PATTERN,
    Backend,
    BenchTask,
    KVCacheQuant,
    ModelDtype,
    Protocol,
    WeightQuant,
    kv_algo,
    kv_row,
)
from trtkv.recipe.kv_tiers import sglang_gb_per_rank
from trtkv.recipe.limits import CONFIG_FIELDS, MAX_LIST, RANGES, WORD, check_config_field
from trtkv.recipe.loader import dump_yaml, list_recipes, load_recipe, recipe_name
from trtkv.recipe.moe_activations import (
    moe_activation_choices,
    moe_activations_text,
    resolved_moe_activations,
)
from trtkv.recipe.names import check_recipe_name
from trtkv.recipe.parallel import Parallelism
from trtkv.recipe.rules import cross_field_problems, kv_heads_split
from trtkv.recipe.schema import Recipe
from trtkv.recipe.state import (
    STATE_DTYPE_BYTES,
    StateKind,
    StateSpec,
    gated_deltanet,
    mamba1,
    mamba2,
    state_dtypes,
    state_from_dict,
)

if TYPE_CHECKING:
    from trtkv.recipe.engine_attention import recipe_mode
    from trtkv.recipe.layout import (
        CONTAINER_ROOT,
        HF,
        HF_CONFIG,
        WEIGHT_ALGOS,
        Artifacts,
        bench_dir,
        checkpoint_dir,
        checkpoint_tokenizer_dir,
        container_artifacts,
        container_mounts,
        engine_dir,
        fidelity_dir,
        host_artifacts,
        kv_cache_quant_algo,
        probe_dir,
        repo_dir,
        serve_dir,
        served_artifacts,
        to_container,
    )
    from trtkv.recipe.prefix_cache import host_tier_bytes
    from trtkv.recipe.settle import (
        MOVED_FORMATS,
        Settings,
        batch_for,
        propose_wide_ep,
        refusal,
    )
    from trtkv.recipe.stored import (
        KV_CALIBRATED_WEIGHTS,
        declared_kv_problems,
        engine_unit_scale,
    )

# the modules loading a recipe does not need are imported on first use
__getattr__, __dir__ = attach(
    __name__, submodules=["layout", "prefix_cache", "settle"], stub=__file__
)

__all__ = [
    "Accounting",
    "ACCOUNTING_TEXT",
    "Artifacts",
    "AttentionKind",
    "Backend",
    "BACKEND_ROWS",
    "batch_for",
    "bench_dir",
    "BenchTask",
    "build_notes",
    "bytes_by_attention",
    "check_config_field",
    "check_recipe_name",
    "checkpoint_dir",
    "checkpoint_tokenizer_dir",
    "compact_layers",
    "CONFIG_FIELDS",
    "container_artifacts",
    "container_mounts",
    "CONTAINER_ROOT",
    "cross_field_problems",
    "declared_kv_problems",
    "dump_yaml",
    "engine_dir",
    "engine_unit_scale",
    "fidelity_dir",
    "gated_deltanet",
    "gemm_plugin_choice",
    "HF",
    "HF_CONFIG",
    "HF_EXPORT_BACKENDS",
    "HF_EXPORT_ONLY",
    "host_artifacts",
    "host_tier_bytes",
    "KV_ACCOUNTING",
    "kv_algo",
    "kv_cache_quant_algo",
    "KV_CALIBRATED_WEIGHTS",
    "kv_heads_split",
    "kv_only_compressed_tensors",
    "kv_row",
    "KVCacheQuant",
    "KVShape",
    "layer_formats",
    "LayerAttention",
    "layout",
    "list_recipes",
    "load_recipe",
    "mamba1",
    "mamba2",
    "MAX_LIST",
    "MAX_SWEEP_LENGTHS",
    "ModelDtype",
    "moe_activation_choices",
    "moe_activations_text",
    "MOVED_FORMATS",
    "Parallelism",
    "parse_layers",
    "prefix_cache",
    "probe_dir",
    "propose_wide_ep",
    "Protocol",
    "RANGES",
    "Recipe",
    "recipe_mode",
    "recipe_name",
    "refusal",
    "repo_dir",
    "resolved_moe_activations",
    "serve_dir",
    "served_artifacts",
    "served_kv_formats",
    "Settings",
    "settle",
    "sglang_gb_per_rank",
    "SLO_PATTERN",
    "SPEED_ENGINE",
    "SPEED_ENGINES",
    "stages",
    "STATE_DTYPE_BYTES",
    "state_dtypes",
    "state_from_dict",
    "StateKind",
    "StateSpec",
    "summary",
    "to_container",
    "VLLM_BLOCK_CPU",
    "VLLM_BLOCK_GPU",
    "vllm_hybrid_on",
    "vllm_layer",
    "vllm_padded_counts",
    "vllm_tokens",
    "WEIGHT_ALGOS",
    "WeightQuant",
    "WORD",
]
