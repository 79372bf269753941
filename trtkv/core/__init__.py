"""Foundation layer: user-facing errors, project paths, the stage contract, processes and their sessions, external tools,
progress, the API key and the shipped texts. Imports nothing else of trtkv."""

__all__ = [
    "API_KEY_ENV", "API_KEY_FILE_ENV", "auth_headers", "CALIB_DEFAULT", "EVAL_LONG_TEXT", "eval_long_text", "Flag",
    "FOLDERS", "HOME", "is_running", "load_texts", "naming", "NotReadable", "Options", "os_error_line", "paths",
    "pid_alive", "port_in_use", "Progress", "project_root", "quiz_items", "quote", "read_capped", "read_json",
    "RecipeError", "request", "resolve_files", "run_logged", "sessions", "StageError", "strict_json", "tail",
    "temp_sibling", "ToolError", "Transport", "TRITON_KEY_HEADER", "TrtkvError", "VLLM_KEY_ENV", "wait_http_ready"
]
