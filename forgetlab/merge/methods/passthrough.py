"""Passthrough (mergekit's `passthrough`): copy one model's tensors, optionally scaled — with `slices`, the
frankenmerge: layer ranges of several models stacked into a new model (the engine re-indexes the layers and
sets the output config's layer count; forgetlab.merge.slicing). θ = scale·θ_source."""
from __future__ import annotations

import torch

from forgetlab.merge.methods.common import LAM_RANGE
from forgetlab.merge.registry import MergekitSpec, MkParam, ParamSpec, TensorJob, WorkingMemory, method


# mergekit's per-input scale is the one value of forgetlab's passthrough, which has one input
PASSTHROUGH_MERGEKIT = MergekitSpec("passthrough", base="ignored",
                                    params={"scale": MkParam("scale", "scale", True, False, 1.0)})


@method("passthrough", "Passthrough: copy one model's tensors (with slices: stack layer ranges of several models).",
        (ParamSpec("scale", "float", 1.0, "Factor applied to every copied tensor (mergekit's per-input scale; with "
                   "a filter it zeroes or damps some tensors, e.g. o_proj).", LAM_RANGE),),
        min_models=0, max_models=0, mergekit=PASSTHROUGH_MERGEKIT, formula="θ = scale·θ_source", in_place=False,
        memory=WorkingMemory(fast=(0.1, 0), reference=(0.2, 0)),
        title="passthrough", paper="mergekit's passthrough method")
def _passthrough(job: TensorJob) -> torch.Tensor:
    scale = float(job.params["scale"])
    return job.base if scale == 1.0 else job.base * scale
