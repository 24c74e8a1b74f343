"""Torch threads of CPU jobs follow the machine's load (forgetlab.core.threads.governed_threads)."""
from __future__ import annotations

import threading

import pytest
import torch

from forgetlab.core import threads as ct


def _samples(*others_per_window):
    """A sampler whose successive readings show other processes using the given cores (1 s apart)."""
    state = {"i": 0, "busy": 0.0}
    readings = [ct.CpuSample(0.0, 0.0, 0.0)]
    for k, others in enumerate(others_per_window, start=1):
        state["busy"] += others
        readings.append(ct.CpuSample(state["busy"], 0.0, float(k)))

    def sampler():
        r = readings[min(state["i"], len(readings) - 1)]
        state["i"] += 1
        return r
    return sampler


def test_threads_for_counts_free_cores():
    assert ct.threads_for(2, 1.5, 2) == 1 and ct.threads_for(2, 0.3, 2) == 2 and ct.threads_for(2, 0.6, 2) == 1
    assert ct.threads_for(16, 1.0, 16) == 15 and ct.threads_for(8, 0.0, 16) == 8 and ct.threads_for(4, 9.0, 2) == 1


def test_governed_block_uses_one_thread_beside_a_busy_core_and_restores():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with ct.governed_threads("cpu", sampler=_samples(1.0), cpus=2) as gov:
            assert gov is not None and torch.get_num_threads() == 1
            with ct.governed_threads("cpu", sampler=_samples(0.0), cpus=2) as inner:
                assert inner is None and torch.get_num_threads() == 1     # the outer block decides
        assert torch.get_num_threads() == 2
        with ct.governed_threads("cpu", sampler=_samples(0.1), cpus=2):
            assert torch.get_num_threads() == 2                          # idle machine: torch's count kept
        with ct.governed_threads("cuda:0", sampler=_samples(1.0), cpus=2) as gov:
            assert gov is None and torch.get_num_threads() == 2          # a GPU job is left alone
    finally:
        torch.set_num_threads(previous)


def test_tick_rechooses_inside_a_block_and_is_a_no_op_outside(monkeypatch):
    monkeypatch.setattr(ct, "backward_is_thread_independent", lambda: True)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ct.tick()                                                         # outside a block: nothing happens
        assert torch.get_num_threads() == 2
        with ct.governed_threads("cpu", sampler=_samples(0.0, 1.2), cpus=2) as gov:
            assert torch.get_num_threads() == 2
            gov.interval = 0.0
            ct.tick()                                                     # the others now hold a core
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)


def test_cli_progress_ticks_the_governor(monkeypatch):
    """A CLI command's progress callback lets the block's governor re-check (what keeps a long fine-tune on
    one thread after another process starts)."""
    import io

    from forgetlab.commands.io import tqdm_progress

    monkeypatch.setattr(ct, "backward_is_thread_independent", lambda: True)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with ct.governed_threads("cpu", sampler=_samples(0.0, 1.5), cpus=2) as gov:
            gov.interval = 0.0
            update, close = tqdm_progress("job", stream=io.StringIO())
            update(0.5, "step 1")
            assert torch.get_num_threads() == 1
            close()
    finally:
        torch.set_num_threads(previous)


def test_app_job_runs_governed_in_its_own_thread(monkeypatch):
    """The app's job thread enters the governor itself (torch's thread count is per thread) and its progress
    reports tick it."""
    from forgetlab.ui.jobs import JobRegistry

    seen = {}
    original = ct.governed_threads

    def fake(device=None, wanted=None, **_):
        return original(device, wanted, sampler=_samples(1.0), cpus=2)
    monkeypatch.setattr("forgetlab.ui.jobs.governed_threads", fake)

    def work(progress):
        seen["thread"] = threading.current_thread().name
        seen["threads"] = torch.get_num_threads()
        progress(0.5, "half")
        return 1

    job, started = JobRegistry().start("governed-job", work)
    assert started and job.wait(30) and job.result == 1
    assert seen["thread"].startswith("forgetlab-job-") and seen["threads"] == 1


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "grad"])
def test_backward_probe_runs_in_any_autograd_mode(monkeypatch, mode):
    """The probe's first call often comes from a progress report inside torch.no_grad() (evaluation, linearity)
    or inference_mode(): it must run its backward pass there too, and leave the caller's mode as it was."""
    monkeypatch.setattr(ct, "_PROBE", {})
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "grad": torch.enable_grad}[mode]
    with context():
        before = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        assert isinstance(ct.backward_is_thread_independent(), bool)
        assert (torch.is_grad_enabled(), torch.is_inference_mode_enabled()) == before


def test_first_tick_inside_no_grad_with_the_real_probe(monkeypatch):
    """A governed job whose first progress report comes inside torch.no_grad(), with the real probe (not a stub):
    what `forgetlab eval` and the Linearity page do on every machine with two or more cores."""
    monkeypatch.setattr(ct, "_PROBE", {})
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with ct.governed_threads("cpu", sampler=_samples(0.0, 0.0), cpus=2) as gov, torch.no_grad():
            gov.interval = 0.0
            ct.tick()
            assert "ok" in ct._PROBE and not torch.is_grad_enabled()
    finally:
        torch.set_num_threads(previous)
