"""Session-wide settings chosen in the sidebar: the pool file, the device, the dtype and the evaluation budget.

`app.py` draws the widgets once per run (`render_device_settings`, the pool chooser in `forgetlab.ui.sidebar`);
pages only read the values (`device_settings()`, `pool_path()`, `eval_budget()`), so a page never draws a duplicate
widget.
A page run on its own (e.g. in an AppTest) gets the defaults: CPU, float32, and the first zoo preset found.
The dtype defaults to the device's (`default_dtype`): bfloat16 on cuda, float32 on cpu; choosing another device
resets it to that device's default (the user can still pick another one after).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st
import torch

from forgetlab.core.scorecards import DEFAULT_BUDGET, Budget
from forgetlab.core.workspace import home, zoo_dir
from forgetlab.zoo.claims import stored_claims

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from forgetlab.core.scorecards import Budget

POOL_KEY = "forgetlab_pool_path"      # str path of the chosen pool.yaml (set by the sidebar or a test)
DEVICE_KEY = "app_device"             # "cpu" | "cuda"
DTYPE_KEY = "app_dtype"               # "float32" | "bfloat16" | "float16"
DTYPES = ("float32", "bfloat16", "float16")   # names of torch dtypes; torch is imported when one is used
PRESET_ORDER = ("pico", "smol")


def available_devices() -> list[str]:
    """The devices the sidebar offers: "cpu", plus "cuda" only when torch.cuda.is_available()."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def default_dtype(device: str) -> str:
    """The dtype name a job gets on `device` unless one is chosen: "bfloat16" on cuda, "float32" elsewhere
    (the same rule as `forgetlab.core.memory.job_dtype(None, device)`)."""
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def _device_changed() -> None:
    st.session_state[DTYPE_KEY] = default_dtype(st.session_state.get(DEVICE_KEY, "cpu"))


def render_device_settings() -> None:
    """Draw the device and dtype selectors (in whatever container is active; app.py uses the sidebar)."""
    devices = available_devices()
    if st.session_state.get(DEVICE_KEY) not in devices:
        st.session_state[DEVICE_KEY] = devices[-1]
    if st.session_state.get(DTYPE_KEY) not in DTYPES:
        st.session_state[DTYPE_KEY] = default_dtype(st.session_state[DEVICE_KEY])
    st.selectbox("Device", devices, key=DEVICE_KEY, on_change=_device_changed,
                 help="Where models run forward passes. CUDA is offered only when a GPU is visible. "
                      "Changing it resets the dtype to the device's default.")
    st.selectbox("Dtype", list(DTYPES), key=DTYPE_KEY,
                 help="Precision of loaded models (default: bfloat16 on cuda, float32 on cpu). bfloat16/float16 "
                      "halve memory; reductions that a score needs (losses, distances, sums over the "
                      "vocabulary, merges' θ0 + f(τ)) stay in float32 whatever is chosen.")


def device_settings() -> tuple[str, "torch.dtype"]:
    """The (device, dtype) chosen in the sidebar; ("cpu", torch.float32) until something is chosen, and the
    device's default dtype (`default_dtype`) when only a device is chosen."""
    device = st.session_state.get(DEVICE_KEY, "cpu")
    if device not in available_devices():
        device = "cpu"

    name = st.session_state.get(DTYPE_KEY)
    return device, getattr(torch, name if name in DTYPES else default_dtype(device))


def workspace_home() -> Path:
    """The workspace folder: `forgetlab.core.workspace.home()` (FORGETLAB_HOME, default ~/.forgetlab)."""
    return Path(home())


def zoo_presets() -> dict[str, Path]:
    """`{preset name: pool.yaml path}` for every folder under the workspace's zoo dir holding a pool.yaml.

    Known presets come first in a fixed order (pico, smol), then the others alphabetically.
    """
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


BUDGET_GENERAL_KEY = "app_max_general"     # held-out blocks of the app's evaluation budget (sidebar)
BUDGET_TASK_KEY = "app_max_task"           # eval pairs per task of the app's evaluation budget (sidebar)


def default_budget(path: str | os.PathLike | None = None) -> "Budget":
    """The budget the app starts with for the pool file `path` (default: the chosen pool): the one the zoo
    measured its claims with (so "what this zoo shows" and every page give the base the same held-out loss),
    else `forgetlab.core.scorecards.DEFAULT_BUDGET`."""
    path = pool_path() if path is None else path
    claims = stored_claims(path) if path else None
    if claims is not None:
        try:
            return Budget(claims.settings.get("max_general"), claims.settings.get("max_task"))
        except Exception:  # noqa: BLE001 - a claim file with odd limits only loses the default
            pass
    return DEFAULT_BUDGET


def render_budget_settings() -> None:
    """Draw the app's one evaluation budget (held-out blocks, eval pairs per task); every page's evaluation uses
    it (`eval_budget()`), so a model shows the same numbers on every page."""
    if st.session_state.get(BUDGET_GENERAL_KEY) is None or st.session_state.get(BUDGET_TASK_KEY) is None:
        budget = default_budget()
        st.session_state.setdefault(BUDGET_GENERAL_KEY, budget.max_general or 4096)
        st.session_state.setdefault(BUDGET_TASK_KEY, budget.max_task or 4096)
    st.markdown("**Evaluation budget** (every page)")
    c1, c2 = st.columns(2)
    c1.number_input("held-out blocks", 1, 4096, key=BUDGET_GENERAL_KEY,
                    help="General loss: the first N blocks of 128 tokens of the held-out text. More: a steadier "
                         "number, slower evaluations. One budget for every page, so a model shows the same "
                         "number everywhere; scorecards are computed once per model and budget.")
    c2.number_input("pairs per task", 1, 4096, key=BUDGET_TASK_KEY,
                    help="Speciality: the first N eval pairs of each task.")


def eval_budget() -> "Budget":
    """The app's evaluation budget (sidebar); `default_budget()` until one is chosen (e.g. a page run alone)."""
    general, task = st.session_state.get(BUDGET_GENERAL_KEY), st.session_state.get(BUDGET_TASK_KEY)
    if general is None or task is None:
        fallback = default_budget()
        general = fallback.max_general if general is None else general
        task = fallback.max_task if task is None else task
    return Budget(int(general), int(task))


def budget_caption(budget: "Budget | None" = None, *, note: str = "") -> None:
    """One line saying which budget a page's numbers come from (the sidebar's, unless told otherwise)."""
    budget = budget or eval_budget()
    st.caption(f"Evaluation budget: {budget.describe()} (sidebar, the same on every page){note}.")
