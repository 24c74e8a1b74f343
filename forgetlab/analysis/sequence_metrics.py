"""The continual-learning metrics of a task sequence, from its score matrix (docs/methods.md#sequence-metrics).

R is a (T + 1) × T matrix: R[i, j] is the score of task j after stage i, stage 0 being the base (before any
training) and stage i the model after training on the i-th task of the order. Every metric is a function of R
alone:

- OP (TRACE's overall performance): the mean of the last row, (1/T)·Σ_j R[T, j];
- BWT as TRACE defines it: (1/T)·Σ_{j=1..T} (R[T, j] − R[j, j]) (the j = T term is 0);
- BWT as GEM defines it: (1/(T − 1))·Σ_{j=1..T−1} (R[T, j] − R[j, j]) = T/(T − 1) × TRACE's;
- FWT (GEM's, against the base): (1/(T − 1))·Σ_{j=2..T} (R[j − 1, j] − R[0, j]);
- forgetting of task j < T (Chaudhry et al. 2018): max over stages i = 1…T−1 of R[i, j] − R[T, j], for a
  score where higher is better (for a loss, R[T, j] − R[i, j]: positive means the task got worse); the last task
  has no later stage to forget in and gets NaN.

OP, BWT and FWT are the definitions as written for either score: for exact match a negative BWT is forgetting, for
answer loss a positive one is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from forgetlab.core.errors import ParameterError


def score_matrix(rows: Sequence[Sequence[float]]) -> np.ndarray:
    """R as a float array of shape (T + 1, T), checked: at least two tasks, one row for the base and one per
    stage."""
    r = np.asarray(rows, dtype=float)
    if r.ndim != 2 or r.shape[1] < 2 or r.shape[0] != r.shape[1] + 1:
        raise ParameterError(f"A sequence's score matrix has one row for the base and one per stage, and a column "
                             f"per task (T + 1 rows, T ≥ 2 columns); got shape {r.shape}.")
    return r


def overall_performance(r: np.ndarray) -> float:
    """TRACE's OP: the mean score over the T tasks after the last stage, (1/T)·Σ_j R[T, j]."""
    r = score_matrix(r)
    return float(r[-1].mean())


def backward_transfer_trace(r: np.ndarray) -> float:
    """TRACE's BWT: (1/T)·Σ_{j=1..T} (R[T, j] − R[j, j]) — the mean over all T tasks, the last one adding 0."""
    r = score_matrix(r)
    t = r.shape[1]
    return float(sum(r[t, j] - r[j + 1, j] for j in range(t)) / t)


def backward_transfer_gem(r: np.ndarray) -> float:
    """GEM's BWT: (1/(T − 1))·Σ_{j=1..T−1} (R[T, j] − R[j, j]) — the mean over the tasks that have a later
    stage."""
    r = score_matrix(r)
    t = r.shape[1]
    return float(sum(r[t, j] - r[j + 1, j] for j in range(t - 1)) / (t - 1))


def forward_transfer(r: np.ndarray) -> float:
    """GEM's FWT against the base: (1/(T − 1))·Σ_{j=2..T} (R[j − 1, j] − R[0, j]) — how much the stages before a
    task moved its score before it was trained on."""
    r = score_matrix(r)
    t = r.shape[1]
    return float(sum(r[j, j] - r[0, j] for j in range(1, t)) / (t - 1))


def forgetting(r: np.ndarray, higher_is_better: bool = True) -> list[float]:
    """Per task j: max over stages i = 1…T−1 of s·(R[i, j] − R[T, j]) with s = +1 for a score where higher is
    better and −1 for a loss, so that a positive value is the largest drop the task suffered by the end; NaN for
    the last task."""
    r = score_matrix(r)
    t = r.shape[1]
    sign = 1.0 if higher_is_better else -1.0
    out = []
    for j in range(t):
        if j == t - 1:
            out.append(math.nan)
            continue
        out.append(float(max(sign * (r[i, j] - r[t, j]) for i in range(1, t))))
    return out


@dataclass(frozen=True)
class SequenceMetrics:
    """OP, both BWTs, FWT and per-task forgetting of one score matrix."""

    op: float
    bwt_trace: float
    bwt_gem: float
    fwt: float
    forgetting: tuple[float, ...]


def sequence_metrics(r: np.ndarray, higher_is_better: bool = True) -> SequenceMetrics:
    """Every metric of the module docstring for one score matrix."""
    r = score_matrix(r)
    return SequenceMetrics(op=overall_performance(r), bwt_trace=backward_transfer_trace(r),
                           bwt_gem=backward_transfer_gem(r), fwt=forward_transfer(r),
                           forgetting=tuple(forgetting(r, higher_is_better)))
