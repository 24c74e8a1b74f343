"""`forgetlab ...`: every job the app runs, headless.

Each area adds a module to `forgetlab/commands/` with `register(subparsers)`; its parsers set `func`.
A ForgetlabError ends the command with exit status 2 and its message on stderr.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys

import forgetlab.commands
from forgetlab import __version__
from forgetlab.errors import ForgetlabError


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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    previous = _terminate_like_interrupt()
    try:
        return int(args.func(args) or 0)
    except ForgetlabError as exc:
        sys.stderr.write(f"forgetlab: error: {exc}\n")
        return 2
    except _Terminated:
        sys.stderr.write("forgetlab: terminated; nothing half-written was kept.\n")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        sys.stderr.write("forgetlab: interrupted; nothing half-written was kept.\n")
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that every `finally`/cleanup runs as for Ctrl-C."""


def _terminate_like_interrupt():
    """Make SIGTERM unwind like Ctrl-C (temporary outputs are removed); returns the previous handler, or None
    when not on the main thread (signals can only be set there)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def raise_terminated(signum, frame):
        raise _Terminated()

    return signal.signal(signal.SIGTERM, raise_terminated)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
