"""Streamlit adapters for forgetlab's app: the only part of forgetlab that imports streamlit.

- `get_pool()` / `require_pool()`: the pool chosen in the sidebar, cached by (file, mtime).
- `progress_bar(label)`: a `progress(fraction, message)` callback drawn as st.status + st.progress.
- `show_errors()`: ForgetlabError → st.error with its message; anything else → short error + traceback.
- `device_settings()`: the (device, dtype) chosen in the sidebar.
- `run_once(key, fn, start=...)`: a long job in a background thread, once per key, surviving page switches.
"""
from forgetlab.ui.errors import render_error, show_errors
from forgetlab.ui.jobs import REGISTRY, Job, JobCancelled, JobRegistry, job_key, run_once
from forgetlab.ui.pool import clear_pool_cache, get_pool, require_finetuned, require_pool, require_tasks
from forgetlab.ui.progress import progress_bar
from forgetlab.ui.settings import (
    device_settings,
    eval_limits,
    pool_path,
    render_device_settings,
    set_pool_path,
    workspace_home,
    zoo_presets,
)

__all__ = [
    "REGISTRY", "Job", "JobCancelled", "JobRegistry", "clear_pool_cache", "device_settings", "eval_limits", "get_pool",
    "job_key", "pool_path", "progress_bar", "render_device_settings", "render_error", "require_finetuned",
    "require_pool", "require_tasks",
    "run_once", "set_pool_path", "show_errors", "workspace_home", "zoo_presets",
]
