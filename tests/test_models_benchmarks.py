"""The Models page's lm-eval section: the button runs the pool's benchmarks on every model in the background,
the table shows lm-eval's own numbers per model × task/metric, the run is saved and shown again on the next
visit; a pool without benchmarks is told how to add them; a bad task is a message. The session-wide measure
offers the benchmark metrics, and the sweep helper runs them at every point."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

pytest.importorskip("lm_eval")

from tests.jobs_helper import finish_cleanly, finish_jobs, open_page
from tests.test_benchmarks import write_task


@pytest.fixture(autouse=True)
def _forget_our_jobs():
    """The job registry is process-wide: the jobs these tests start (the Models page's anatomy job of each pool
    copy, the benchmark jobs) are waited for and dropped, so later page tests see only their own."""
    from forgetlab.ui.jobs import REGISTRY

    before = {j.key for j in REGISTRY.jobs()}
    yield
    for job in REGISTRY.jobs():
        if job.key not in before:
            job.wait(120)
            REGISTRY.forget(job.key)


def _bench_pool(tiny_llama, tmp_path, general=("tiny_cloze",), limit=6):
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    write_task(root / "lm_tasks")
    d = yaml.safe_load((root / "pool.yaml").read_text())
    d["probes"]["benchmarks"] = {"general": list(general), "include": "lm_tasks", "limit": limit}
    (root / "pool.yaml").write_text(yaml.safe_dump(d))
    return root / "pool.yaml"


def _open_with_measure(page: str, pool_yaml, measure: str = "tiny_cloze/acc_norm"):
    """`page` opened on the pool, its "Speciality measured by" set to the benchmark `measure`."""
    at = open_page(page, pool_yaml)
    at.run()
    assert not at.exception, at.exception
    at.selectbox(key=f"{page}_measure").set_value(measure).run()
    return at


def _click_and_finish(at, button: str, prefix: str):
    """Click `button`, wait for the page's job, and check that no exception or error box came of it."""
    at.button(key=button).click().run()
    finish_jobs(at, prefix)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at


def _bench_frames(at):
    return [d.value for d in at.dataframe if "model" in d.value.columns
            and any("/" in str(c) for c in d.value.columns)]


def test_the_button_runs_every_model_saves_the_run_and_the_table_shows_lm_evals_numbers(tiny_llama, tmp_path,
                                                                                         monkeypatch):
    from forgetlab.core.benchmarks import evaluate_benchmarks
    from forgetlab.core.checkpoints import load_model, load_tokenizer

    home = tmp_path / "home"
    monkeypatch.setenv("FORGETLAB_HOME", str(home))
    pool_yaml = _bench_pool(tiny_llama, tmp_path)
    at = open_page("models", pool_yaml, timeout=120)
    at.run()
    assert not at.exception, at.exception
    assert "Benchmarks (lm-evaluation-harness)" in [h.value for h in at.subheader]
    assert at.number_input(key="models_bench_limit").value == 6        # the pool's limit (below the default 20)
    assert any("No benchmark results" in i.value for i in at.info) and not _bench_frames(at)
    at.number_input(key="models_bench_limit").set_value(5)
    at.button(key="models_bench_run").click().run()
    finish_cleanly(at, "models")
    frames = _bench_frames(at)
    assert len(frames) == 1
    table = frames[0]
    assert list(table["model"]) == ["base", "ft0", "ft1"]
    assert list(table.columns) == ["model", "tiny_cloze/acc", "tiny_cloze/acc_norm"]
    folder = tiny_llama.finetuned["ft1"]
    direct = evaluate_benchmarks(load_model(folder, device="cpu"), load_tokenizer(folder), ["tiny_cloze"],
                                 include=pool_yaml.parent / "lm_tasks", limit=5)["tiny_cloze"]
    row = table[table["model"] == "ft1"].iloc[0]
    assert (row["tiny_cloze/acc"], row["tiny_cloze/acc_norm"]) == (direct["acc"], direct["acc_norm"])
    runs = [p for p in (home / "runs").iterdir() if "benchmarks" in p.name]
    assert len(runs) == 1
    recipe = json.loads((runs[0] / "recipe.json").read_text())
    assert recipe["kind"] == "benchmarks" and recipe["limit"] == 5 and recipe["models"] == ["base", "ft0", "ft1"]
    assert recipe["dtype"] == "float32"                                # the sidebar's dtype (cpu's default)
    assert json.loads((runs[0] / "results.json").read_text())["results"]["ft1"]["tiny_cloze"] == direct
    assert "limit 5 per task" in " ".join(c.value for c in at.caption)
    from forgetlab.core.workspace import load_run
    from forgetlab.ui.runs import run_figures

    fig = run_figures(load_run(runs[0]))[0]                            # reopened on the Runs page: one bar chart
    assert [t.name for t in fig.data] == ["base", "ft0", "ft1"]
    assert list(fig.data[2].x) == ["tiny_cloze/acc", "tiny_cloze/acc_norm"]
    assert list(fig.data[2].y) == [direct["acc"], direct["acc_norm"]]

    again = open_page("models", pool_yaml, timeout=120)   # a new session: the stored table at once, no click
    again.run()
    assert not again.exception, again.exception
    stored = _bench_frames(again)
    assert len(stored) == 1 and stored[0].equals(table)

    # the session-wide speciality measure offers the metrics (the Forgetting page's sweeps can use them)
    from forgetlab.core.pool import ModelPool
    from forgetlab.ui.measure import benchmark_measures

    assert benchmark_measures(ModelPool.from_yaml(pool_yaml)) == ["tiny_cloze/acc", "tiny_cloze/acc_norm"]


def test_a_pool_without_benchmarks_is_told_how_to_add_them(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    root = tmp_path / "pool"                      # a copy: test_models_page wants the first visit of the original
    shutil.copytree(tiny_llama.root, root)
    at = open_page("models", root / tiny_llama.pool_yaml.name, timeout=120)
    at.run()
    assert not at.exception, at.exception
    assert any("names no lm-eval benchmarks" in i.value for i in at.info)
    assert any("benchmarks:" in c.value and "include:" in c.value for c in at.code)
    assert not [b for b in at.button if b.key == "models_bench_run"]


def test_an_unknown_task_is_a_message_and_the_page_keeps_working(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _bench_pool(tiny_llama, tmp_path, general=("tiny_clozee",))
    at = open_page("models", pool_yaml, timeout=120)
    at.run()
    at.button(key="models_bench_run").click().run()
    finish_jobs(at, "models")
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert any("no task 'tiny_clozee'" in e and "tiny_cloze" in e for e in errors), errors
    assert not (tmp_path / "home" / "runs").exists() or \
        not [p for p in (tmp_path / "home" / "runs").iterdir() if "benchmarks" in p.name]   # nothing saved
    assert list(at.dataframe[0].value["model"]) == ["base", "ft0", "ft1"]                   # page still drawn


def test_sweep_measures_run_the_benchmark_at_every_point_and_fall_back_on_sweeps_without_it(tiny_llama, tmp_path,
                                                                                          monkeypatch):
    """What the Forgetting page's sweep gets from `sweep_measures`: a benchmark measure adds the BenchmarkSpec
    to the sweep's settings; the trade-off chart then plots it; an old sweep without it falls back."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _bench_pool(tiny_llama, tmp_path, limit=4)

    def script():
        import json as _json

        import streamlit as st

        from forgetlab.analysis import sweeps
        from forgetlab.core.pool import ModelPool
        from forgetlab.plots.forgetting import tradeoff_figure
        from forgetlab.ui.measure import sweep_measures

        pool = ModelPool.from_yaml(st.session_state["pool_yaml"])
        measures = sweep_measures("forgetting", pool)
        st.session_state["settings"] = {k: v.to_dict() for k, v in measures.settings.items()}
        if measures.settings:
            with_bench = sweeps.alpha_curve(pool, "ft0", alphas=[0, 1], max_general=2, max_task=2,
                                            **measures.settings)
            results = [with_bench]
            if st.session_state.get("mix"):
                results.append(sweeps.alpha_curve(pool, "ft0", alphas=[0.5], max_general=2, max_task=2))
            measures.apply(results)
            st.session_state["applied"] = (results[0].measure, results[0].general_measure)
            fig = tradeoff_figure(results)
            st.session_state["axes"] = _json.loads(fig.to_json())["layout"]
            st.session_state["y"] = list(fig.data[0].y)
            st.session_state["bench"] = [p.scorecard.benchmarks["tiny_cloze"]["acc_norm"] for p in with_bench.points]

    at = AppTest.from_function(script, default_timeout=180)
    at.session_state["pool_yaml"] = str(pool_yaml)
    at.run()
    assert not at.exception, at.exception
    spec = at.selectbox(key="forgetting_measure")
    assert spec.options[:2] == ["exact match ↑", "answer loss ↓"] and "tiny_cloze/acc_norm" in spec.options
    assert at.session_state["settings"] == {}
    spec.set_value("tiny_cloze/acc_norm")
    at.selectbox(key="forgetting_general_measure").set_value("tiny_cloze/acc")
    at.run()
    assert not at.exception, at.exception
    assert at.session_state["app_measure"] == "tiny_cloze/acc_norm"                 # session-wide
    assert at.session_state["settings"]["benchmarks"]["general"] == ["tiny_cloze"]
    assert at.session_state["settings"]["benchmarks"]["limit"] == 4
    assert at.session_state["applied"] == ("tiny_cloze/acc_norm", "tiny_cloze/acc")
    assert at.session_state["y"] == at.session_state["bench"]                      # the chart plots the metric
    axes = at.session_state["axes"]
    assert axes["yaxis"]["title"]["text"] == "speciality: tiny_cloze/acc_norm ↑"
    assert axes["xaxis"]["title"]["text"] == "generality: tiny_cloze/acc ↑"
    at.session_state["mix"] = True                                                 # plus a sweep without it
    at.run()
    assert not at.exception, at.exception
    assert at.session_state["applied"][1] == "general_loss"
    assert at.session_state["applied"][0] in ("exact_match", "answer_loss")
    assert any("was not run in every sweep" in c.value for c in at.caption)


def test_the_forgetting_page_sweeps_with_a_benchmark_measure_and_shows_its_values(tiny_llama, tmp_path,
                                                                                  monkeypatch):
    """Choosing a benchmark metric as the speciality on the Forgetting page runs it at every point of the sweep:
    the table's speciality is the metric, equal to the same sweep run directly with that benchmark; each point
    names the worker that computed it (this process, with the local executor)."""
    import os
    import socket

    from forgetlab.analysis import sweeps
    from forgetlab.core.benchmarks import BenchmarkSpec
    from forgetlab.core.pool import ModelPool

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _bench_pool(tiny_llama, tmp_path, limit=4)
    at = _open_with_measure("forgetting", pool_yaml)
    at.text_input(key="forgetting_alphas").set_value("0, 1")
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 2
    _click_and_finish(at, "forgetting_run", "forgetting")
    table = at.dataframe[0].value
    assert set(table["measure"]) == {"tiny_cloze/acc_norm"}
    direct = sweeps.alpha_curve(ModelPool.from_yaml(pool_yaml), "ft0", alphas=[0, 1], max_general=2, max_task=2,
                                benchmarks=BenchmarkSpec(general=["tiny_cloze"], include=str(pool_yaml.parent /
                                                                                               "lm_tasks"), limit=4))
    expected = [p.scorecard.benchmarks["tiny_cloze"]["acc_norm"] for p in direct.points]
    assert list(table["speciality"]) == expected
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    tradeoff = [c for c in charts if "tiny_cloze/acc_norm" in json.dumps(c["layout"].get("yaxis", {}))]
    assert tradeoff, [c["layout"].get("yaxis") for c in charts]                    # the chart's axis is the metric
    assert tradeoff[0]["data"][0]["y"] == expected                                  # and its points its values
    assert set(table["worker"]) == {f"{socket.gethostname()}:{os.getpid()}"}


def test_the_merge_page_scores_base_parents_and_merge_on_a_chosen_benchmark(tiny_llama, tmp_path, monkeypatch):
    """A benchmark metric chosen as the speciality on the Merge page is run on the base, the parents and the
    merge: the table's lm-eval column for the merge equals lm-eval run on the saved merged folder, and the
    chart's speciality bars are that metric."""
    from forgetlab.core.benchmarks import evaluate_benchmarks
    from forgetlab.core.checkpoints import load_model, load_tokenizer

    home = tmp_path / "home"
    monkeypatch.setenv("FORGETLAB_HOME", str(home))
    pool_yaml = _bench_pool(tiny_llama, tmp_path, limit=4)
    at = _open_with_measure("merge", pool_yaml)
    at.text_input(key="merge_name_ties").set_value("benchmarked")
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 2
    _click_and_finish(at, "merge_run", "merge")
    table = at.dataframe[0].value
    column = [c for c in table.columns if "tiny_cloze" in str(c) and "acc_norm" in str(c)]
    assert column, " | ".join(map(str, table.columns))
    folder = home / "merges" / "benchmarked"
    direct = evaluate_benchmarks(load_model(folder, device="cpu"), load_tokenizer(folder), ["tiny_cloze"],
                                 include=pool_yaml.parent / "lm_tasks", limit=4)["tiny_cloze"]
    assert table[table["model"] == "benchmarked"].iloc[0][column[0]] == direct["acc_norm"]
    chart = at.get("plotly_chart")[0].proto.spec
    bars = [t for t in json.loads(chart)["data"] if t.get("x") == ["tiny_cloze/acc_norm"]]
    assert len(bars) == 4 and bars[-1]["y"] == [direct["acc_norm"]]


def test_fine_tunes_measured_by_a_benchmark_cli_api_and_page(tiny_llama, tmp_path, monkeypatch, capsys):
    """`finetune --measure TASK/METRIC` runs the lm-eval task at every record: the final value equals lm-eval
    on the trained model, the CLI prints it, a task the include folder lacks is exit 2 before training, and the
    Fine-tune page's final trade-off plots the metric."""
    from forgetlab.cli import main
    from forgetlab.core.benchmarks import BenchmarkSpec, evaluate_benchmarks
    from forgetlab.core.pool import ModelPool
    from forgetlab.train.runs import FinetuneConfig, compare, finetune

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _bench_pool(tiny_llama, tmp_path, limit=4)
    pool = ModelPool.from_yaml(pool_yaml)
    spec = BenchmarkSpec(general=["tiny_cloze"], include=str(pool_yaml.parent / "lm_tasks"), limit=4)
    cfg = FinetuneConfig(label="adamw", steps=2, batch_size=4, lr=1e-2)
    run, model = finetune(pool, "copy", cfg, max_general=2, max_task=2, benchmarks=spec, return_model=True)
    direct = evaluate_benchmarks(model, pool.tokenizer, ["tiny_cloze"], include=spec.include, limit=4)["tiny_cloze"]
    assert run.value("tiny_cloze/acc_norm") == direct["acc_norm"]
    assert run.trajectory()["tiny_cloze/acc_norm"].iloc[-1] == direct["acc_norm"]
    comp = compare(pool, "copy", [cfg, FinetuneConfig(label="mofo", optimizer="mofo", steps=2, batch_size=4, lr=1e-2)],
                   max_general=2, max_task=2, benchmarks=spec, measure="tiny_cloze/acc_norm")
    assert comp.runs[0].value("tiny_cloze/acc_norm") == direct["acc_norm"]          # same seed, same batches
    assert comp.recipe["measure"] == "tiny_cloze/acc_norm"

    assert main(["finetune", str(pool_yaml), "--task", "copy", "--steps", "2", "--batch-size", "4", "--lr", "1e-2",
                 "--max-general", "2", "--max-task", "2", "--measure", "tiny_cloze/acc_norm", "--limit", "4",
                 "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "speciality: tiny_cloze/acc_norm" in out and f"{direct['acc_norm']:.4f}" in out
    assert main(["finetune", str(pool_yaml), "--task", "copy", "--steps", "2", "--measure", "nosuch_task/acc",
                 "--no-save"]) == 2
    assert "nosuch_task" in capsys.readouterr().err

    at = _open_with_measure("finetune", pool_yaml)
    at.selectbox(key="finetune_task").set_value("copy").run()      # the CLI runs above train copy
    at.radio(key="finetune_mode").set_value("one run").run()
    at.number_input(key="finetune_steps").set_value(2)
    at.number_input(key="finetune_batch").set_value(4)
    at.number_input(key="finetune_lr").set_value(1e-2)
    at.number_input(key="finetune_max_general").set_value(2)
    at.number_input(key="finetune_max_task").set_value(2)
    _click_and_finish(at, "finetune_run", "finetune")
    final = json.loads(at.get("plotly_chart")[1].proto.spec)
    assert "tiny_cloze/acc_norm" in json.dumps(final["layout"]["yaxis"]["title"])
    runs = [t for t in final["data"] if t.get("mode") == "markers" and not t["name"].startswith("start")]
    assert runs and runs[0]["y"] == [direct["acc_norm"]]


def test_merge_search_scored_by_a_benchmark_equals_lm_eval_on_the_merged_folder(tiny_llama, tmp_path, monkeypatch,
                                                                                capsys):
    """`forgetlab search --measure TASK/METRIC` runs the lm-eval task on every candidate; its first point (the
    recipe as written) equals lm-eval on that merge written to disk by `forgetlab merge`."""
    from forgetlab.cli import main
    from forgetlab.core.benchmarks import evaluate_benchmarks
    from forgetlab.core.checkpoints import load_model, load_tokenizer

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _bench_pool(tiny_llama, tmp_path, limit=4)
    recipe = pool_yaml.parent / "ties.yaml"
    recipe.write_text(yaml.safe_dump({"method": "ties", "base": "base", "models": ["ft0", "ft1"],
                                      "params": {"keep": 0.5}}))
    out_json = tmp_path / "points.json"
    assert main(["search", str(recipe), "--pool", str(pool_yaml), "--budget", "2", "--measure", "tiny_cloze/acc_norm",
                 "--max-general", "2", "--max-task", "2", "--out", str(out_json), "--no-save"]) == 0
    points = json.loads(out_json.read_text())
    assert len(points) == 2
    assert main(["merge", str(recipe), str(tmp_path / "merged")]) == 0
    folder = tmp_path / "merged"
    direct = evaluate_benchmarks(load_model(folder, device="cpu"), load_tokenizer(folder), ["tiny_cloze"],
                                 include=pool_yaml.parent / "lm_tasks", limit=4)["tiny_cloze"]
    assert points[0]["speciality"] == direct["acc_norm"]
    capsys.readouterr()
    assert main(["search", str(recipe), "--pool", str(pool_yaml), "--budget", "2", "--measure", "nosuch/acc",
                 "--no-save"]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_cli_merge_scores_the_merge_with_lm_eval_equal_to_lm_eval_on_the_saved_folder(tiny_llama, tmp_path,
                                                                                      monkeypatch, capsys):
    """`forgetlab merge RECIPE OUT --pool P --lm-eval TASK --limit N` scores the merge beside the pool's base and
    the recipe's parents: the merge's benchmark numbers (printed, and in OUT/scorecards.json) equal lm-eval on
    the saved folder; `--eval` alone runs the pool's benchmarks. An unknown task, or evaluating without a pool,
    is exit 2 before the merge, with nothing written."""
    from forgetlab.cli import main
    from forgetlab.core.benchmarks import evaluate_benchmarks
    from forgetlab.core.checkpoints import load_model, load_tokenizer

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _bench_pool(tiny_llama, tmp_path, limit=4)
    recipe = pool_yaml.parent / "ties.yaml"
    recipe.write_text(yaml.safe_dump({"method": "ties", "base": "base", "models": ["ft0", "ft1"],
                                      "params": {"keep": 0.5}}))
    small = ["--max-general", "2", "--max-task", "2"]
    out = tmp_path / "merged"
    assert main(["merge", str(recipe), str(out), "--pool", str(pool_yaml), "--lm-eval", "tiny_cloze", "--limit", "3",
                 *small]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((out / "scorecards.json").read_text())["cards"]
    assert [c["model"] for c in saved] == ["base", "ft0", "ft1", "merged"]
    direct = evaluate_benchmarks(load_model(out, device="cpu"), load_tokenizer(out), ["tiny_cloze"],
                                 include=pool_yaml.parent / "lm_tasks", limit=3)
    assert saved[-1]["benchmarks"] == direct
    assert f"merged benchmarks: {json.dumps(direct)}" in printed
    assert (out / "recipe.yaml").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".merged")]

    assert main(["merge", str(recipe), str(tmp_path / "pooled"), "--pool", str(pool_yaml), "--eval", *small]) == 0
    pooled = json.loads((tmp_path / "pooled" / "scorecards.json").read_text())["cards"]
    assert set(pooled[-1]["benchmarks"]["tiny_cloze"]) == {"acc", "acc_norm"}       # the pool's tasks, limit 4
    capsys.readouterr()

    bad = tmp_path / "bad"
    assert main(["merge", str(recipe), str(bad), "--pool", str(pool_yaml), "--lm-eval", "tiny_clozee"]) == 2
    assert "tiny_clozee" in capsys.readouterr().err
    assert main(["merge", str(recipe), str(bad), "--lm-eval", "tiny_cloze"]) == 2
    assert "--pool" in capsys.readouterr().err
    assert not bad.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".bad")]
    (pool_yaml.parent / "lm_tasks" / "tiny_cloze.jsonl").unlink()     # fails only once lm-eval runs: after merging
    assert main(["merge", str(recipe), str(bad), "--pool", str(pool_yaml), "--eval", *small]) == 2
    assert "data of the local lm-eval task 'tiny_cloze' is missing" in capsys.readouterr().err
    assert not bad.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".bad")]


def test_finetune_compare_with_benchmark_speciality_and_generality_cli_and_page(tiny_llama, tmp_path, monkeypatch,
                                                                                capsys):
    """`finetune --compare --measure TASK/METRIC --general-measure TASK/METRIC` runs the lm-eval task at every
    record of every run: the AdamW run's final values equal lm-eval on the same fine-tune's model, the Pareto
    front is taken on both benchmark axes and the run is saved with them; a metric the task does not report is
    exit 2 before training. The Fine-tune page's final trade-off plots the benchmark generality on x."""
    from forgetlab.analysis.measures import pareto_mask
    from forgetlab.cli import main
    from forgetlab.core.benchmarks import BenchmarkSpec, evaluate_benchmarks
    from forgetlab.core.pool import ModelPool
    from forgetlab.analysis.finetune import ANALYSIS as FINETUNE
    from forgetlab.train.runs import finetune, standard_configs

    home = tmp_path / "home"
    monkeypatch.setenv("FORGETLAB_HOME", str(home))
    pool_yaml = _bench_pool(tiny_llama, tmp_path, limit=4)
    pool = ModelPool.from_yaml(pool_yaml)
    spec = BenchmarkSpec(general=["tiny_cloze"], include=str(pool_yaml.parent / "lm_tasks"), limit=4)
    _, model = finetune(pool, "copy", standard_configs(2, 1e-2, batch_size=4)[0], max_general=2, max_task=2,
                        benchmarks=spec, return_model=True)
    direct = evaluate_benchmarks(model, pool.tokenizer, ["tiny_cloze"], include=spec.include, limit=4)["tiny_cloze"]

    args = ["finetune", str(pool_yaml), "--task", "copy", "--steps", "2", "--batch-size", "4", "--lr", "1e-2",
            "--max-general", "2", "--max-task", "2", "--limit", "4"]
    assert main([*args, "--compare", "--measure", "tiny_cloze/acc_norm", "--general-measure", "tiny_cloze/acc"]) == 0
    out = capsys.readouterr().out
    assert "speciality: tiny_cloze/acc_norm; generality: tiny_cloze/acc" in out
    saved = [p for p in (home / "runs").iterdir() if "finetune" in p.name]
    assert len(saved) == 1
    comp = FINETUNE.load(saved[0])
    assert comp.recipe["measure"] == "tiny_cloze/acc_norm" and comp.recipe["general_measure"] == "tiny_cloze/acc"
    assert [r.label for r in comp.runs][0] == "adamw" and len(comp.runs) == 5
    assert comp.runs[0].final.benchmarks["tiny_cloze"] == direct                     # same seed, same batches
    assert comp.runs[0].trajectory()["tiny_cloze/acc"].iloc[-1] == direct["acc"]     # recorded at every record
    expected = pareto_mask([r.value("tiny_cloze/acc_norm") for r in comp.runs],
                           [-r.generality("tiny_cloze/acc") for r in comp.runs])
    assert [r.pareto for r in comp.runs] == expected
    assert main([*args, "--measure", "tiny_cloze/accnorm", "--no-save"]) == 2        # not a metric it reports
    err = capsys.readouterr().err
    assert "does not report a metric 'accnorm'" in err and "tiny_cloze/acc_norm" in err
    assert main([*args, "--general-measure", "tiny_clozee/acc", "--no-save"]) == 2
    assert "tiny_clozee" in capsys.readouterr().err
    assert len([p for p in (home / "runs").iterdir() if "finetune" in p.name]) == 1   # nothing more saved

    at = _open_with_measure("finetune", pool_yaml)
    at.selectbox(key="finetune_task").set_value("copy").run()      # the CLI runs above train copy
    at.selectbox(key="finetune_general_measure").set_value("tiny_cloze/acc").run()
    at.radio(key="finetune_mode").set_value("one run").run()
    for key, value in (("finetune_steps", 2), ("finetune_batch", 4), ("finetune_lr", 1e-2),
                       ("finetune_max_general", 2), ("finetune_max_task", 2)):
        at.number_input(key=key).set_value(value)
    _click_and_finish(at, "finetune_run", "finetune")
    final = json.loads(at.get("plotly_chart")[1].proto.spec)
    assert "tiny_cloze/acc" in json.dumps(final["layout"]["xaxis"]["title"])
    runs = [t for t in final["data"] if t.get("mode") == "markers" and not t["name"].startswith("start")]
    assert runs and runs[0]["x"] == [direct["acc"]] and runs[0]["y"] == [direct["acc_norm"]]


def test_a_metric_the_task_does_not_report_is_refused_before_any_work(tiny_llama, tmp_path, monkeypatch, capsys):
    """sweep and search check a benchmark measure's metric against the metrics the lm-eval task reports before
    the first point: exit 2 naming the task's metrics, nothing saved."""
    from forgetlab.cli import main
    from forgetlab.core.benchmarks import BenchmarkError, BenchmarkSpec, check_metrics

    home = tmp_path / "home"
    monkeypatch.setenv("FORGETLAB_HOME", str(home))
    pool_yaml = _bench_pool(tiny_llama, tmp_path, limit=4)
    recipe = pool_yaml.parent / "ties.yaml"
    recipe.write_text(yaml.safe_dump({"method": "ties", "base": "base", "models": ["ft0", "ft1"]}))
    for argv in (["sweep", "alpha", str(pool_yaml), "--model", "ft0", "--general-measure", "tiny_cloze/f1"],
                 ["search", str(recipe), "--pool", str(pool_yaml), "--budget", "2", "--measure", "tiny_cloze/f1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "does not report a metric 'f1'" in err and "acc, acc_norm" in err, err
    assert not home.exists() or not any((home / "runs").glob("*"))
    spec = BenchmarkSpec(general=["tiny_cloze"], include=str(pool_yaml.parent / "lm_tasks"))
    check_metrics(["exact_match", "tiny_cloze/acc", "tiny_cloze/acc_norm"], spec)        # the real ones pass
    with pytest.raises(BenchmarkError, match="did you mean tiny_cloze/acc_norm"):
        check_metrics(["tiny_cloze/acc_nrm"], spec)


def test_the_benchmarks_button_shows_its_memory_and_refuses_what_will_not_fit(tiny_llama, tmp_path, monkeypatch):
    from forgetlab.core.memory import ModelSize, estimate
    from forgetlab.core.pool import ModelPool

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _bench_pool(tiny_llama, tmp_path)
    pool = ModelPool.from_yaml(pool_yaml)
    f32 = estimate("benchmarks", pool=pool, dtype="float32")
    bf = estimate("benchmarks", pool=pool, dtype="bfloat16")
    size = ModelSize.of(pool.checkpoint("base"))
    assert f32.parts["weights"] == size.bytes("float32") and bf.parts["weights"] == size.bytes("bfloat16")
    assert f32.parts["longest request"] > bf.parts["longest request"] > 0
    at = open_page("models", pool_yaml, timeout=120)
    at.run()
    assert any(c.value.startswith("Memory: needs ≈") and "longest request" in c.value for c in at.caption)
    assert not at.button(key="models_bench_run").disabled
    import forgetlab.core.memory as memory

    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    at.run()
    assert at.button(key="models_bench_run").disabled
    assert any("will not fit" in e.value and "longest request" in e.value for e in at.error)
