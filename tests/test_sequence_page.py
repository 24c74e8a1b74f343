"""The Sequence page: the order and the methods picked, the chains run through the panel, R's heatmaps, the OP–BWT
chart, the metrics table and a saved run."""
from __future__ import annotations

from tests.jobs_helper import finish_cleanly, start_page


def test_sequence_page_runs_the_picked_chains_and_draws_them(tiny_llama, tmp_path, monkeypatch):
    at = start_page("sequence", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert at.title[0].value == "Sequence"
    assert at.multiselect(key="sequence_order").value == ["math", "copy"]
    assert "adamw" in at.multiselect(key="sequence_methods").value
    assert any(c.value.startswith("Memory: needs ≈") for c in at.caption)
    at.multiselect(key="sequence_methods").set_value(["adamw", "ewc"])
    at.checkbox(key="sequence_override").check().run()
    at.number_input(key="sequence_steps").set_value(3)
    at.run()
    assert any("2 fine-tuning chain(s) × 2 stages (math: 3 steps, copy: 3 steps)" in c.value for c in at.caption)
    at.button(key="sequence_run").click().run()
    finish_cleanly(at, "sequence")
    assert len(at.get("plotly_chart")) == 4             # heatmaps, each task over stages, OP–BWT, general loss
    summary = at.dataframe[0].value
    assert list(summary["method"]) == ["adamw", "adamw", "ewc", "ewc"]
    assert "bwt trace" in " ".join(map(str, summary.columns)).lower().replace("_", " ")
    runs = [p.name for p in (tmp_path / "runs").iterdir()]
    assert len(runs) == 1 and "sequence" in runs[0]


def test_sequence_page_wants_two_tasks(tiny_llama, tmp_path, monkeypatch):
    at = start_page("sequence", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    at.multiselect(key="sequence_order").set_value(["copy"]).run()
    assert at.button(key="sequence_run").disabled
    assert any("at least two tasks" in c.value for c in at.caption)
    at.multiselect(key="sequence_order").set_value([]).run()       # nothing picked: still a page, not a traceback
    assert not at.exception and at.button(key="sequence_run").disabled
