"""Keep Python's cyclic garbage collector off the app's long-lived objects.

The app's server holds torch, transformers, plotly, pandas and Streamlit — a few hundred thousand objects
that live as long as the process. Every script run (and every poll of a running job's progress, a fragment
rerun) allocates enough to trigger collections, and each full collection walks that whole heap: ~0.4 s on
this machine, holding the GIL, so the polls cost ~10% of a core and the job thread (training, sweeps) stalls
meanwhile. `freeze_long_lived()` — called by app.py after each run — moves what is alive into the collector's
permanent generation (`gc.freeze`) whenever new modules were imported since the last time (the long-lived
objects come with imports), after one last collection so that no garbage is frozen with them. Measured: a
job's progress poll every 2 s went from 9% to under 1% of a core (bench/app_latency.py --jobs).
"""
from __future__ import annotations

import gc
import sys
import threading

_lock = threading.Lock()
_modules_at_freeze = 0
MIN_NEW_MODULES = 10


def freeze_long_lived(min_new_modules: int = MIN_NEW_MODULES) -> bool:
    """`gc.collect()` then `gc.freeze()` when at least `min_new_modules` modules were imported since the last
    freeze (cheap otherwise: one length check). Returns True when it froze."""
    global _modules_at_freeze
    if len(sys.modules) - _modules_at_freeze < min_new_modules:
        return False
    with _lock:
        if len(sys.modules) - _modules_at_freeze < min_new_modules:
            return False
        gc.collect()
        gc.freeze()
        _modules_at_freeze = len(sys.modules)
    return True
