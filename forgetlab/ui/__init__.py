"""Streamlit adapters for forgetlab's app: the only part of forgetlab that imports streamlit.

- `get_pool()` / `require_pool()`: the pool chosen in the sidebar, cached by (file, mtime).
- `progress_bar(label)`: a `progress(fraction, message)` callback drawn as st.status + st.progress.
- `show_errors()`: ForgetlabError → st.error with its message; anything else → short error + traceback.
- `device_settings()`: the (device, dtype) chosen in the sidebar; `eval_budget()`: the app's one evaluation
  budget (held-out blocks, pairs per task), also chosen there.
- `run_once(key, fn, start=...)`: a long job in a background thread, once per key, surviving page switches.
- `speciality_measure()`: the session-wide "speciality measured by" choice (exact match ↑ / answer loss ↓).

The names are imported on first use (PEP 562), so that `import forgetlab.ui.navigation` — what app.py needs to
draw the menu — does not import torch or transformers.
"""
from __future__ import annotations

import importlib

_WHERE = {
    "render_error": "errors", "show_errors": "errors",
    "REGISTRY": "jobs", "Job": "jobs", "JobCancelled": "jobs", "JobRegistry": "jobs", "job_key": "jobs",
    "run_once": "jobs",
    "clear_pool_cache": "pool", "get_pool": "pool", "require_finetuned": "pool", "require_pool": "pool",
    "require_tasks": "pool",
    "progress_bar": "progress",
    "device_settings": "settings", "eval_budget": "settings", "budget_caption": "settings", "pool_path": "settings",
    "render_device_settings": "settings", "set_pool_path": "settings", "workspace_home": "settings",
    "zoo_presets": "settings",
    "speciality_measure": "measure", "default_measure": "measure", "measure_label": "measure",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'forgetlab.ui' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"forgetlab.ui.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
