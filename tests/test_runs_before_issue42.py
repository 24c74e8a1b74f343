"""Runs saved before issue 42's redesign (by the code of commit 6ee1be2, on the tiny pico zoo: tests/data/
runs_before_issue42/) still reopen: each through its analysis (`analysis_for_kind(kind).load`), with its charts on
the Runs page, a table and its takeaway."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from forgetlab.analysis.base import analysis_for_kind
from forgetlab.core.workspace import load_run
from forgetlab.ui.runs import run_figures, run_name

OLD = Path(__file__).resolve().parent / "data" / "runs_before_issue42"


@pytest.mark.parametrize("name", sorted(p.name for p in OLD.iterdir()))
def test_a_run_saved_before_the_redesign_reopens(name, tmp_path):
    folder = shutil.copytree(OLD / name, tmp_path / name)
    run = load_run(folder)
    analysis = analysis_for_kind(str(run.kind))
    assert analysis is not None, f"no analysis reopens runs of kind {run.kind}"
    result = analysis.load(folder)
    assert not analysis.frame(result).empty
    drawn = analysis.figures(result)                      # its own charts, not the Runs page's fallback
    assert drawn and all(len(f.data) for f in drawn)
    reopened = run_figures(run)
    assert len(reopened) == len(drawn)
    # reopened without the page's headings, every chart names itself (and the run it comes from, where the
    # analysis did not title it)
    titles = [f.layout.title.text for f in reopened]
    assert all(titles), titles
    assert all(f.layout.title.text.startswith(run_name(run)) for f, d in zip(reopened, drawn)
               if not d.layout.title.text)
    said = analysis.takeaway(result)                      # and what it means, with a number (issue 43)
    assert said and any(c.isdigit() for c in said[0]), said
