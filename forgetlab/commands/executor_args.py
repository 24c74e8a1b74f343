"""What the executor and device-map flags ask for (`forgetlab.commands.args.add_executor` and `add_device_map`
declare them): the executor that runs a command's points, and where a model is placed."""
from __future__ import annotations

import tempfile
import weakref
from dataclasses import replace

from forgetlab.core.checkpoints import load_model
from forgetlab.core.devicemap import Placement, parse_max_memory
from forgetlab.core.errors import ParameterError
from forgetlab.executors import executor_lines, make_executor  # noqa: F401  (executor_lines: the commands' name for it)


def executor_from_args(args):
    """The `forgetlab.executors.Executor` the flags ask for (ParameterError for Ray flags without --executor ray)."""
    return make_executor(args.executor, address=args.ray_address, workers=args.workers,
                         gpus_per_worker=args.gpus_per_worker)


def device_from_args(args):
    """`args.device`, or a `forgetlab.core.devicemap.Placement` when --device-map is given."""
    if getattr(args, "device_map", None):
        return Placement(args.device_map, parse_max_memory(args.max_memory) if args.max_memory else None)
    if getattr(args, "max_memory", None):
        raise ParameterError("--max-memory needs --device-map auto (or balanced / sequential).")
    return args.device


def load_placed(ckpt, placement):
    """`load_model(ckpt, device=placement)`; weights that fit nowhere go to a temporary offload folder that
    lives as long as the model (when the placement names none)."""
    if placement.offload_folder:
        return load_model(ckpt, device=placement)
    folder = tempfile.TemporaryDirectory(prefix="forgetlab-offload-")
    model = load_model(ckpt, device=replace(placement, offload_folder=folder.name))
    weakref.finalize(model, folder.cleanup)
    return model
