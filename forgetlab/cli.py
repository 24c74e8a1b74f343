"""`forgetlab ...`: every job the app runs, headless.

Each area adds a module to `forgetlab/commands/` with `register(subparsers)`; its parsers set `func`. Arguments
that several commands share are declared once, in `forgetlab/commands/args.py`.
A ForgetlabError ends the command with exit status 2 and its message on stderr.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
import sys
import threading

import torch

import forgetlab.commands
from forgetlab import __version__
from forgetlab.commands.args import OUTPUT_FILES, OUTPUT_FOLDERS, add_overwrite, finite_number, whole_number
from forgetlab.core.checkpoints import check_device
from forgetlab.core.errors import ForgetlabError, ParameterError
from forgetlab.core.memory import recording
from forgetlab.core.outputs import check_output_file, check_output_folder, named_inputs
from forgetlab.core.threads import governed_threads


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command module's subcommands."""
    parser = argparse.ArgumentParser(
        prog="forgetlab",
        description="Study catastrophic forgetting and model merging: inspect checkpoints, task vectors, "
                    "evaluations, merges, linearity, sweeps and fine-tunes.",
    )
    parser.add_argument("--version", action="version", version=f"forgetlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(forgetlab.commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "io":
            continue
        module = importlib.import_module(f"forgetlab.commands.{info.name}")
        if hasattr(module, "register"):
            module.register(sub)
    _check_arguments(parser)
    return parser


# Arguments that share one meaning in every command, so one check serves all of them (OUTPUT_FILES: the dests
# of output file options, from forgetlab.commands.args).
COUNTS = {"batch_size", "max_general", "max_task", "max_train", "samples", "steps", "budget", "eval_every",
          "workers", "max_points", "limit"}
NON_NEGATIVE = {"warmup"}


def _device(text: str) -> str:
    try:
        return check_device(text)
    except ParameterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    """Give every command the same checks for counts (≥ 1), other whole numbers (within 64 bits), decimal numbers
    (finite), devices (usable here) and output files (`--overwrite` to replace one): argparse then exits 2 with
    a one-line message naming the argument (forgetlab.commands.args.whole_number, finite_number)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _check_arguments(sub)
        elif action.dest in COUNTS and action.type is int:
            action.type = whole_number(1, name="count")
        elif action.dest in NON_NEGATIVE and action.type is int:
            action.type = whole_number(0, name="number")
        elif action.type is int:
            action.type = whole_number()
        elif action.type is float:
            action.type = finite_number
        elif action.dest == "device":
            action.type = _device
    dests = {a.dest for a in parser._actions}
    if dests & {*OUTPUT_FILES, *OUTPUT_FOLDERS} and "overwrite" not in dests:
        add_overwrite(parser)


def _check_output_files(args) -> None:
    """Refuse, before any work, an output file that exists (without --overwrite), is a folder, lies in a
    folder that does not exist, or is one of the command's inputs (the pool, the recipe, a probe file, a file
    of a model folder: forgetlab.core.outputs.named_inputs)."""
    inputs = None
    for dest in OUTPUT_FILES:
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            raise ParameterError(f"--{dest} is empty; give a file name such as results.csv, or leave the option out.")
        if isinstance(value, str):
            if inputs is None:
                inputs = named_inputs(v for k, v in vars(args).items()
                                      if k not in {*OUTPUT_FILES, *OUTPUT_FOLDERS} and k != "func")
            check_output_file(value, getattr(args, "overwrite", False), inputs)
    for dest in OUTPUT_FOLDERS:
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            raise ParameterError("--out is empty; give a folder name such as results/, or leave the option out.")
        if isinstance(value, str):
            if inputs is None:
                inputs = named_inputs(v for k, v in vars(args).items()
                                      if k not in {*OUTPUT_FILES, *OUTPUT_FOLDERS} and k != "func")
            check_output_folder(value, inputs)


def _meter_device(args) -> str:
    """The device whose peak a command's run records: its --device, else the machine's default."""
    device = getattr(args, "device", None)
    if isinstance(device, str) and device.startswith("cuda") and torch.cuda.is_available():
        return device
    return "cuda" if device is None and torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    previous = _terminate_like_interrupt()
    try:
        _check_output_files(args)

        device = _meter_device(args)
        # a run saved by the command records its measured peak; torch threads follow the machine's load
        with recording(device), governed_threads(device):
            return int(args.func(args) or 0)
    except ForgetlabError as exc:
        sys.stderr.write(f"forgetlab: error: {exc}\n")
        return 2
    except BrokenPipeError:   # `forgetlab … | head`: the reader left; nothing more to say
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except _Terminated as exc:
        sys.stderr.write(f"forgetlab: terminated; nothing half-written was kept{_kept(exc)}.\n")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt as exc:
        sys.stderr.write(f"forgetlab: interrupted; nothing half-written was kept{_kept(exc)}.\n")
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _kept(exc: BaseException) -> str:
    """What an interrupted command had finished, when the interrupt says so (forgetlab.core.poolsaves)."""
    return f" ({exc})" if str(exc) else ""


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that every `finally`/cleanup runs as for Ctrl-C."""


def _terminate_like_interrupt():
    """Make SIGTERM unwind like Ctrl-C (temporary outputs are removed); returns the previous handler, or None
    when not on the main thread (signals can only be set there)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def raise_terminated(signum, frame):
        raise _Terminated()

    return signal.signal(signal.SIGTERM, raise_terminated)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
