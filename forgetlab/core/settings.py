"""Typed settings whose every field — type, default, range or choices, help — is declared once, with `setting`.

A job's settings are a dataclass; each field is declared with `setting(default, help=…, range=…, …)`. From that
one declaration the CLI builds the field's argument (`forgetlab.commands.generated`), the app builds its widget
(`forgetlab.ui.widgets`), and `check_values` refuses a value out of range by name, so a default, a bound or a
help text is never written twice.

    @dataclass
    class LinearitySettings:
        task: Optional[str] = setting(None, help="task whose probe samples are used", required=True)
        samples: int = setting(30, help="probe samples per task", range=(1, None))
        alphas: tuple[float, ...] = setting(DEFAULT_ALPHAS, help="α grid", range=(0.0, 1.0))

Types the declarations understand: bool, int, float, str, sequences of them (tuple[float, ...], list[str]) and
sequences of number tuples (tuple[tuple[float, ...], ...]), each possibly Optional. Sequences of numbers are
written comma-separated on the command line ("0,0.5,1"); sequences of words as several arguments (`--levels model
layer`); number tuples as several comma-separated groups (`--grid 0.1,0.2,0.3 0.5,0.5,0.5`), one per line in the app.
"""
from __future__ import annotations

import math
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Mapping, Optional, Sequence

from forgetlab.core.errors import ParameterError

SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class Setting:
    """What one settings field declares besides its type and default.

    help: one line saying what the value means (the CLI's help, the widget's tooltip).
    range: inclusive (low, high) bounds for numbers (None: unbounded on that side); each element of a sequence.
    choices: the values a word (or each word of a sequence) may take.
    flag: the CLI option (default `--` + the name with '-' for '_'); positional: a positional CLI argument.
    required: the CLI asks for it (its default, None, means "not given").
    cli: False keeps the field off the command line (set by the app or another field).
    old_flags: earlier spellings of the option, still accepted for one release with a note naming `flag`.
    label: the widget's label in the app (default: the name with spaces).
    metavar: the CLI's placeholder for the value.
    exclusive: the name of a group of options of which the CLI takes at most one (`--text` or `--split`).
    may_be_empty: a sequence may hold no value (the CLI then takes the flag alone: `--tasks`).
    cli_choices: False for a word (or words) whose CLI option lists no choices: any word is taken there and the
    settings' check refuses one outside `choices` (options that never listed their choices keep their form).
    cli_type: the name of the CLI's reader of the value, where the declared type alone does not say it: the
    name a whole number's messages use ("seed"; "number": one ≥ 0, as `forgetlab.cli` names --warmup), or a
    reader `forgetlab.commands.args.READERS` holds under that name ("rank": a LoRA rank; "names":
    comma-separated names in one argument).
    """

    help: str
    range: Optional[tuple[Optional[float], Optional[float]]] = None
    choices: Optional[tuple] = None
    flag: Optional[str] = None
    positional: bool = False
    required: bool = False
    cli: bool = True
    old_flags: tuple[str, ...] = ()
    label: Optional[str] = None
    metavar: Optional[str] = None
    exclusive: Optional[str] = None
    may_be_empty: bool = False
    cli_choices: bool = True
    cli_type: Optional[str] = None


def setting(default: Any = None, *, help: str, range: Optional[tuple] = None, choices: Optional[Sequence] = None,
            flag: Optional[str] = None, positional: bool = False, required: bool = False, cli: bool = True,
            old_flags: Sequence[str] = (), label: Optional[str] = None, metavar: Optional[str] = None,
            exclusive: Optional[str] = None, may_be_empty: bool = False, cli_choices: bool = True,
            cli_type: Optional[str] = None) -> Any:
    """A dataclass field declared once: its default and everything `Setting` lists (see the module docstring).
    A list default is copied per instance."""
    meta = {"setting": Setting(help=help, range=tuple(range) if range is not None else None,
                               choices=tuple(choices) if choices is not None else None, flag=flag,
                               positional=positional, required=required, cli=cli, old_flags=tuple(old_flags),
                               label=label, metavar=metavar, exclusive=exclusive, may_be_empty=may_be_empty,
                               cli_choices=cli_choices, cli_type=cli_type)}
    if isinstance(default, (list, dict, set)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class FieldInfo:
    """A settings field as the CLI and the app read it: name, declared `Setting`, default, and its type as
    (base, is_sequence, optional, nested) — e.g. (float, True, False, False) for tuple[float, ...] and
    (float, True, False, True) for tuple[tuple[float, ...], ...] (a sequence of number tuples)."""

    name: str
    spec: Setting
    default: Any
    base: type
    sequence: bool
    optional: bool
    nested: bool = False

    @property
    def flag(self) -> str:
        """The CLI option of the field."""
        return self.spec.flag or "--" + self.name.replace("_", "-")

    @property
    def negative(self) -> bool:
        """A setting on by default that the CLI switches off with a `--no-…` flag (`lens` ← `--no-lens`)."""
        return self.base is bool and bool(self.default) and self.flag.startswith("--no-")

    @property
    def dest(self) -> str:
        """Where argparse stores the field's value: its name, or for a `negative` one the flag's words
        (`no_lens`, True when the flag is given)."""
        return self.flag[2:].replace("-", "_") if self.negative else self.name

    @property
    def label(self) -> str:
        """The widget label of the field."""
        return self.spec.label or self.name.replace("_", " ")


def _is_sequence(origin: Any) -> bool:
    return origin in (tuple, list, Sequence, typing.Sequence) or \
        str(origin) == "<class 'collections.abc.Sequence'>"


def _resolve(tp: Any) -> tuple[type, bool, bool, bool]:
    optional = False
    origin = typing.get_origin(tp)
    if origin is typing.Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        if len(args) != 1:
            raise TypeError(f"a setting's type must be one type, optionally None; got {tp}")
        tp = args[0]
        origin = typing.get_origin(tp)
    if tp in SCALARS:
        return tp, False, optional, False
    if _is_sequence(origin):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(args) == 1 and args[0] in SCALARS:
            return args[0], True, optional, False
        if len(args) == 1 and _is_sequence(typing.get_origin(args[0])):
            inner = [a for a in typing.get_args(args[0]) if a is not Ellipsis]
            if len(inner) == 1 and inner[0] in (int, float):
                return inner[0], True, optional, True
    raise TypeError(f"a setting's type must be bool, int, float, str, a sequence of one of them or a sequence of "
                    f"number tuples; got {tp}")


def settings_fields(cls: type) -> list[FieldInfo]:
    """The declared fields of a settings dataclass, in order (fields without `setting` are left out)."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        spec = f.metadata.get("setting")
        if spec is None:
            continue
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else None)
        base, sequence, optional, nested = _resolve(hints[f.name])
        out.append(FieldInfo(f.name, spec, default, base, sequence, optional or default is None, nested))
    return out


def _bounded(info: FieldInfo, value: Any) -> Any:
    what = info.name
    if info.base is bool:
        if not isinstance(value, bool):
            raise ParameterError(f"{what} must be true or false; got {value!r}.")
        return value
    if info.base in (int, float):
        if isinstance(value, bool):
            raise ParameterError(f"{what} must be a number; got {value!r}.")
        try:
            if info.base is int and isinstance(value, int):
                v = value               # exact, also beyond float's 53 bits (a seed up to 2**63 − 1)
            else:
                v = int(value) if info.base is int else float(value)
                if info.base is int and float(value) != v:
                    raise ValueError
        except (TypeError, ValueError, OverflowError):
            kind = "a whole number" if info.base is int else "a number"
            raise ParameterError(f"{what} must be {kind}; got {value!r}.") from None
        if info.base is float and not math.isfinite(v):
            raise ParameterError(f"{what} must be a finite number; got {value!r}.")
        lo, hi = info.spec.range or (None, None)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            bounds = (f"at least {lo:g}" if hi is None else f"at most {hi:g}" if lo is None
                      else f"in [{lo:g}, {hi:g}]")
            raise ParameterError(f"{what} must be {bounds}; got {v:g}. {info.spec.help}")
        return v
    v = str(value)
    if info.spec.choices is not None and v not in info.spec.choices:
        raise ParameterError(f"{value!r} is not one of the {info.label} forgetlab knows; choose from "
                             f"{', '.join(map(str, info.spec.choices))}.")
    return v


def _listed(info: FieldInfo, value: Any, empty: bool) -> Sequence:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ParameterError(f"{info.name} must be a list; got {value!r}.")
    if not value and not empty:
        raise ParameterError(f"{info.name} is empty; give at least one value. {info.spec.help}")
    return value


def checked_value(info: FieldInfo, value: Any) -> Any:
    """`value` of field `info` coerced to its declared type and checked against its range or choices (each
    element of a sequence, each number of a tuple); None passes where the field may be None. ParameterError
    names the field."""
    if value is None:
        if info.optional:
            return None
        raise ParameterError(f"{info.name} needs a value. {info.spec.help}")
    if not info.sequence:
        return _bounded(info, value)
    value = _listed(info, value, info.spec.may_be_empty)
    if info.nested:
        return tuple(tuple(_bounded(info, v) for v in _listed(info, group, False)) for group in value)
    return tuple(_bounded(info, v) for v in value)


def check_values(settings: Any) -> Any:
    """Check every declared field of a settings instance (`checked_value`); returns the instance."""
    for info in settings_fields(type(settings)):
        checked_value(info, getattr(settings, info.name))
    return settings


def settings_from(cls: type, values: Mapping[str, Any]) -> Any:
    """`cls(**values)` with names that are not fields of `cls` refused by name."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParameterError(f"{cls.__name__} has no setting {', '.join(map(repr, unknown))}; its settings are "
                             f"{', '.join(sorted(known))}.")
    return cls(**values)


# ---------------------------------------------------------------------------------------- fields many jobs share

DTYPE_CHOICES = ("float32", "bfloat16", "float16")


def device_field(*, default_cuda: bool = False) -> Any:
    """`device`: where the job runs ("cpu", "cuda", "cuda:1"; None: the job's default, which `default_cuda`
    says — cuda when available, else the CPU)."""
    return setting(None, help="cpu or cuda (default: " + ("cuda when available)" if default_cuda else "cpu)"),
                   metavar="DEVICE")


def dtype_field(what: str = "the models") -> Any:
    """`dtype`: the precision `what` runs in (None: bfloat16 on cuda, float32 on the CPU)."""
    return setting(None, help=f"precision of {what} (default: bfloat16 on cuda, float32 on cpu); scores are "
                              "reduced in float32 either way", choices=DTYPE_CHOICES)


def count_field(default: Optional[int], help: str, **options: Any) -> Any:
    """A count ≥ 1 (`samples`, `batch_size`, `max_general`…); None where the default means "all"."""
    return setting(default, help=help, range=(1, None), **options)


TORCH_SEED_MAX = 2**63 - 1     # torch.manual_seed / torch.Generator, and a recipe's seed (merge.recipes.check_seed)


def bound_text(maximum: int) -> str:
    """`maximum` written as 2**b − k when it lies just below a power of two (2**63 − 1, 2**32 − 2)."""
    bits = maximum.bit_length()
    below = (1 << bits) - maximum
    return f"2**{bits} − {below}" if 0 < below <= 16 and bits > 8 else str(maximum)


def seed_field(help: str, *, maximum: int = TORCH_SEED_MAX, default: int = 0, **options: Any) -> Any:
    """`seed`: a whole number from 0 to `maximum`, the range of the generator it seeds; `help` says what it
    seeds."""
    return setting(default, help=f"{help} (a whole number from 0 to {bound_text(maximum)})", range=(0, maximum),
                   cli_type="seed", **options)
