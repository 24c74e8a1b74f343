"""The Runs page: list, reopen, compare and download saved runs (AppTest) and its figure rules."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from forgetlab.core import workspace as ws
from forgetlab.plots import color_for
from forgetlab.ui.runs import compare_frame, figures_from_frame, run_labels, runs_table, sweep_column

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "runs.py")


def _curve(shift: float) -> pd.DataFrame:
    return pd.DataFrame({"alpha": [1.0, 0.0, 0.5], "model": ["math"] * 3,
                         "general_loss": [3.0 + shift, 2.0 + shift, 2.5 + shift], "math_em": [0.9, 0.0, 0.6]})


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    ws.save_run("wise_ft", {"model": "math", "seed": 0}, {"points": 3}, frame=_curve(0.0), run_id="r1-wise")
    ws.save_run("wise_ft", {"model": "math", "seed": 1}, {"points": 3}, frame=_curve(1.0), run_id="r2-wise")
    ws.save_run("linearity", {"level": "module"}, {"n": 4}, run_id="r3-lin",
                frame=pd.DataFrame({"layer": [0, 0, 1, 1], "module": ["attn", "mlp", "attn", "mlp"],
                                    "score": [0.1, 0.2, 0.3, 0.4]}))
    merged = tmp_path / "merges" / "ties-math-code"
    merged.mkdir(parents=True)
    (merged / "recipe.yaml").write_text("method: ties\nparameters: {keep: 0.2, lam: 1.0}\n")
    (merged / "config.json").write_text("{}")
    return tmp_path

# ---------------------------------------------------------------- figure rules (pure)


def test_sweep_table_gives_one_line_chart_per_metric_sorted_along_the_sweep():
    figs = figures_from_frame(_curve(0.0))
    assert sweep_column(_curve(0.0)) == "alpha"
    assert [f.layout.yaxis.title.text for f in figs] == ["general loss (nats) ↓", "math em"]     # words, units
    assert figs[0].layout.title.text == "general loss (nats) ↓ along α"
    trace = figs[0].data[0]
    assert list(trace.x) == [0.0, 0.5, 1.0] and list(trace.y) == [2.0, 2.5, 3.0]
    assert trace.line.color == color_for("math") and trace.name == "math"


def test_layer_by_module_table_gives_a_heatmap():
    frame = pd.DataFrame({"layer": [0, 0, 1, 1], "module": ["attn", "mlp", "attn", "mlp"],
                          "score": [0.1, 0.2, 0.3, 0.4]})
    (fig,) = figures_from_frame(frame)
    heat = fig.data[0]
    assert heat.type == "heatmap" and list(heat.x) == ["attn", "mlp"] and list(heat.y) == ["0", "1"]
    assert [list(r) for r in heat.z] == [[0.1, 0.2], [0.3, 0.4]]


def test_plain_table_gives_labelled_dots_per_metric_on_a_zoomed_axis_and_nothing_for_no_numbers():
    frame = pd.DataFrame({"model": ["base", "math"], "perplexity": [10.0, 12.5]})
    (fig,) = figures_from_frame(frame)
    assert fig.data[0].type == "scatter" and list(fig.data[0].y) == [10.0, 12.5]
    assert list(fig.data[0].text) == ["10", "12.5"]                        # each value written on its dot
    assert list(fig.data[0].marker.color) == [color_for("base"), color_for("math")]
    lo, hi = fig.layout.yaxis.range
    assert 0 < lo < 10.0 and hi > 12.5                 # the values with a margin, not from 0
    assert fig.layout.yaxis.title.text == "perplexity ↓"
    assert figures_from_frame(pd.DataFrame({"model": ["a"]})) == []
    assert figures_from_frame(pd.DataFrame()) == []


def test_comparison_stacks_runs_with_one_line_per_run(home):
    runs = [r for r in ws.list_runs() if r.kind == "wise_ft"]
    frame = compare_frame(runs)
    assert list(frame.columns[:2]) == ["run", "alpha"] and len(frame) == 6
    figs = figures_from_frame(frame)
    assert len(figs) == 2 and len(figs[0].data) == 2
    by_name = {t.name.split(" · ")[0]: list(t.y) for t in figs[0].data}
    assert set(by_name) == set(run_labels(runs)) == {"seed 0", "seed 1"}     # what differs, not a time stamp
    assert by_name["seed 0"] != by_name["seed 1"]
    assert sorted(sum(by_name.values(), [])) == [2.0, 2.5, 3.0, 3.0, 3.5, 4.0]
    table = runs_table(runs)
    assert set(table["id"]) == {"r1-wise", "r2-wise"} and "seed " in table["settings"][0]

# ---------------------------------------------------------------- the page (AppTest)


def test_runs_page_lists_reopens_compares_and_offers_downloads(home):
    at = AppTest.from_file(PAGE).run(timeout=60)
    assert not at.exception and not at.error
    assert at.tabs[0].label == "Runs (3)" and at.tabs[1].label == "Merged models (1)"
    assert set(at.dataframe[0].value["id"]) == {"r1-wise", "r2-wise", "r3-lin"}
    opened = at.multiselect(key="runs_open_all")
    assert len(opened.value) == 1                                # the newest run is open by default
    assert len(at.get("plotly_chart")) >= 1
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Recipe (JSON)" in labels and any(label.startswith("Figure 1") for label in labels)

    opened.set_value(["r1-wise", "r2-wise"]).run(timeout=60)     # compare two runs of one kind
    assert not at.exception
    assert at.subheader[0].value == "Comparing 2 wise_ft runs"
    assert len(at.get("plotly_chart")) == 2
    assert "Compared results (CSV)" in [b.proto.label for b in at.get("download_button")]

    at.multiselect(key="runs_open_all").set_value(["r1-wise", "r3-lin"]).run(timeout=60)
    assert not at.exception and "different kinds" in at.warning[0].value

    at.selectbox(key="runs_kind").set_value("linearity").run(timeout=60)
    assert list(at.dataframe[0].value["id"]) == ["r3-lin"]
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["data"][0]["type"] == "heatmap"                  # the heatmap came back

    assert "method: ties" in at.code[0].value           # merges tab: the recipe, downloadable
    assert "Recipe (YAML)" in [b.proto.label for b in at.get("download_button")]


def test_runs_page_with_empty_workspace_and_unreadable_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = AppTest.from_file(PAGE).run(timeout=60)
    assert not at.exception and "No runs saved yet" in at.info[0].value
    bad = tmp_path / "runs" / "broken"
    bad.mkdir(parents=True)
    (bad / "recipe.json").write_text("{not json")
    (bad / "results.json").write_text("{}")
    ws.save_run("scores", {}, {"a": 1}, frame=pd.DataFrame({"model": ["m"], "loss": [1.0]}), run_id="ok")
    at.run(timeout=60)
    assert not at.exception and at.tabs[0].label == "Runs (1)"   # the broken run is skipped, not fatal
    assert (bad / "recipe.json").exists()                        # and nothing was deleted


def test_saved_sweeps_reopen_with_their_own_charts_and_compare_on_one_tradeoff(tiny_llama, tmp_path, monkeypatch):
    from forgetlab.analysis import sweeps
    from forgetlab.core.pool import ModelPool

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    ids = []
    for model in ("ft0", "ft1"):
        result = sweeps.alpha_curve(pool, model, alphas=[0.0, 1.0], max_general=2, max_task=2)
        ids.append(sweeps.save_sweep(result).name)
    at = AppTest.from_file(PAGE).run(timeout=60)
    assert not at.exception and not at.error
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert "xaxis3" in specs[0]["layout"]                      # the Forgetting page's three-panel curves
    assert {t["name"] for t in specs[1]["data"]} >= {"WiSE-FT"}  # and its trade-off chart
    at.multiselect(key="runs_open_all").set_value(ids).run(timeout=60)
    assert not at.exception and not at.error
    first = json.loads(at.get("plotly_chart")[0].proto.spec)
    series = [t for t in first["data"] if "pareto" not in t["name"].lower()]
    assert len(series) == 2                                    # both sweeps on one trade-off chart
    generic = [json.loads(c.proto.spec) for c in at.get("plotly_chart")][1:]
    names = {t["name"].split(" · ")[0] for fig in generic for t in fig["data"]}
    assert len(names) == 2                                     # and one line per run on the generic charts


def test_a_saved_merge_search_reopens_with_its_chart_and_a_worker_column(tiny_llama, tmp_path, monkeypatch):
    """A search saved by its analysis (the Merge page's, or `forgetlab search`'s) reopens with the Merge page's
    search chart (evaluated points, base, Pareto front, best) and its points with their worker (host:pid)."""
    import os
    import socket

    from forgetlab.analysis.search import ANALYSIS, search
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.workflow import pool_recipe

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    result = search(pool_recipe(pool, "ties", ["ft0", "ft1"]), pool, budget=3, max_general=1, max_task=2)
    ANALYSIS.save(result)
    at = AppTest.from_file(PAGE).run(timeout=60)
    assert not at.exception and not at.error
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    names = {t["name"] for t in spec["data"]}
    assert {"evaluated merges", "base", "best"} <= names
    points = next(t for t in spec["data"] if t["name"] == "evaluated merges")
    assert points["y"] == [p.speciality for p in result.points]
    table = at.dataframe[1].value                               # below the list of runs
    assert list(table["worker"]) == [f"{socket.gethostname()}:{os.getpid()}"] * 3
    assert list(table["speciality"]) == [p.speciality for p in result.points]


def test_scorecards_reopen_in_the_session_measure_and_merges_show_their_scorecard(tmp_path, monkeypatch):
    """What the Models page saves (kind "scorecards") reopens with its chart; the Merged-models tab draws a
    merge's scorecards.json; both follow the session-wide speciality measure."""
    from forgetlab.core.evaluate import Scorecard, TaskScore

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    cards = [Scorecard(n, 3.0 + i, 20.0, 100, {"math": TaskScore("math", 0.1 * i, 2.0 - i, 8)})
             for i, n in enumerate(["base", "math"])]
    ws.save_run("scorecards", {"models": ["base", "math"]}, {"cards": [c.to_dict() for c in cards]},
                frame=pd.concat([c.to_frame() for c in cards]), run_id="r1-cards")
    merged = tmp_path / "merges" / "m1"
    merged.mkdir(parents=True)
    (merged / "recipe.yaml").write_text("method: ties\nparameters: {keep: 0.2, lam: 1.0}\n")
    merge_card = Scorecard("m1", 3.5, 30.0, 100, {"math": TaskScore("math", 0.05, 1.5, 8)})
    (merged / "scorecards.json").write_text(json.dumps({"cards": [c.to_dict() for c in [*cards, merge_card]]}))
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["app_measure"] = "answer_loss"
    at.run()
    assert not at.exception, at.exception
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    run_chart, merge_chart = specs[0], specs[-1]
    assert run_chart["layout"]["yaxis2"]["title"]["text"] == "answer loss (nats) ↓"
    assert [t["y"] for t in run_chart["data"] if t["xaxis"] == "x2"] == [[2.0], [1.0]]
    assert [t["name"] for t in merge_chart["data"] if t["xaxis"] == "x2"] == ["base", "math", "m1 (merge)"]
    assert at.radio(key="runs_measure").value == "answer_loss"
    at.radio(key="runs_measure").set_value("exact_match").run()
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert specs[0]["layout"]["yaxis2"]["title"]["text"] == "exact match ↑"
