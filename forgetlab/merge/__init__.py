"""Model merging: a registry of methods (`forgetlab.merge.methods`, one file per family), an in-memory API, a
streaming engine over checkpoints on disk, recipes (ours and mergekit's), the workflow shared by the CLI and the
app, and the working copy analyses build their weights with.

    from forgetlab.merge import METHODS, merge_state_dicts, run
"""
from forgetlab.merge import engine
from forgetlab.merge.api import merge_state_dicts
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.registry import (METHODS, MethodSpec, ParamSpec, PrepareContext, TensorJob, fast_kernel,
                                      get_method, method, register, validate_params)

__all__ = ["METHODS", "MethodSpec", "ParamSpec", "PrepareContext", "TensorJob", "fast_kernel", "get_method",
           "merge_state_dicts", "method", "register", "run", "validate_params"]


def run(recipe, out_dir, progress=None, overwrite=False, device="cpu", **kwargs):
    """Merge checkpoints on disk by a recipe (a Recipe, a dict, YAML text or a recipe file, parsed once here) into
    an HF folder (see forgetlab.merge.engine.run)."""
    return engine.run(load_recipe(recipe), out_dir, progress=progress, overwrite=overwrite, device=device, **kwargs)
