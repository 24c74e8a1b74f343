"""Errors that forgetlab raises for bad input: each message says what was wrong and what to do."""
from __future__ import annotations


class ForgetlabError(Exception):
    """Base of every error forgetlab raises on purpose; the CLI exits 2 with its message, the app shows it."""


class CheckpointError(ForgetlabError):
    """A model reference cannot be opened or read (missing path, no weights, corrupt file, unsafe pickle)."""


class OfflineError(CheckpointError):
    """A hub id was named but the hub cannot be reached."""


class IncompatibleModelsError(ForgetlabError):
    """Models that must share an architecture or tensor layout do not (names the tensor and both shapes)."""


class ProbeDataError(ForgetlabError):
    """Probe data is missing, empty or malformed."""


class ParameterError(ForgetlabError):
    """A method or function got a parameter outside its domain, or an unknown name (lists the valid ones)."""


class OutputExistsError(ForgetlabError):
    """An output folder exists already and overwrite was not asked for."""


class WorkspaceError(ForgetlabError):
    """The workspace cannot be written, or something saved in it is unreadable."""


class TrainingError(ForgetlabError):
    """Fine-tuning cannot go on (NaN loss, no training data)."""


class MissingDependencyError(ForgetlabError):
    """An optional package is needed; the message names the pip command."""


def require(condition: bool, error: type[ForgetlabError], message: str) -> None:
    """Raise `error(message)` unless `condition` holds."""
    if not condition:
        raise error(message)


def check_fraction(name: str, value: float) -> float:
    """Return `value` as float if it lies in [0, 1], else raise ParameterError naming `name`."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f"{name} must be a number in [0, 1]; got {value!r}.") from None
    if not (0.0 <= v <= 1.0):
        raise ParameterError(f"{name} must lie in [0, 1]; got {v}. Pass a value between 0 and 1.")
    return v


def parse_floats(text: str, what: str = "the values") -> list[float]:
    """'0, 0.1 0.2' → [0.0, 0.1, 0.2] (commas and/or spaces); ParameterError naming `what` on bad input."""
    try:
        return [float(v) for v in str(text).replace(",", " ").split()]
    except ValueError:
        raise ParameterError(f"Cannot read {what} {text!r} as numbers; write them like 0, 0.5, 1.") from None
