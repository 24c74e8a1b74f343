"""The continual-learning metrics of a task sequence against hand-computed values (docs/methods.md#sequence-metrics)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from forgetlab.analysis.sequence_metrics import (backward_transfer_gem, backward_transfer_trace, forgetting,
                                                 forward_transfer, overall_performance, score_matrix,
                                                 sequence_metrics)
from forgetlab.core.errors import ParameterError

# rows: the base, then after stages 1, 2, 3; columns: tasks 1, 2, 3
R = np.array([[0.1, 0.2, 0.0],
              [0.9, 0.2, 0.1],
              [0.5, 0.8, 0.1],
              [0.3, 0.6, 0.7]])


def test_overall_performance_is_the_mean_of_the_last_row():
    assert overall_performance(R) == pytest.approx((0.3 + 0.6 + 0.7) / 3)


def test_trace_and_gem_bwt_differ_by_their_denominators():
    # TRACE: (1/T)·Σ_{j=1..T}(R[T,j] − R[j,j]) = ((0.3 − 0.9) + (0.6 − 0.8) + (0.7 − 0.7)) / 3
    assert backward_transfer_trace(R) == pytest.approx(-0.8 / 3)
    # GEM: (1/(T − 1))·Σ_{j=1..T−1}(R[T,j] − R[j,j]) = ((0.3 − 0.9) + (0.6 − 0.8)) / 2
    assert backward_transfer_gem(R) == pytest.approx(-0.4)
    assert backward_transfer_gem(R) == pytest.approx(backward_transfer_trace(R) * 3 / 2)


def test_fwt_is_against_the_base():
    # ((R[1,2] − R[0,2]) + (R[2,3] − R[0,3])) / 2 = ((0.2 − 0.2) + (0.1 − 0.0)) / 2
    assert forward_transfer(R) == pytest.approx(0.05)


def test_forgetting_is_the_largest_drop_before_the_end():
    f = forgetting(R)
    assert f[0] == pytest.approx(0.6)          # max(0.9 − 0.3, 0.5 − 0.3)
    assert f[1] == pytest.approx(0.2)          # max(0.2 − 0.6, 0.8 − 0.6)
    assert math.isnan(f[2])                    # the last task has no later stage


def test_forgetting_of_a_loss_counts_a_rise_as_forgetting():
    f = forgetting(R, higher_is_better=False)
    assert f[0] == pytest.approx(-0.2)         # max(0.3 − 0.9, 0.3 − 0.5): the loss only fell
    assert f[1] == pytest.approx(0.4)          # max(0.6 − 0.2, 0.6 − 0.8)


def test_a_sequence_without_change_has_zero_transfer():
    flat = np.full((4, 3), 0.5)
    m = sequence_metrics(flat)
    assert (m.op, m.bwt_trace, m.bwt_gem, m.fwt) == (0.5, 0.0, 0.0, 0.0)
    assert m.forgetting[:2] == (0.0, 0.0)


@pytest.mark.parametrize("shape", [(3, 3), (2, 1), (4,)])
def test_a_matrix_of_the_wrong_shape_is_refused(shape):
    with pytest.raises(ParameterError, match="T \\+ 1 rows"):
        score_matrix(np.zeros(shape))
