"""The Merge page (AppTest): compose a merge, run it, see the scorecard; reopen and compare saved merges."""
from __future__ import annotations

import pytest
import yaml

from tests.jobs_helper import finish_cleanly, finish_jobs, open_page, running_jobs, start_page


def test_merge_page_runs_evaluates_and_lists_merges(tiny_llama, tmp_path, monkeypatch):
    at = start_page("merge", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert at.title[0].value == "Merge"
    assert any("Compose a merge" in i.value for i in at.info)
    # parameters come from the registry with their defaults
    # keep is one number per model (issue 41: mergekit's per-model density), as della's density
    assert [at.number_input(key=f"merge_ties_keep_{m}").value for m in ("ft0", "ft1")] == [0.2, 0.2]
    assert at.selectbox(key="merge_ties_scope").value == "tensor"
    for m in ("ft0", "ft1"):
        at.number_input(key=f"merge_ties_keep_{m}").set_value(0.5)
    at.text_input(key="merge_name_ties").set_value("first")
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 3
    at.button(key="merge_run").click().run()
    finish_cleanly(at, "merge")
    table = at.dataframe[0].value
    assert list(table["model"]) == ["base", "ft0", "ft1", "first"]
    assert list(table["role"]) == ["base", "parent", "parent", "merge"]
    assert (tmp_path / "merges" / "first" / "recipe.yaml").exists()
    assert (tmp_path / "merges" / "first" / "scorecards.json").exists()
    assert len(at.get("plotly_chart")) == 1
    # the same name again is refused with a message, nothing overwritten
    at.button(key="merge_run").click().run()
    finish_jobs(at, "merge")
    assert any("exists already" in e.value for e in at.error)
    # a second merge with another method, then compare both in a fresh session
    at.selectbox(key="merge_method").set_value("wise_ft").run()
    at.multiselect(key="merge_models").set_value(["ft0"]).run()
    at.number_input(key="merge_wise_ft_alpha").set_value(0.3)
    at.text_input(key="merge_name_wise_ft").set_value("second")
    at.button(key="merge_run").click().run()
    finish_cleanly(at, "merge")
    again = open_page("merge", tiny_llama.pool_yaml)
    again.run()
    assert not again.exception, again.exception
    saved = again.dataframe[0].value
    assert set(saved["name"]) == {"first", "second"}
    again.multiselect(key="merge_compare").set_value(["first", "second"]).run()
    assert not again.exception, again.exception
    compared = again.dataframe[1].value
    assert set(compared["model"]) == {"base", "ft0", "ft1", "first", "second"}


def test_merge_page_shows_bad_parameters_as_errors(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("merge", tiny_llama.pool_yaml)
    at.run()
    at.selectbox(key="merge_method").set_value("hma").run()
    at.text_input(key="merge_hma_alphas").set_value("0.1, 1.5")
    at.multiselect(key="merge_models").set_value(["ft0"]).run()
    at.button(key="merge_run").click().run()
    assert not at.exception, at.exception
    assert any("[0.0, 1.0]" in e.value for e in at.error)
    assert not running_jobs("merge")                 # checked before any job started
    assert not (tmp_path / "merges").exists() or not any((tmp_path / "merges").iterdir())
    # every registered method gets its form (free-text, choice and number parameters)
    at.selectbox(key="merge_method").set_value("slwm").run()
    assert not at.exception, at.exception
    assert at.text_input(key="merge_slwm_tasks").value == ""
    assert at.selectbox(key="merge_slwm_level").value == "attn_mlp"


def test_merge_page_pcb_with_lambda_search(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("merge", tiny_llama.pool_yaml)
    at.run()
    at.selectbox(key="merge_method").set_value("pcb").run()
    at.checkbox(key="merge_pcb_search").check().run()
    at.number_input(key="merge_pcb_budget").set_value(3)
    at.text_input(key="merge_name_pcb").set_value("pcb-searched")
    at.session_state["app_max_general"] = 1
    at.session_state["app_max_task"] = 2
    at.button(key="merge_run").click().run()
    finish_cleanly(at, "merge")
    search = at.dataframe[1].value
    assert len(search) == 3 and {"lam 0", "lam 1", "loss"} <= set(search.columns)     # friendly headers
    import yaml
    recipe = yaml.safe_load((tmp_path / "merges" / "pcb-searched" / "recipe.yaml").read_text())
    assert all("lam" in m for m in recipe["models"])  # the λ found, per model


def test_merge_page_searches_weights_shows_every_point_and_its_worker_and_merges_the_best(tiny_llama, tmp_path,
                                                                                       monkeypatch):
    """The CMA-ES weight search on the page gives the points `forgetlab.analysis.search.search` gives for the same
    recipe and seed, each with the worker (this process, host:pid) that computed it; it is saved to Runs; 'merge the
    best' writes the best recipe into merges/ and scores it; 'use the best' puts it into the form."""
    import json
    import os
    import socket

    import yaml

    from forgetlab.analysis.search import search
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.workflow import pool_recipe

    at = start_page("merge", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert at.number_input(key="merge_search_budget").value == 30        # the CLI's default (~15 s on pico)
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 3
    at.number_input(key="merge_search_budget").set_value(4)
    at.button(key="merge_search_run").click().run()
    finish_cleanly(at, "merge_search")
    table = at.dataframe[0].value
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    recipe = pool_recipe(pool, "ties", ["ft0", "ft1"], {"keep": 0.2, "scope": "tensor", "lam": 1.0,
                                                        "weights": [1.0, 1.0], "normalize": True,
                                                        "rescale": False})
    direct = search(recipe, pool, budget=4, max_general=2, max_task=3, measure=at.session_state["app_measure"])
    assert len(table) == 4
    assert list(table["speciality"]) == [p.speciality for p in direct.points]
    assert list(table["general loss ↓"]) == [p.general_loss for p in direct.points]
    assert list(table["weights:ft0"]) == [p.values[0] for p in direct.points]
    assert list(table["worker"]) == [f"{socket.gethostname()}:{os.getpid()}"] * 4
    assert not {"worker host", "worker pid"} & set(table.columns)        # one column, host:pid
    runs = [p for p in (tmp_path / "runs").iterdir() if p.name.endswith(tuple("0123456789abcdef")) and
            "search" in p.name]
    assert len(runs) == 1 and json.loads((runs[0] / "recipe.json").read_text())["kind"] == "search"
    assert len(at.get("plotly_chart")) == 1                               # the search's trade-off chart
    best = direct.best_recipe
    at.button(key="merge_search_merge_best").click().run()
    finish_cleanly(at, "merge")
    assert not at.warning, [w.value for w in at.warning]
    merged = [p for p in (tmp_path / "merges").iterdir() if p.name.startswith("ties-search-best-")]
    assert len(merged) == 1
    assert (merged[0] / "scorecards.json").exists() and list(merged[0].glob("*.safetensors"))
    written = yaml.safe_load((merged[0] / "recipe.yaml").read_text())
    assert [m["weight"] for m in written["models"]] == [m["weight"] for m in best["models"]]
    from forgetlab.merge.recipes import Recipe                             # keep: the form's per model (issue 41)
    assert Recipe.from_dict(written).validated_params() == Recipe.from_dict(best).validated_params()
    assert at.dataframe[0].value["model"].iloc[-1] == merged[0].name        # its scorecard, above the search
    at.number_input(key="merge_ties_keep_ft0").set_value(0.5).run()
    at.button(key="merge_search_use").click().run()
    assert not at.exception, at.exception
    assert at.number_input(key="merge_ties_keep_ft0").value == 0.2         # the searched recipe's, again
    assert at.number_input(key="merge_ties_weights_ft1").value == best["models"][1]["weight"]


def test_merge_page_search_refuses_a_budget_of_zero_and_keeps_working(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("merge", tiny_llama.pool_yaml)
    at.run()
    # issue 42: the budget's declared range (forgetlab.analysis.search.SearchSettings) is the widget's, so 0
    # cannot be entered; the check the button runs before any job starts refuses it too
    from forgetlab.analysis.search import ANALYSIS, SearchSettings
    from forgetlab.core.errors import ParameterError

    assert at.number_input(key="merge_search_budget").min == 1
    with pytest.raises(ParameterError, match="budget must be at least 1; got 0"):
        ANALYSIS.check(SearchSettings(recipe="recipe.yaml", budget=0))
    assert not running_jobs("merge_search")                               # nothing started
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    at.session_state["app_max_general"] = 1                 # then a good budget runs
    at.session_state["app_max_task"] = 2
    at.number_input(key="merge_search_budget").set_value(2)
    at.button(key="merge_search_run").click().run()
    finish_cleanly(at, "merge_search")
    assert len(at.dataframe[0].value) == 2


def test_merge_page_search_needs_a_method_with_per_model_weights(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("merge", tiny_llama.pool_yaml)
    at.run()
    assert not at.button(key="merge_search_run").disabled                 # TIES: per-model weights
    at.selectbox(key="merge_method").set_value("wise_ft").run()
    assert not at.exception, at.exception
    assert at.button(key="merge_search_run").disabled                     # WiSE-FT: one α, nothing per model
    assert any("wise_ft has no per-model weight" in (b.help or "") for b in at.button
               if b.key == "merge_search_run")


def test_merge_page_is_all_or_nothing_like_the_cli(tiny_llama, tmp_path, monkeypatch):
    """The page merges through merge_and_evaluate (the CLI's `merge --eval` path): when the evaluation fails, no
    merge folder is left under merges/ and the page shows the message."""
    from forgetlab.core.errors import ProbeDataError
    from forgetlab.merge import workflow

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    calls = []

    def failing_evaluate(*a, **k):
        calls.append(k.get("name"))
        raise ProbeDataError("the probe data went away during the evaluation")

    monkeypatch.setattr(workflow, "evaluate", failing_evaluate)
    at = open_page("merge", tiny_llama.pool_yaml)
    at.run()
    at.text_input(key="merge_name_ties").set_value("half")
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 2
    at.button(key="merge_run").click().run()
    finish_jobs(at, "merge")
    assert not at.exception, at.exception
    assert calls, "the page did not evaluate through merge.workflow"
    assert any("probe data went away" in e.value for e in at.error)
    assert not (tmp_path / "merges" / "half").exists()
    assert not [p for p in (tmp_path / "merges").iterdir()] if (tmp_path / "merges").exists() else True


NEW_MERGEKIT = ("slerp", "nuslerp", "multislerp", "karcher", "model_stock", "arcee_fusion", "nearswap", "ram",
                "ramplus_tl", "sce", "della", "della_linear", "breadcrumbs_ties")


def test_merge_page_offers_and_runs_each_new_mergekit_method(tiny_llama, tmp_path, monkeypatch):
    """Issue 25: each of mergekit's new methods shows every parameter of the registry with its default and merges
    from the page (models: one for the two-model methods, both fine-tunes otherwise)."""
    import yaml

    from forgetlab.merge import METHODS

    at = start_page("merge", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    at.session_state["app_max_general"], at.session_state["app_max_task"] = 1, 1      # the sidebar's budget
    at.run()
    for method in NEW_MERGEKIT:
        spec = METHODS[method]
        models = ["ft0"] if spec.max_models == 1 else ["ft0", "ft1"]
        at.selectbox(key="merge_method").set_value(method).run()
        at.multiselect(key="merge_models").set_value(models).run()
        assert not at.exception, (method, at.exception)
        for p in spec.params:
            key = f"merge_{method}_{p.name}"
            if p.per_model:
                assert [at.number_input(key=f"{key}_{m}").value for m in models] == [p.default] * len(models)
            elif p.type == "bool":
                assert at.checkbox(key=key).value == p.default, key
            elif p.type == "str" and p.choices:
                assert at.selectbox(key=key).value == p.default, key
            else:
                assert at.number_input(key=key).value == p.default, key
        at.text_input(key=f"merge_name_{method}").set_value(f"page-{method}")
        at.button(key="merge_run").click().run()
        finish_cleanly(at, "merge")
        assert not at.error, (method, [e.value for e in at.error])
        recipe = yaml.safe_load((tmp_path / "merges" / f"page-{method}" / "recipe.yaml").read_text())
        assert recipe["method"] == method and len(recipe["models"]) == len(models)


def _named_pool(tiny_llama, root):
    """The tiny pool with models named after their tasks (math, copy) and a LoRA adapter (lora-math)."""
    import yaml

    from tests.test_checkpoints import _make_lora

    _make_lora(tiny_llama.base, root / "lora")
    spec = yaml.safe_load(tiny_llama.pool_yaml.read_text())
    spec["base"] = str(tiny_llama.base)
    spec["models"] = {"math": str(tiny_llama.finetuned["ft0"]), "lora-math": {"adapter": str(root / "lora")},
                      "copy": str(tiny_llama.finetuned["ft1"])}
    spec["probes"]["general"] = str(tiny_llama.root / spec["probes"]["general"])
    for files in spec["probes"]["tasks"].values():
        for split, path in files.items():
            files[split] = str(tiny_llama.root / path)
    (root / "pool.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return root / "pool.yaml"


def test_merge_page_default_merges_the_full_fine_tunes_three_ways_and_judges_own_task_retention(
        tiny_llama, tmp_path, monkeypatch):
    """The default: the full fine-tunes (not the adapter), weight average beside TIES and task arithmetic, one
    click; each merge saved with its scorecards at the app's budget; the chart and table show, per parent, the
    share of its own-task gain each merge kept (analysis.retention), with axes from 0."""
    import json

    from forgetlab.analysis.retention import gain_share
    from forgetlab.core.evaluate import Scorecard

    pool_yaml = _named_pool(tiny_llama, tmp_path / "pool")
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    at = open_page("merge", pool_yaml)
    at.session_state["app_max_general"], at.session_state["app_max_task"] = 2, 3     # the sidebar's budget
    at.run()
    assert not at.exception, at.exception
    assert at.multiselect(key="merge_default_models").value == ["math", "copy"]
    assert at.multiselect(key="merge_default_methods").value == ["linear", "ties", "task_arithmetic"]
    assert at.multiselect(key="merge_models").value == ["math", "copy"]               # the form's default too
    assert [e.label for e in at.expander] == ["How this is computed"]               # nothing else to open first
    at.button(key="merge_default_run").click().run()
    finish_cleanly(at, "merge")
    merges = sorted((tmp_path / "home" / "merges").iterdir())
    # each folder is named as the page names its method ("weight average", not the registry's "linear"); the
    # recipe inside keeps the registry name
    assert [p.name.rsplit("-", 2)[0] for p in merges] == ["task-arithmetic-math-copy", "ties-math-copy",
                                                          "weight-average-math-copy"]
    methods = {p.name: yaml.safe_load((p / "recipe.yaml").read_text())["method"] for p in merges}
    assert sorted(methods.values()) == ["linear", "task_arithmetic", "ties"]
    saved = {methods[p.name]: json.loads((p / "scorecards.json").read_text()) for p in merges}
    assert {(s["max_general"], s["max_task"]) for s in saved.values()} == {(2, 3)}   # the app's one budget
    assert all(s["parents"] == ["math", "copy"] for s in saved.values())
    base_losses = {s["cards"][0]["general_loss"] for s in saved.values()}
    assert len(base_losses) == 1                                                     # one base number, cached
    fig = json.loads(next(c for c in at.get("plotly_chart")).proto.spec)
    assert {t.get("name") for t in fig["data"]} >= {"weight average", "TIES", "task arithmetic"}
    assert fig["layout"]["yaxis"]["rangemode"] == "tozero" and fig["layout"]["yaxis2"]["rangemode"] == "tozero"
    table = next(d.value for d in at.dataframe if "mean kept %" in d.value.columns)
    assert table["model"].tolist() == ["math", "copy", "weight average", "TIES", "task arithmetic"]
    cards = {c["model"]: Scorecard.from_dict(c) for c in saved["ties"]["cards"]}
    ties_name = next(p.name for p in merges if p.name.startswith("ties"))
    measure = at.session_state["app_measure"]
    expected = 100 * gain_share(cards["base"], cards["math"], cards[ties_name], "math", measure)
    if expected == expected:
        assert table.loc[table["model"] == "TIES", "math kept %"].iloc[0] == pytest.approx(expected)
    else:                       # math's parent gained nothing: no share to show, and no column of blanks
        assert "math kept %" not in table.columns
    assert "perplexity change" in table.columns or "forgetting" in table.columns


def test_merge_page_search_shows_its_memory_runs_in_the_sidebar_dtype_and_refuses_what_will_not_fit(
        tiny_llama, tmp_path, monkeypatch):
    at = start_page("merge", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    captions = [c.value for c in at.caption if c.value.startswith("Memory: needs ≈")]
    assert any("float32" in c and "working copy" in c for c in captions)   # the weight search's line
    at.session_state["app_dtype"] = "bfloat16"
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 3
    at.run()
    assert any(c.value.startswith("Memory: needs ≈") and "bfloat16" in c.value for c in at.caption)
    at.number_input(key="merge_search_budget").set_value(2)
    at.button(key="merge_search_run").click().run()
    finish_cleanly(at, "merge_search")
    import json

    run = next((tmp_path / "runs").iterdir())
    assert json.loads((run / "recipe.json").read_text())["dtype"] == "bfloat16"
    import forgetlab.core.memory as memory

    at.session_state["app_dtype"] = "float32"
    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    at.run()
    assert at.button(key="merge_search_run").disabled
    assert any("will not fit" in e.value and "Dtype" in e.value for e in at.error)


def test_merge_page_shows_the_merges_memory_scores_in_the_sidebar_dtype_and_refuses_what_will_not_fit(
        tiny_llama, tmp_path, monkeypatch):
    import json

    at = start_page("merge", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    lines = [c.value for c in at.caption if c.value.startswith("Memory: needs ≈")]
    assert sum("evaluating: weights" in c for c in lines) == 2          # the comparison's line and the form's
    at.session_state["app_dtype"] = "bfloat16"
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 3
    at.run()
    assert all("bfloat16" in c.value for c in at.caption if "evaluating:" in c.value)
    at.text_input(key="merge_name_ties").set_value("in-bf16")
    at.button(key="merge_run").click().run()
    finish_cleanly(at, "merge")
    saved = json.loads((tmp_path / "merges" / "in-bf16" / "scorecards.json").read_text())
    assert saved["dtype"] == "bfloat16" and saved["device"] == "cpu"
    assert saved["memory"]["device"] == "cpu" and saved["memory"]["peak_bytes"] > 0   # measured by the app's job
    import forgetlab.core.memory as memory

    at.session_state["app_dtype"] = "float32"
    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    at.run()
    assert at.button(key="merge_run").disabled and at.button(key="merge_default_run").disabled
    assert sum("will not fit" in e.value and "Dtype" in e.value for e in at.error) >= 2


def test_merge_page_shows_the_notes_of_a_merge_made_from_a_mergekit_recipe(tiny_llama, tmp_path, monkeypatch, capsys):
    """Issue 41: a mergekit parameter that mergekit ignores (sce's weight) is merged as mergekit merges it, with a
    note: the CLI prints it, the merge's recipe.yaml keeps it, and the Merge page's list of merges shows it."""
    import yaml

    from forgetlab.cli import main

    ft0, ft1 = (str(p) for p in tiny_llama.finetuned.values())
    mk = tmp_path / "sce.yaml"
    mk.write_text(yaml.safe_dump({"merge_method": "sce", "base_model": str(tiny_llama.base),
                                  "models": [{"model": ft0, "parameters": {"weight": 1.0}},
                                             {"model": ft1, "parameters": {"weight": 0.4}}]}))
    assert main(["merge", str(mk), str(tmp_path / "merges" / "sce-weights")]) == 0
    note = capsys.readouterr().out.splitlines()[0]
    assert note.startswith("note: mergekit's sce ignores `weight`") and note.endswith("no effect on this merge.")
    at = start_page("merge", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    saved = [d.value for d in at.dataframe if "notes" in d.value.columns]
    assert len(saved) == 1 and list(saved[0]["notes"]) == [note[len("note: "):]]
