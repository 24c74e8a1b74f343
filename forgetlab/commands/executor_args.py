"""What the executor and device-map flags ask for (`forgetlab.commands.args.add_executor` and `add_device_map`
declare them): the executor that runs a command's points, and where a model is placed."""
from __future__ import annotations

import tempfile
import weakref
from dataclasses import replace

from forgetlab.core.checkpoints import load_model
from forgetlab.core.devicemap import placement_for
from forgetlab.executors import make_executor


def executor_from_args(args):
    """The `forgetlab.executors.Executor` the flags ask for (ParameterError for Ray flags without --executor ray)."""
    return make_executor(args.executor, address=args.ray_address, workers=args.workers,
                         gpus_per_worker=args.gpus_per_worker)


def device_from_args(args):
    """`args.device`, or a `forgetlab.core.devicemap.Placement` when --device-map is given (`placement_for`)."""
    return placement_for(args.device, getattr(args, "device_map", None), getattr(args, "max_memory", None))


def load_placed(ckpt, placement):
    """`load_model(ckpt, device=placement)`; weights that fit nowhere go to a temporary offload folder that
    lives as long as the model (when the placement names none)."""
    if placement.offload_folder:
        return load_model(ckpt, device=placement)
    folder = tempfile.TemporaryDirectory(prefix="forgetlab-offload-")
    model = load_model(ckpt, device=replace(placement, offload_folder=folder.name))
    weakref.finalize(model, folder.cleanup)
    return model
