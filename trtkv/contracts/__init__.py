"""Foundation layer: what stages, servers and clients agree on: the stage contract
(trtkv.contracts.stage: manifest, up-to-date skip, atomic output; the output folders trtkv may
replace, leftovers and the atomic swap in outputs), the typed files stages hand each other
(artifacts; results.json's in bench_doc, probe.json's in probe_doc), the request interface of a
served model (interface) and the one-token canary request built from it (canary), the RULER plan
the bench hands the probe (ruler), the plan's figures the CLI hands serving, bench, deploy and
report (plan_figures)."""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.contracts.artifacts import (
        Artifact,
        KVScaleLayer,
        KVScalesFile,
        Manifest,
        ServerRecord,
        SupervisorRecord,
    )
    from trtkv.contracts.bench_doc import (
        CANCELLED,
        ERROR,
        NOT_SENT,
        OK,
        TIMEOUT,
        BenchEndpoint,
        BenchLevel,
        BenchResults,
        BenchSLOs,
        BenchSweep,
        BenchWorkload,
        ClientSummary,
        KVPoolCheck,
        MetricStats,
        RequestRecord,
        RequestRecordDoc,
        SLOVerdict,
        SweepLevel,
        TaskScore,
        TimeOrigin,
        now_ns,
    )
    from trtkv.contracts.canary import (
        CANARY_TIMEOUT_S,
        canary_script,
        docker_health_args,
    )
    from trtkv.contracts.interface import ENSEMBLE, INTERFACES, LLMAPI, ModelInterface, detect
    from trtkv.contracts.outputs import (
        OWNER,
        check_inside,
        check_output,
        in_place_output,
        remove_leftovers,
        replace_folder,
    )
    from trtkv.contracts.plan_figures import PlanFigures, PlannedFormat
    from trtkv.contracts.prefix import (
        PredictedHits,
        PrefixLevel,
        PrefixPrediction,
        PrefixTier,
        with_prediction,
    )
    from trtkv.contracts.probe_doc import ProbeDoc, ProbeRecord
    from trtkv.contracts.ruler import RulerPlan
    from trtkv.contracts.stage import (
        VERSIONED_TOOLS,
        StageResult,
        input_problem,
        manifest_hash,
        read_manifest,
        require_input,
        require_made_from,
        run_stage,
        tool_versions,
    )

# each name's module is imported on first use: importing one contract does not load the others
__getattr__, __dir__ = attach(__name__, stub=__file__)

__all__ = [
    "Artifact",
    "BenchEndpoint",
    "BenchLevel",
    "BenchResults",
    "BenchSLOs",
    "BenchSweep",
    "BenchWorkload",
    "canary_script",
    "CANARY_TIMEOUT_S",
    "CANCELLED",
    "check_inside",
    "check_output",
    "ClientSummary",
    "detect",
    "docker_health_args",
    "ENSEMBLE",
    "ERROR",
    "in_place_output",
    "input_problem",
    "INTERFACES",
    "KVPoolCheck",
    "KVScaleLayer",
    "KVScalesFile",
    "LLMAPI",
    "Manifest",
    "manifest_hash",
    "MetricStats",
    "ModelInterface",
    "NOT_SENT",
    "now_ns",
    "OK",
    "OWNER",
    "PlanFigures",
    "PlannedFormat",
    "PredictedHits",
    "PrefixLevel",
    "PrefixPrediction",
    "PrefixTier",
    "ProbeDoc",
    "ProbeRecord",
    "read_manifest",
    "remove_leftovers",
    "replace_folder",
    "RequestRecord",
    "RequestRecordDoc",
    "require_input",
    "require_made_from",
    "RulerPlan",
    "run_stage",
    "ServerRecord",
    "SLOVerdict",
    "StageResult",
    "SupervisorRecord",
    "SweepLevel",
    "TaskScore",
    "TimeOrigin",
    "TIMEOUT",
    "tool_versions",
    "VERSIONED_TOOLS",
    "with_prediction",
]
