"""Shared CLI flags for commands whose points can run on Ray: `--executor local|ray [--ray-address ADDR]
[--workers N] [--gpus-per-worker G]` (see `forgetlab.executors`)."""
from __future__ import annotations


def add_executor_arguments(p) -> None:
    """Add the executor flags to an argparse parser."""
    g = p.add_argument_group("where the points run")
    g.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: one after another in this process (default); ray: on Ray actors, each keeping "
                        "the base and task vectors resident")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="an existing Ray cluster (auto, host:port or ray://host:port); default: start a local "
                        "Ray instance on this machine")
    g.add_argument("--workers", type=int, default=None,
                   help="Ray workers (default: as many as the cluster has room for)")
    g.add_argument("--gpus-per-worker", type=float, default=None, metavar="G",
                   help="GPUs per Ray worker (default 1 when the cluster has GPUs, else 0)")


def executor_from_args(args):
    """The `forgetlab.executors.Executor` the flags ask for (ParameterError for Ray flags without --executor ray)."""
    from forgetlab.executors import make_executor

    return make_executor(args.executor, address=args.ray_address, workers=args.workers,
                         gpus_per_worker=args.gpus_per_worker)


def executor_lines(result_executor: dict, points) -> list[str]:
    """Lines telling where the points ran: executor, workers (host:pid) and notes such as fewer workers."""
    if not result_executor:
        return []
    from forgetlab.executors import worker_label

    who = sorted({worker_label(p.worker) for p in points if p.worker})
    lines = [f"executor {result_executor.get('name')}: {len(who)} worker process(es) "
             f"({', '.join(who[:8])}{' …' if len(who) > 8 else ''}); "
             f"driver {worker_label(result_executor.get('driver') or {})}"]
    lines += [f"note: {n}" for n in result_executor.get("notes") or []]
    return lines


def add_device_map_arguments(p) -> None:
    """Add `--device-map auto|balanced|sequential [--max-memory 0=20GiB,cpu=64GiB]` (models larger than a device)."""
    p.add_argument("--device-map", default=None, choices=["auto", "balanced", "sequential"],
                   help="spread a model that does not fit one device over the GPUs, then CPU, then disk "
                        "(accelerate); overrides --device")
    p.add_argument("--max-memory", default=None, metavar="DEV=SIZE,…",
                   help="memory per device for --device-map, e.g. 0=70GiB,1=70GiB,cpu=200GiB")


def device_from_args(args):
    """`args.device`, or a `forgetlab.core.devicemap.Placement` when --device-map is given."""
    from forgetlab.core.devicemap import Placement, parse_max_memory
    from forgetlab.core.errors import ParameterError

    if getattr(args, "device_map", None):
        return Placement(args.device_map, parse_max_memory(args.max_memory) if args.max_memory else None)
    if getattr(args, "max_memory", None):
        raise ParameterError("--max-memory needs --device-map auto (or balanced / sequential).")
    return args.device


def load_placed(ckpt, placement):
    """`load_model(ckpt, device=placement)`; weights that fit nowhere go to a temporary offload folder that
    lives as long as the model (when the placement names none)."""
    import tempfile
    import weakref
    from dataclasses import replace

    from forgetlab.core.checkpoints import load_model

    if placement.offload_folder:
        return load_model(ckpt, device=placement)
    folder = tempfile.TemporaryDirectory(prefix="forgetlab-offload-")
    model = load_model(ckpt, device=replace(placement, offload_folder=folder.name))
    weakref.finalize(model, folder.cleanup)
    return model
