"""Foundation layer: what stages, servers and clients agree on: the stage contract
(trtkv.contracts.stage: manifest, up-to-date skip, atomic output; the output folders trtkv may
replace, leftovers and the atomic swap in outputs), the typed files stages hand each other
(artifacts), the request interface of a served model (interface) and the one-token canary request
built from it (canary)."""

__all__ = [
    "Artifact",
    "BenchEndpoint",
    "BenchResults",
    "BenchSLOs",
    "BenchWorkload",
    "canary_script",
    "CANARY_TIMEOUT_S",
    "check_inside",
    "check_output",
    "detect",
    "docker_health_args",
    "ENSEMBLE",
    "health_cmd",
    "in_place_output",
    "input_problem",
    "INTERFACES",
    "KVScaleLayer",
    "KVScalesFile",
    "LLMAPI",
    "Manifest",
    "manifest_hash",
    "ModelInterface",
    "OWNER",
    "ProbeDoc",
    "read_manifest",
    "remove_leftovers",
    "replace_folder",
    "require_input",
    "require_made_from",
    "run_stage",
    "ServerRecord",
    "StageResult",
    "SupervisorRecord",
    "tool_versions",
    "VERSIONED_TOOLS",
]
