"""The Fine-tune page: one run saved into the pool, a comparison of four fixes, bad input shown as a message."""
from __future__ import annotations

import shutil

import pytest

from tests.jobs_helper import finish_cleanly, finish_jobs, open_page

from forgetlab.core.pool import ModelPool


def test_finetune_page_one_run_and_save(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    at = open_page("finetune", root / "pool.yaml")
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Fine-tune"
    assert at.radio(key="finetune_mode").value == "comparison"     # the page's story: the fixes side by side
    at.radio(key="finetune_mode").set_value("one run").run()
    at.number_input(key="finetune_steps").set_value(4)
    at.number_input(key="finetune_eval_every").set_value(2)
    at.number_input(key="finetune_max_general").set_value(1)
    at.radio(key="finetune_optimizer").set_value("mofo")
    at.button(key="finetune_run").click().run()
    finish_cleanly(at, "finetune")
    table = at.dataframe[0].value
    assert list(table["label"]) == ["mofo-0.2"] and table["steps"].item() == 4
    assert len(at.get("plotly_chart")) == 3
    # the trained model moved into the session: the finished job, kept for other tabs, holds no copy of it
    from forgetlab.ui.jobs import REGISTRY

    done = [j for j in REGISTRY.jobs() if j.key.startswith("finetune") and j.status == "done"][0]
    result, _ = done.result                       # (the comparison of one run, the folder it was saved in)
    assert result.model is None and at.session_state["finetune_model"] is not None
    at.text_input(key="finetune_save_name").set_value("math-mofo")
    at.button(key="finetune_save").click().run()
    assert not at.exception, at.exception
    assert any("math-mofo" in s.value for s in at.success)
    assert "math-mofo" in ModelPool.from_yaml(root / "pool.yaml").model_names


def test_finetune_page_runs_mofos_ablations_with_their_options(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    at = open_page("finetune", tiny_llama.root / "pool.yaml")
    at.run()
    at.radio(key="finetune_mode").set_value("one run").run()
    assert "finetune_filter" not in at.session_state                 # AdamW: no MoFO options
    at.radio(key="finetune_optimizer").set_value("mofo-lion").run()
    assert at.selectbox(key="finetune_filter_lion").options == ["momentum", "gradient", "random"]   # no v in Lion
    at.radio(key="finetune_optimizer").set_value("mofo").run()
    assert at.selectbox(key="finetune_filter").options == ["momentum", "gradient", "mv", "gv", "random"]
    at.selectbox(key="finetune_filter").set_value("gradient")
    at.selectbox(key="finetune_partition").set_value("head")
    assert at.number_input(key="finetune_max_length").value == 256
    at.number_input(key="finetune_max_length").set_value(16)
    at.number_input(key="finetune_steps").set_value(2)
    at.number_input(key="finetune_eval_every").set_value(2)
    at.number_input(key="finetune_max_general").set_value(1)
    at.button(key="finetune_run").click().run()
    finish_cleanly(at, "finetune")
    table = at.dataframe[0].value
    assert list(table["label"]) == ["mofo-0.2-flt-g-heads"] and 0 < table["moved"].item() < 1
    from forgetlab.ui.jobs import REGISTRY

    runs = [j.result[0].runs[0] for j in REGISTRY.jobs() if j.key.startswith("finetune") and j.status == "done"]
    settings = next(r for r in runs if r.label == "mofo-0.2-flt-g-heads").train.settings
    assert (settings["filter"], settings["partition"], settings["max_length"]) == ("gradient", "head", 16)


def test_finetune_page_comparison(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("finetune", tiny_llama.pool_yaml)
    at.run()
    assert at.selectbox(key="finetune_task").value == "math"     # the demo's measured default comparison
    at.radio(key="finetune_mode").set_value("comparison").run()
    at.number_input(key="finetune_steps").set_value(2)
    at.number_input(key="finetune_eval_every").set_value(1)
    at.number_input(key="finetune_max_general").set_value(1)
    at.number_input(key="finetune_max_task").set_value(2)
    at.button(key="finetune_run").click().run()
    finish_cleanly(at, "finetune")
    assert list(at.dataframe[0].value["label"]) == ["adamw", "mofo-0.2", "sfa-p0.25", "l2-1", "l1-0.001"]
    assert len(list((tmp_path / "runs").iterdir())) == 1
    import json

    trajectories = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert "answer loss (nats) ↓" in trajectories["layout"]["annotations"][1]["text"]     # the session's default
    assert {t["name"] for t in trajectories["data"] if t.get("showlegend", True)} >= {"AdamW", "MoFO 0.2"}
    # the measure chosen on another page of the session (e.g. Forgetting) holds here too
    at.session_state["app_measure"] = "exact_match"
    at.run()
    assert at.radio(key="finetune_measure").value == "exact_match"
    trajectories = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert "exact match ↑" in trajectories["layout"]["annotations"][1]["text"]


@pytest.mark.filterwarnings("ignore::forgetlab.core.pool.NonFiniteWeightsWarning")
def test_finetune_page_nan_loss_is_a_message(tiny_llama, tmp_path, monkeypatch):
    """A base whose final norm is NaN gives a NaN loss at step 1: the page shows the trainer's message."""
    from safetensors.torch import load_file, save_file

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    weights = root / "base" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * float("nan")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    at = open_page("finetune", root / "pool.yaml")
    at.run()
    at.number_input(key="finetune_steps").set_value(3)
    at.number_input(key="finetune_max_general").set_value(1)
    at.button(key="finetune_run").click().run()
    finish_jobs(at, "finetune")
    assert not at.exception, at.exception
    assert any("NaN" in e.value and "step 1" in e.value for e in at.error), [e.value for e in at.error]


def test_finetune_page_lora_run_saved_as_an_adapter(tiny_llama, tmp_path, monkeypatch):
    """Issue 28: the page trains a LoRA adapter, shows the memory it needs first, and saves an adapter."""
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    at = open_page("finetune", root / "pool.yaml")
    at.run()
    assert any("Memory: needs ≈" in c.value and "free on cpu" in c.value for c in at.caption)
    at.radio(key="finetune_mode").set_value("one run").run()
    at.radio(key="finetune_weights").set_value("a LoRA adapter").run()
    assert at.multiselect(key="finetune_lora_targets").value == ["down_proj", "gate_proj", "k_proj", "o_proj",
                                                                 "q_proj", "up_proj", "v_proj"]
    at.number_input(key="finetune_lora_r").set_value(2)
    at.multiselect(key="finetune_lora_targets").set_value(["q_proj", "v_proj"])
    at.checkbox(key="finetune_checkpointing").check()
    at.number_input(key="finetune_steps").set_value(2)
    at.number_input(key="finetune_eval_every").set_value(2)
    at.number_input(key="finetune_max_general").set_value(1)
    at.button(key="finetune_run").click().run()
    finish_cleanly(at, "finetune")
    result = at.session_state["finetune_result"]
    settings = result.runs[0].train.settings
    assert settings["gradient_checkpointing"] and settings["trainable_parameters"] < 2000
    assert result.runs[0].config.lora == 2 and result.runs[0].config.lora_targets == ["q_proj", "v_proj"]
    # named as the CLI names it (one function: forgetlab.analysis.finetune.configs_of), measures in its recipe
    assert result.runs[0].label == "lora2-adamw" and at.text_input(key="finetune_save_name").value == "math-lora2-adamw"
    assert result.recipe["measure"] == at.session_state["app_measure"] and result.recipe["general_measure"]
    at.text_input(key="finetune_save_name").set_value("math-lora")
    at.button(key="finetune_save").click().run()
    assert not at.exception, at.exception
    assert ModelPool.from_yaml(root / "pool.yaml").entries["math-lora"].adapter


def test_finetune_page_refuses_a_job_that_will_not_fit(tiny_llama, tmp_path, monkeypatch):
    import forgetlab.core.memory as memory

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1000)
    at = open_page("finetune", tiny_llama.pool_yaml)
    at.run()
    assert not at.exception
    assert any("will not fit" in e.value and "LoRA" in e.value for e in at.error)
    assert at.button(key="finetune_run").disabled
