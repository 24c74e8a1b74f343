"""The lm-eval bridge: an in-memory model scores exactly what lm-eval scores when it loads the same folder
itself; local tasks run offline; every bad input is a message."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from forgetlab.cli import main
from forgetlab.core.benchmarks import BenchmarkError, check_measure, evaluate_benchmarks, metrics_of, pick, task_manager
from forgetlab.core.checkpoints import load_model, load_tokenizer
from forgetlab.core.errors import ParameterError

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_task(folder: Path, name: str = "tiny_cloze", n: int = 24) -> Path:
    """A local multiple-choice task: which sum is right."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    with open(data, "w") as fh:
        for i in range(n):
            a, b = i % 7 + 1, (3 * i) % 5 + 2
            fh.write(json.dumps({"context": f"{a} plus {b} is", "label": i % 3,
                                 "choices": [f" {a + b + (k - i % 3)}" for k in range(3)]}) + "\n")
    (folder / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=data))
    return folder


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("lm_tasks"))


def test_in_memory_bridge_equals_lm_eval_loading_the_folder_itself(tiny_llama, tasks_dir):
    import lm_eval

    folder = tiny_llama.finetuned["ft0"]
    ours = evaluate_benchmarks(load_model(folder, device="cpu"), load_tokenizer(folder), ["tiny_cloze"],
                               include=tasks_dir, limit=20)
    ref = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={folder},device=cpu", tasks=["tiny_cloze"],
                                  limit=20, task_manager=task_manager(tasks_dir), log_samples=False,
                                  bootstrap_iters=0)
    assert ours == {"tiny_cloze": metrics_of(ref["results"]["tiny_cloze"])}
    assert set(ours["tiny_cloze"]) == {"acc", "acc_norm"} and 0 <= ours["tiny_cloze"]["acc"] <= 1


def test_different_models_get_different_numbers(tiny_llama, tasks_dir):
    scores = []
    for folder in (tiny_llama.base, tiny_llama.finetuned["ft1"]):
        m, t = load_model(folder, device="cpu"), load_tokenizer(folder)
        scores.append(evaluate_benchmarks(m, t, ["tiny_cloze"], include=tasks_dir)["tiny_cloze"])
    # acc_norm uses the per-choice log-likelihoods: two different random models do not tie on all 24 items
    assert scores[0] != scores[1]


def test_cli_eval_reports_benchmarks_beside_the_scorecard(tiny_llama, tasks_dir, tmp_path, capsys):
    out = tmp_path / "cards.json"
    assert main(["eval", str(tiny_llama.pool_yaml), "--models", "ft0", "--lm-eval", "tiny_cloze",
                 "--lm-eval-include", str(tasks_dir), "--limit", "12", "--max-general", "2", "--max-task", "2",
                 "--out", str(out)]) == 0
    cards = json.loads(out.read_text())
    assert cards[0]["model"] == "ft0" and set(cards[0]["benchmarks"]["tiny_cloze"]) == {"acc", "acc_norm"}


def test_pool_yaml_names_benchmarks(tiny_llama, tasks_dir, tmp_path):
    import shutil

    import yaml

    from forgetlab.core.pool import ModelPool

    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    shutil.copytree(tasks_dir, root / "lm_tasks")
    write_task(root / "lm_tasks")   # data_files pointing into the copy
    d = yaml.safe_load((root / "pool.yaml").read_text())
    d["probes"]["benchmarks"] = {"general": ["tiny_cloze"], "tasks": {"math": ["tiny_cloze"]},
                                 "include": "lm_tasks", "limit": 6}
    (root / "pool.yaml").write_text(yaml.safe_dump(d))
    pool = ModelPool.from_yaml(root / "pool.yaml")
    spec = pool.probes.benchmarks
    assert spec.all_tasks == ["tiny_cloze"] and spec.limit == 6 and spec.include == str((root / "lm_tasks").resolve())
    out = tmp_path / "c.json"
    assert main(["eval", str(root / "pool.yaml"), "--models", "base", "--max-general", "2", "--max-task", "2",
                 "--out", str(out)]) == 0
    assert "tiny_cloze" in json.loads(out.read_text())[0]["benchmarks"]


@pytest.mark.parametrize("argv,message", [
    (["--lm-eval", "tiny_cloz"], "no task 'tiny_cloz'. Close matches: tiny_cloze"),
    (["--lm-eval", "tiny_cloze", "--limit", "0"], "--limit: must be at least 1"),
    (["--lm-eval", "arc_easy"], "cannot be reached"),
])
def test_bad_benchmark_input_exits_2_with_a_message(argv, message, tiny_llama, tasks_dir, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(["eval", str(tiny_llama.pool_yaml), "--models", "base", "--max-general", "1",
                               "--max-task", "1", "--lm-eval-include", str(tasks_dir), *argv]))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_malformed_task_yaml_and_missing_data_are_messages(tiny_llama, tmp_path):
    m, t = load_model(tiny_llama.base, device="cpu"), load_tokenizer(tiny_llama.base)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "broken.yaml").write_text("task: broken\ndoc_to_text: [unclosed\n")
    with pytest.raises(BenchmarkError, match="broken.yaml is not valid YAML"):
        evaluate_benchmarks(m, t, ["broken"], include=bad)
    gone = write_task(tmp_path / "gone", "gone_task")
    (gone / "gone_task.jsonl").unlink()
    with pytest.raises(BenchmarkError, match="data of the local lm-eval task 'gone_task' is missing"):
        evaluate_benchmarks(m, t, ["gone_task"], include=gone)
    with pytest.raises(BenchmarkError, match="does not exist"):
        evaluate_benchmarks(m, t, ["x"], include=tmp_path / "nowhere")


def test_tokenizer_without_pad_uses_eos_and_without_either_is_refused(tiny_llama, tasks_dir):
    m, t = load_model(tiny_llama.base, device="cpu"), load_tokenizer(tiny_llama.base)
    t.pad_token = None
    assert evaluate_benchmarks(m, t, ["tiny_cloze"], include=tasks_dir, limit=3)
    assert t.pad_token_id == t.eos_token_id
    t.pad_token, t.eos_token = None, None
    with pytest.raises(BenchmarkError, match="neither a pad nor an end-of-sequence token"):
        evaluate_benchmarks(m, t, ["tiny_cloze"], include=tasks_dir, limit=3)


def test_measures_name_a_task_and_a_metric():
    bench = {"arc_easy": {"acc": 0.5, "acc_norm": 0.6}}
    assert pick(bench, "arc_easy/acc_norm") == 0.6
    with pytest.raises(BenchmarkError, match="reports: acc, acc_norm"):
        pick(bench, "arc_easy/f1")
    with pytest.raises(BenchmarkError, match="evaluated: arc_easy"):
        pick(bench, "hellaswag/acc")
    with pytest.raises(ParameterError, match="TASK/METRIC"):
        check_measure("arc_easy", ["arc_easy"])
    assert check_measure("arc_easy/acc", ["arc_easy"]) == ("arc_easy", "acc")


def test_metric_names_drop_stderr_alias_and_the_none_filter():
    raw = {"alias": "x", "acc,none": 0.5, "acc_stderr,none": 0.1, "exact_match,strict-match": 0.25,
           "sample_len": 10}
    assert metrics_of(raw) == {"acc": 0.5, "exact_match,strict-match": 0.25}


def test_sweep_with_benchmark_measures_has_exact_endpoints_and_its_own_pareto_direction(tiny_llama, tasks_dir):
    from forgetlab.analysis import measures, sweeps
    from forgetlab.core.benchmarks import BenchmarkSpec
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    spec = BenchmarkSpec(general=["tiny_cloze"], include=str(tasks_dir), limit=12)
    res = sweeps.alpha_curve(pool, "ft0", alphas=[0, 1], max_general=2, max_task=2, benchmarks=spec)
    res.measure, res.general_measure = "tiny_cloze/acc_norm", "tiny_cloze/acc"
    for point, folder in zip(res.points, (tiny_llama.base, tiny_llama.finetuned["ft0"])):   # α = 0, α = 1
        direct = evaluate_benchmarks(load_model(folder, device="cpu"), load_tokenizer(folder), ["tiny_cloze"],
                                     include=tasks_dir, limit=12)
        assert point.scorecard.benchmarks == direct
    frame = res.to_frame()
    assert list(frame["speciality"]) == [p.scorecard.benchmarks["tiny_cloze"]["acc_norm"] for p in res.points]
    assert list(frame["generality"]) == [p.scorecard.benchmarks["tiny_cloze"]["acc"] for p in res.points]
    assert res.recipe["benchmarks"]["general"] == ["tiny_cloze"]
    # accuracy as generality: higher is better (hand-made points)
    pts = [sweeps.SweepPoint("s", x, {}, sweeps.Scorecard("m", 1.0, 2.7, 1, {}, {"t": {"acc": g, "f1": sp}}), 0.0)
           for x, g, sp in [(0, 0.9, 0.1), (1, 0.5, 0.1), (2, 0.2, 0.8)]]
    assert measures.pareto_front(pts, measure="t/f1", general_measure="t/acc") == [True, False, True]
    assert measures.pareto_front(pts, measure="t/f1", general_measure="general_loss") == [False, False, True]
    with pytest.raises(BenchmarkError, match="has no metric 'bleu'"):
        measures.pareto_front(pts, measure="t/bleu")
    with pytest.raises(ParameterError, match="generality measure"):
        measures.check_general_measure("acc")


def test_zoo_lm_tasks_are_deterministic_and_right():
    from forgetlab.core.data import TaskPair
    from forgetlab.zoo.lmtasks import choice_items, cloze_items

    paras = ["The quick brown fox jumps over the lazy sleeping dog. It was a sunny and very warm day in town.",
             "Many people walked along the river bank in the evening light. The old mill stood beside the bridge."]
    items = cloze_items(paras, seed=3)
    assert items == cloze_items(paras, seed=3)
    for item in items:
        right = item["choices"][item["label"]].strip()
        assert right in {"dog", "town", "light", "bridge"} and len(set(item["choices"])) == 4
        assert not item["context"].endswith(right)
    pairs = [TaskPair(f"Compute: {a}+1=", str(a + 1)) for a in range(10)]
    for item, pair in zip(choice_items(pairs, seed=1), pairs):
        assert item["context"] == pair.prompt and item["choices"][item["label"]] == pair.answer


def test_the_zoo_pool_names_its_local_benchmarks_and_they_run_offline(pico_zoo, tmp_path, monkeypatch):
    import yaml

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    spec = yaml.safe_load(pico_zoo.pool_yaml.read_text())["probes"]["benchmarks"]
    assert spec["general"] == ["zoo_wiki_cloze"] and spec["include"] == "data/lm_tasks"
    assert set(spec["tasks"]) == set(pico_zoo.manifest["settings"]["tasks"])
    out = tmp_path / "cards.json"
    assert main(["eval", str(pico_zoo.pool_yaml), "--models", "base", "--max-general", "2", "--max-task", "2",
                 "--limit", "8", "--out", str(out)]) == 0
    bench = json.loads(out.read_text())[0]["benchmarks"]
    assert set(bench) == {"zoo_wiki_cloze"} | \
        {n for names in spec["tasks"].values() for n in names}
    assert all(0 <= m["acc"] <= 1 for m in bench.values())


def test_a_merge_is_judged_by_benchmarks_beside_its_parents(tiny_llama, tasks_dir, tmp_path):
    from forgetlab.core.benchmarks import BenchmarkSpec
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.workflow import evaluate_merge, merge_into_workspace, pool_recipe

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    res = merge_into_workspace(pool_recipe(pool, "task_arithmetic", ["ft0", "ft1"]), "m", home=tmp_path)
    spec = BenchmarkSpec(general=["tiny_cloze"], include=str(tasks_dir), limit=6)
    cards = evaluate_merge(pool, res.out_dir, ["ft0", "ft1"], max_general=2, max_task=2, benchmarks=spec)
    assert [c.model for c in cards] == ["base", "ft0", "ft1", "m"]
    assert all(set(c.benchmarks["tiny_cloze"]) == {"acc", "acc_norm"} for c in cards)
    direct = evaluate_benchmarks(load_model(res.out_dir, device="cpu"), load_tokenizer(tiny_llama.base),
                                 ["tiny_cloze"], include=tasks_dir, limit=6)
    assert cards[-1].benchmarks == direct


def test_benchmark_pool_holds_one_model_at_a_time_in_the_jobs_dtype(tiny_llama, tasks_dir):
    """Each model is loaded in the asked dtype, evaluated and unloaded before the next; a model the caller had
    loaded stays loaded (and is not loaded twice)."""
    import torch

    from forgetlab.core.benchmarks import BenchmarkSpec, benchmark_pool
    from forgetlab.core.pool import ModelPool
    from tests.pool_helper import LoadWatch

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    spec = BenchmarkSpec(general=["tiny_cloze"], include=str(tasks_dir))
    mine = pool.load("ft0")                                           # the caller's own: float32 on the CPU
    watch = LoadWatch(pool)
    with watch.watching():
        table = benchmark_pool(pool, ["base", "ft0", "ft1"], spec, limit=3, threads=1)
    assert watch.names == ["base", "ft0", "ft1"]
    assert watch.peak == 2                                            # the caller's ft0 + the one being evaluated
    assert pool.loaded() == [("ft0", "cpu", torch.float32)] and pool.load("ft0") is mine
    assert table.models == ["base", "ft0", "ft1"]

    pool.unload()
    seen = []
    original = pool.load
    pool.load = lambda name, device=None, dtype=torch.float32: seen.append(dtype) or original(name, device, dtype)
    half = benchmark_pool(pool, ["ft1"], spec, limit=3, dtype="bfloat16", threads=1)
    assert seen == [torch.bfloat16] and pool.loaded() == []
    assert set(half.results["ft1"]["tiny_cloze"]) == {"acc", "acc_norm"}
