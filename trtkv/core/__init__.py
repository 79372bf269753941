"""Foundation layer: user-facing errors, project paths, the stage contract, processes and their
sessions, external tools, progress, the API key, the shipped texts and the checks on what servers
and tools report (readback). Imports nothing else of trtkv."""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.core.apikey import (
        API_KEY_ENV,
        API_KEY_FILE_ENV,
        TRITON_KEY_HEADER,
        VLLM_KEY_ENV,
        auth_headers,
    )
    from trtkv.core.errors import RecipeError, StageError, ToolError, TrtkvError, os_error_line
    from trtkv.core.files import (
        NotReadable,
        json_object,
        naming,
        read_capped,
        read_json,
        strict_json,
    )
    from trtkv.core.httpcall import HttpError, Target, Transport, request
    from trtkv.core.options import Flag, Options
    from trtkv.core.paths import FOLDERS, HOME, project_root, temp_sibling
    from trtkv.core.process import is_running, pid_alive, port_in_use, wait_http_ready
    from trtkv.core.progress import Progress
    from trtkv.core.readback import (
        MAX_POOL_BYTES,
        MAX_POOL_TOKENS,
        ReadBackError,
        log_tail,
        real,
        tool_answer,
        whole,
    )
    from trtkv.core.texts import (
        CALIB_DEFAULT,
        EVAL_LONG_TEXT,
        eval_long_text,
        load_texts,
        quiz_items,
        resolve_files,
    )
    from trtkv.core.tools import quote, run_logged, tail

# each name's module is imported on first use: every trtkv import runs this file, so it imports
# nothing itself
__getattr__, __dir__ = attach(__name__, submodules=["paths", "sessions"], stub=__file__)

__all__ = [
    "API_KEY_ENV",
    "API_KEY_FILE_ENV",
    "attach",
    "auth_headers",
    "CALIB_DEFAULT",
    "EVAL_LONG_TEXT",
    "eval_long_text",
    "Flag",
    "FOLDERS",
    "HOME",
    "HttpError",
    "is_running",
    "json_object",
    "load_texts",
    "log_tail",
    "MAX_POOL_BYTES",
    "MAX_POOL_TOKENS",
    "naming",
    "NotReadable",
    "Options",
    "os_error_line",
    "paths",
    "pid_alive",
    "port_in_use",
    "Progress",
    "project_root",
    "quiz_items",
    "quote",
    "read_capped",
    "read_json",
    "ReadBackError",
    "real",
    "RecipeError",
    "request",
    "resolve_files",
    "run_logged",
    "sessions",
    "StageError",
    "strict_json",
    "tail",
    "Target",
    "temp_sibling",
    "tool_answer",
    "ToolError",
    "Transport",
    "TRITON_KEY_HEADER",
    "TrtkvError",
    "VLLM_KEY_ENV",
    "wait_http_ready",
    "whole",
]
