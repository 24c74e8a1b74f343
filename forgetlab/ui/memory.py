"""The memory line under a page's main button: "needs ≈ X GiB, Y GiB free", and a refusal that names the fix.

A page calls `memory_check(estimator, **the job's keyword arguments)` just above its main button (the estimator is
the job's own function, e.g. `forgetlab.core.eval_memory.estimate_eval`) and disables the button when it returns
False. An analysis page gets the same from its panel (forgetlab.ui.panel).
"""
from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from forgetlab.core.errors import ForgetlabError
from forgetlab.core.memory import MemoryEstimate, gib, with_free


def memory_check(estimator: Callable[..., MemoryEstimate], **kwargs: Any) -> bool:
    """Show the job's estimated peak and the device's free memory as a caption; when it will not fit, show an
    error naming what to change (sidebar Dtype, LoRA, checkpointing, batch …) and return False. An estimate
    that cannot be made (e.g. the pool is missing a model) shows nothing and returns True: the job's own
    checks then say what is wrong."""
    try:
        est = with_free(estimator(**kwargs))
    except ForgetlabError:
        return True
    return show_estimate(est)


def show_estimate(est: MemoryEstimate) -> bool:
    """Draw an estimate already made (`memory_check`'s line, or its refusal naming the fixes); whether it fits."""
    if est.fits:
        st.caption(f"Memory: needs ≈ {gib(est.total)}"
                   + (f", {gib(est.free)} free on {est.device}" if est.free is not None else "")
                   + f" ({est.dtype}; {est.breakdown()}).")
        return True
    fixes = ", then ".join(est.fixes) if est.fixes else "a smaller model or a device with more memory"
    st.error(f"This will not fit: needs ≈ {gib(est.total)} but only {gib(est.free or 0)} is free on "
             f"{est.device} ({est.breakdown()}). To make it fit, try {fixes}.")
    return False
