"""Session-wide settings chosen in the sidebar: the pool file, the device and the dtype.

`app.py` draws the widgets once per run (`render_device_settings`, the pool chooser in `forgetlab.ui.sidebar`);
pages only read the values (`device_settings()`, `pool_path()`), so a page never draws a duplicate widget.
A page run on its own (e.g. in an AppTest) gets the defaults: CPU, float32, and the first zoo preset found.
"""
from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

POOL_KEY = "forgetlab_pool_path"      # str path of the chosen pool.yaml (set by the sidebar or a test)
DEVICE_KEY = "app_device"             # "cpu" | "cuda"
DTYPE_KEY = "app_dtype"               # "float32" | "bfloat16" | "float16"
DTYPES = ("float32", "bfloat16", "float16")   # names of torch dtypes; torch is imported when one is used
PRESET_ORDER = ("pico", "smol")


def available_devices() -> list[str]:
    """The devices the sidebar offers: "cpu", plus "cuda" only when torch.cuda.is_available()."""
    import torch

    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def render_device_settings() -> None:
    """Draw the device and dtype selectors (in whatever container is active; app.py uses the sidebar)."""
    devices = available_devices()
    if st.session_state.get(DEVICE_KEY) not in devices:
        st.session_state[DEVICE_KEY] = devices[-1]
    if st.session_state.get(DTYPE_KEY) not in DTYPES:
        st.session_state[DTYPE_KEY] = "float32"
    st.selectbox("Device", devices, key=DEVICE_KEY,
                 help="Where models run forward passes. CUDA is offered only when a GPU is visible.")
    st.selectbox("Dtype", list(DTYPES), key=DTYPE_KEY,
                 help="Precision of loaded models. float32 is exact; bfloat16/float16 halve memory.")


def device_settings() -> tuple[str, "torch.dtype"]:
    """The (device, dtype) chosen in the sidebar; ("cpu", torch.float32) until something is chosen."""
    device = st.session_state.get(DEVICE_KEY, "cpu")
    if device not in available_devices():
        device = "cpu"
    import torch

    name = st.session_state.get(DTYPE_KEY, "float32")
    return device, getattr(torch, name if name in DTYPES else "float32")


def workspace_home() -> Path:
    """The workspace folder: `forgetlab.core.workspace.home()` (FORGETLAB_HOME, default ~/.forgetlab)."""
    from forgetlab.core.workspace import home

    return Path(home())


def zoo_presets() -> dict[str, Path]:
    """`{preset name: pool.yaml path}` for every folder under the workspace's zoo dir holding a pool.yaml.

    Known presets come first in a fixed order (pico, smol), then the others alphabetically.
    """
    from forgetlab.core.workspace import zoo_dir

    root = Path(zoo_dir())
    if not root.is_dir():
        return {}
    found = {p.parent.name: p for p in sorted(root.glob("*/pool.yaml"))}
    order = [n for n in PRESET_ORDER if n in found] + sorted(n for n in found if n not in PRESET_ORDER)
    return {n: found[n] for n in order}


def default_pool_path() -> str | None:
    """The pool used when none is chosen: env FORGETLAB_POOL if set, else the first zoo preset, else None."""
    env = os.environ.get("FORGETLAB_POOL")
    if env:
        return env
    presets = zoo_presets()
    return str(next(iter(presets.values()))) if presets else None


def pool_path() -> str | None:
    """The pool.yaml path chosen in the sidebar (session state); `default_pool_path()` if none was chosen.

    An explicit "no pool" choice (the user picked "own pool.yaml" but gave no path) gives None.
    """
    if POOL_KEY in st.session_state:
        chosen = st.session_state[POOL_KEY]
        return str(chosen) if chosen else None
    return default_pool_path()


def set_pool_path(path: str | os.PathLike | None) -> None:
    """Choose the pool for this browser session; None chooses "no pool" explicitly."""
    st.session_state[POOL_KEY] = str(Path(path).expanduser()) if path else ""


def reset_pool_choice() -> None:
    """Forget the session's pool choice: `pool_path()` falls back to `default_pool_path()`."""
    st.session_state.pop(POOL_KEY, None)


def eval_limits(page: str, general: int = 32, task: int = 50) -> tuple[int, int]:
    """Two inputs side by side, keyed by page: how many held-out general blocks and eval pairs per task an
    evaluation uses (fewer: faster, noisier). Returns (max_general, max_task)."""
    c1, c2 = st.columns(2)
    max_general = c1.number_input("general blocks (max)", 1, 4096, general, key=f"{page}_max_general")
    max_task = c2.number_input("pairs per task (max)", 1, 4096, task, key=f"{page}_max_task")
    return int(max_general), int(max_task)
