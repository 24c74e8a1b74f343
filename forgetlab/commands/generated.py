"""One CLI command per registered analysis, made from its settings (forgetlab.analysis.base.ANALYSES).

Each settings field declared with `forgetlab.core.settings.setting` becomes one argument: its flag, type, default,
range or choices and help come from the declaration, so a default lives in one place (a whole-number field named
`seed` is typed `seed`, as `forgetlab.commands.args.add_seed` types it). Every analysis command also takes the
pool (POOL, or `--pool` for an analysis that reads a recipe first), `--out FILE` (its table as CSV or JSON,
unless one of its outputs is its `--out`) and the analysis' other outputs (a table or a text each),
`--no-save`, `--dry-run` (the memory estimate) and the executor flags. The command checks the settings, stops on
a memory estimate that does not fit, runs with progress on stderr, prints the analysis' report and saves the run
under the workspace's runs/.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from forgetlab.analysis.base import ANALYSES, Analysis, Output
from forgetlab.commands import args as shared
from forgetlab.commands.executor_args import executor_from_args
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress
from forgetlab.core.errors import ParameterError, parse_floats
from forgetlab.core.outputs import check_output_file, write_text_file
from forgetlab.core.pool import ModelPool
from forgetlab.core.settings import FieldInfo, checked_value, settings_fields


class OldFlag(argparse.Action):
    """An earlier spelling of an option: stores the value under the new one and says what replaced it."""

    def __init__(self, option_strings, dest, new_flag: str, store: argparse.Action, **kwargs):
        super().__init__(option_strings, dest, nargs=store.nargs, type=store.type, choices=store.choices,
                         help=argparse.SUPPRESS, metavar=store.metavar)
        self.new_flag, self.store = new_flag, store

    def __call__(self, parser, namespace, values, option_string=None):
        emit(f"note: {option_string} is now {self.new_flag}; the old spelling works in this release only")
        self.store(parser, namespace, values, option_string)


def _convert(info: FieldInfo):
    """The argparse type of one field: the CLI's own number types (forgetlab.commands.args: a count ≥ 1, a whole
    number within 64 bits — named by the field's `cli_type` where it declares one, e.g. a seed —, a finite
    decimal) or the reader its `cli_type` names in `forgetlab.commands.args.READERS`, then the value checked
    against the declaration, so that argparse exits 2 naming the flag. A sequence of number tuples is read one
    comma-separated tuple per argument."""
    lo, hi = info.spec.range or (None, None)
    reader = shared.READERS.get(info.spec.cli_type or "")
    if reader is not None:
        number = reader
    elif info.base is int:
        name = info.spec.cli_type or ("seed" if info.name == "seed" else "count" if lo == 1 and hi is None
                                      else "integer")
        number = shared.whole_number(None if lo is None else int(lo),
                                     shared.INT64_MAX if hi is None else int(hi), name)
    else:
        number = shared.finite_number
    one = replace(info, nested=False)       # the declaration of one tuple of a sequence of tuples

    def parse(text: str) -> Any:
        try:
            if reader is not None:
                return checked_value(info, reader(text))
            if info.sequence and info.base in (int, float):
                return checked_value(one, [int(v) if info.base is int else v
                                           for v in parse_floats(text, info.flag)])
            value = number(text) if info.base in (int, float) else text
            return checked_value(info, value)
        except ParameterError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = (reader.__name__ if reader is not None else
                      ("numbers" if info.sequence else getattr(number, "__name__", "number"))
                      if info.base in (int, float) else "word")
    return parse


def _default_text(info: FieldInfo) -> str:
    if info.default is None or info.base is bool or info.nested:     # a grid of tuples: its help says it
        return ""
    if info.sequence:
        shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in info.default)
    else:
        shown = f"{info.default:g}" if isinstance(info.default, float) else str(info.default)
    return f" (default {shown})"


def add_setting(p, info: FieldInfo) -> None:
    """The argument of one settings field (see the module docstring), on the parser or group `p`. A bool is a
    flag: `--x` sets it, and a setting on by default is switched off by its `--no-x` flag (stored as `no_x`)."""
    spec = info.spec
    help_ = spec.help + _default_text(info)
    if info.base is bool:
        action = p.add_argument(info.flag, dest=info.dest, action="store_true",
                                default=False if info.negative else bool(info.default), help=spec.help)
    elif spec.positional:
        action = p.add_argument(info.name, type=_convert(info), help=help_, metavar=spec.metavar)
    elif info.nested:           # left out: None, and the declared default applies (settings_of)
        action = p.add_argument(info.flag, dest=info.name, nargs="+", type=_convert(info), default=None,
                                required=spec.required, help=help_, metavar=spec.metavar)
    elif info.sequence and info.base is str and spec.cli_type is None:
        action = p.add_argument(info.flag, dest=info.name, nargs="*" if spec.may_be_empty else "+",
                                choices=spec.choices if spec.cli_choices else None,
                                default=list(info.default) if info.default is not None else None,
                                required=spec.required, help=help_, metavar=spec.metavar)
    else:
        choices = spec.choices if info.base is str and spec.cli_choices else None
        action = p.add_argument(info.flag, dest=info.name, type=_convert(info), choices=choices,
                                default=info.default, required=spec.required, help=help_, metavar=spec.metavar)
    for old in spec.old_flags:
        p.add_argument(old, dest=info.dest, action=OldFlag, new_flag=info.flag, store=action)


def build_parser_for(analysis: Analysis, p: argparse.ArgumentParser) -> None:
    """Every argument of an analysis command (module docstring)."""
    if analysis.pool_arg == "positional":
        shared.add_pool(p, help=analysis.pool_help or shared.POOL_HELP)
    groups: dict[str, Any] = {}
    for info in settings_fields(analysis.settings):
        if info.spec.cli:
            group = info.spec.exclusive
            if group is not None and group not in groups:
                groups[group] = p.add_mutually_exclusive_group()
            add_setting(groups[group] if group is not None else p, info)
    if analysis.pool_arg == "option":
        shared.add_pool(p, flag=True, help=analysis.pool_help or "pool.yaml whose models and probe data the "
                                                                 "analysis reads")
    if not _own_out(analysis):
        shared.add_out(p, f"also write the table of {analysis.title} to this CSV or JSON file")
    for out in analysis.outputs:
        if out.folder:
            shared.add_out_folder(p, out.help, flag=out.flag, metavar=out.metavar or "DIR")
        else:
            shared.add_out(p, out.help, flag=out.flag, metavar=out.metavar)
    shared.add_no_save(p)
    shared.add_dry_run(p)
    shared.add_executor(p)
    def run_analysis(args: argparse.Namespace) -> int:
        """`forgetlab <analysis> …`: `run_command` of this analysis."""
        return run_command(analysis, args)

    p.set_defaults(func=run_analysis)


def _own_out(analysis: Analysis) -> bool:
    """Whether one of the analysis' outputs is its `--out` (in the place of the results table)."""
    return any(out.flag == "--out" for out in analysis.outputs)


def folder_files(out: Output, path: str) -> list[tuple[Path, Any]]:
    """The files a folder output writes into `path`, with the function that makes each."""
    return [(Path(path) / name, make) for name, make in out.files]


def write_output(out: Output, result: Any, path: str) -> None:
    """Write one of an analysis' outputs to `path` (checked before the run: cli._check_output_files): its table
    as CSV or JSON, or its text (nothing when the result has none); a folder output's files into the folder
    `path` (made here when it does not exist)."""
    if out.folder:
        Path(path).mkdir(exist_ok=True)
        for file, make in folder_files(out, path):
            made = make(result)
            text = made if isinstance(made, str) else made.to_csv(index=False)
            emit(f"wrote {write_text_file(file, text, overwrite=True)}")
        return
    if out.text is not None:
        text = out.text(result)
        if text is not None:
            emit(f"wrote {write_text_file(path, text, overwrite=True)}")
    else:
        emit_frame(out.table(result), path)
    for beside, table in out.beside_paths(path):
        emit(f"wrote {write_text_file(beside, table(result).to_csv(index=False), overwrite=True)}")


def output_paths(analysis: Analysis, args: argparse.Namespace) -> list[tuple[Output, str]]:
    """The outputs the command line asks for, with their paths."""
    found = []
    for out in analysis.outputs:
        path = getattr(args, out.dest)
        if path is not None:
            found.append((out, path))
    return found


def check_beside(analysis: Analysis, args: argparse.Namespace) -> None:
    """Refuse, before any work, a file an output would write next to its own (`Output.beside`) that exists
    (without --overwrite), is a folder or lies in no folder, and a file a folder output would replace — as
    `forgetlab.cli` checks the named outputs."""
    for out, path in output_paths(analysis, args):
        for beside, _ in out.beside_paths(path):
            check_output_file(beside, getattr(args, "overwrite", False))
        if out.folder and Path(path).is_dir():
            for file, _ in folder_files(out, path):
                check_output_file(file, getattr(args, "overwrite", False))


def settings_of(analysis: Analysis, args: argparse.Namespace) -> Any:
    """The analysis' settings from parsed arguments (fields kept off the command line, and a field that may not be
    None whose argument was left out, take their default)."""
    values = {}
    for info in settings_fields(analysis.settings):
        if info.spec.cli:
            value = getattr(args, info.dest)
            if info.negative:
                value = not value
            if value is None and not info.optional:
                continue
            values[info.name] = tuple(value) if info.sequence and value is not None else value
    return analysis.make_settings(**values)


def run_command(analysis: Analysis, args: argparse.Namespace) -> int:
    """Check, estimate, run, report and save one analysis as the command line asks; returns the exit status."""
    check_beside(analysis, args)
    pool = ModelPool.from_yaml(args.pool)
    settings = settings_of(analysis, args)
    analysis.check(settings, pool)
    estimate = analysis.estimate(pool, settings)
    if estimate is not None and emit_estimate(estimate, args.dry_run):
        return 0
    if estimate is None and args.dry_run:
        emit(f"{analysis.title}: no memory estimate for this job; nothing was run")
        return 0
    executor = executor_from_args(args)
    update, close = tqdm_progress(" ".join(analysis.words))
    try:
        result = analysis.run(pool, settings, update, executor)
    finally:
        close()
    for item in analysis.lines(result, settings):
        if isinstance(item, str):
            emit(item)
        else:
            emit_frame(item)
    for line in analysis.takeaway(result):
        emit(line)
    if not _own_out(analysis) and args.out is not None:
        emit_frame(analysis.frame(result), args.out)
    for out, path in output_paths(analysis, args):
        write_output(out, result, path)
    if not args.no_save:
        emit(f"saved run {analysis.save(result, pool=pool)}")
    return analysis.exit_status(result)


class ListKinds(argparse.Action):
    """`forgetlab GROUP --list`: print the group's kinds (`forgetlab study --list`: every study), one a line, and
    exit 0 before the group's KIND is asked for (as --version does)."""

    def __init__(self, option_strings, dest, kinds: list[str], **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.kinds = kinds

    def __call__(self, parser, namespace, values, option_string=None):
        for kind in self.kinds:
            emit(kind)
        parser.exit(0)


def kinds_of(word: str) -> list[str]:
    """The second CLI words of the analyses under the first word `word`, sorted."""
    return sorted(a.words[1] for _, a in ANALYSES.items() if len(a.words) > 1 and a.words[0] == word)


def register(sub) -> None:
    """Add a command for every registered analysis (grouped under a shared first word, e.g. `sweep alpha`)."""
    groups: dict[str, Any] = {}
    for _, analysis in ANALYSES.items():
        words = analysis.words
        if len(words) == 1:
            p = sub.add_parser(words[0], help=analysis.help, description=analysis.description or analysis.help)
        else:
            if words[0] not in groups:
                group_help = analysis.group_help or f"{words[0]} analyses"
                head = sub.add_parser(words[0], help=group_help, description=group_help)
                head.add_argument("--list", action=ListKinds, kinds=kinds_of(words[0]),
                                  help=f"print the {words[0]} kinds, one a line, and exit")
                groups[words[0]] = head.add_subparsers(dest="kind", metavar="KIND", required=True)
            p = groups[words[0]].add_parser(words[1], help=analysis.help,
                                            description=analysis.description or analysis.help)
        build_parser_for(analysis, p)
