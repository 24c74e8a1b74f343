"""Model merging: every method of METHODS.md as small pure tensor functions, a registry, an in-memory API,
a streaming engine over checkpoints on disk, recipes (ours and mergekit's) and a PCB λ search.

    from forgetlab.merge import METHODS, merge_state_dicts, run
"""
from forgetlab.merge import methods as _methods  # noqa: F401  (registers the built-in methods)
from forgetlab.merge import submodule as _submodule  # noqa: F401  (registers submodule_alpha)
from forgetlab.merge.api import merge_state_dicts
from forgetlab.merge.registry import (METHODS, MethodSpec, ParamSpec, PrepareContext, TensorJob, get_method,
                                      load_plugins, register, validate_params)

__all__ = ["METHODS", "MethodSpec", "ParamSpec", "PrepareContext", "TensorJob", "get_method", "load_plugins",
           "merge_state_dicts",
           "register", "run", "validate_params"]


def run(recipe, out_dir, progress=None, overwrite=False, device="cpu", **kwargs):
    """Merge checkpoints on disk by a recipe into an HF folder (see forgetlab.merge.engine.run)."""
    from forgetlab.merge.engine import run as _run
    return _run(recipe, out_dir, progress=progress, overwrite=overwrite, device=device, **kwargs)
