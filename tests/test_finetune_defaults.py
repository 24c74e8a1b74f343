"""One default recipe for a what-if fine-tune (issue 43): `forgetlab finetune POOL --compare` and the Fine-tune page
take steps, batch size, lr and warm-up from one function — how the pool's own fine-tunes were trained (a zoo's
manifest records it), or the documented fallback for a user's pool — and both record every ≤ 10 steps."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.jobs_helper import open_page

from forgetlab.analysis.finetune import ANALYSIS, FinetuneSettings, configs_of
from forgetlab.cli import build_parser
from forgetlab.commands.generated import settings_of
from forgetlab.core.pool import ModelPool
from forgetlab.train.defaults import FALLBACK, MANIFEST, finetune_defaults
from forgetlab.train.runs import SFA_BETA, SFA_BETA_COMPARE, default_record_every
from forgetlab.zoo.manifest import new_manifest
from forgetlab.zoo.presets import PRESETS

ZOO = PRESETS["pico"]["default"]          # the demo zoo's spec: its manifest is what a build writes


def _zoo_pool(tiny_llama, tmp_path):
    """A copy of the tiny pool with the demo zoo's manifest beside its pool file (what a zoo build leaves)."""
    root = tmp_path / "zoo"
    shutil.copytree(tiny_llama.root, root)
    (root / MANIFEST).write_text(json.dumps(new_manifest(ZOO)), encoding="utf-8")
    return root / "pool.yaml"


def _numbers(recipe) -> tuple:
    return recipe.steps, recipe.batch_size, recipe.lr, recipe.warmup


def test_a_zoo_pool_defaults_to_how_its_fine_tunes_were_trained(tiny_llama, tmp_path):
    pool = ModelPool.from_yaml(_zoo_pool(tiny_llama, tmp_path))
    run = ZOO.finetune
    assert _numbers(finetune_defaults(pool, "math")) == (run.steps, run.batch_size, run.lr, run.warmup)
    assert finetune_defaults(pool, "code").lr == ZOO.finetune_for("code").lr != run.lr   # a task's own lr
    adapter = ZOO.lora.train
    assert _numbers(finetune_defaults(pool, "math", lora=True)) == (adapter.steps, adapter.batch_size, adapter.lr,
                                                                    adapter.warmup)
    assert finetune_defaults(pool, "math").source.endswith(MANIFEST)


def test_a_pool_without_a_record_gets_the_fallback(tiny_llama, tmp_path):
    assert finetune_defaults(ModelPool.from_yaml(tiny_llama.pool_yaml), "math") == FALLBACK
    assert finetune_defaults(None) == FALLBACK
    pool_yaml = _zoo_pool(tiny_llama, tmp_path)
    for broken in ("{not json", json.dumps({"settings": {"finetune": {"steps": 0, "batch_size": 8, "lr": 1e-3}}}),
                   json.dumps({"settings": {"evaluation": {}}})):
        (pool_yaml.parent / MANIFEST).write_text(broken, encoding="utf-8")
        assert finetune_defaults(ModelPool.from_yaml(pool_yaml), "math") == FALLBACK


def test_records_are_at_most_10_steps_apart_in_a_default_run():
    assert default_record_every(ZOO.finetune.steps) == 10 and default_record_every(FALLBACK.steps) == 10
    assert default_record_every(4) == 1 and default_record_every(300) == 10 and default_record_every(3000) == 100


@pytest.mark.parametrize("zoo", [True, False], ids=["zoo pool", "user pool"])
def test_the_cli_and_the_page_take_the_same_defaults(zoo, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _zoo_pool(tiny_llama, tmp_path) if zoo else tiny_llama.pool_yaml
    pool = ModelPool.from_yaml(pool_yaml)
    expected = finetune_defaults(pool, "math")
    assert (expected != FALLBACK) is zoo
    args = build_parser().parse_args(["finetune", str(pool_yaml), "--task", "math", "--compare"])
    settings = settings_of(ANALYSIS, args)
    configs = configs_of(settings, pool)
    assert len(configs) == 5 and {_numbers(c) for c in configs} == {_numbers(expected)}
    at = open_page("finetune", pool_yaml)
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="finetune_task").value == "math" and at.radio(key="finetune_mode").value == "comparison"
    shown = tuple(at.number_input(key=f"finetune_{k}").value for k in ("steps", "batch", "lr"))
    assert shown == (expected.steps, expected.batch_size, pytest.approx(expected.lr))
    assert at.number_input(key="finetune_eval_every").value == default_record_every(expected.steps) <= 10
    assert any(f"not the paper's {SFA_BETA:g}" in c.value for c in at.caption)    # why SFA's β is not 0.5
    assert settings.eval_every is None            # the CLI's runs: default_record_every(steps) (runs.finetune)


def test_the_comparisons_sfa_beta_is_its_own_default_and_a_single_run_keeps_the_papers():
    compare = {c.label: c for c in configs_of(FinetuneSettings(task="math", compare=True))}
    assert compare["sfa-p0.25"].sfa_beta == SFA_BETA_COMPARE != SFA_BETA
    assert configs_of(FinetuneSettings(task="math", sfa_p=0.25))[0].sfa_beta == SFA_BETA == 0.5
    for beta in (0.0, 0.5):                                      # a β given is kept, 0 included
        assert {c.label: c for c in configs_of(FinetuneSettings(task="math", compare=True, sfa_beta=beta))}[
            "sfa-p0.25"].sfa_beta == beta
        assert configs_of(FinetuneSettings(task="math", sfa_p=0.25, sfa_beta=beta))[0].sfa_beta == beta


def test_the_pages_defaults_follow_the_task_and_the_mode(tiny_llama, tmp_path, monkeypatch):
    """A widget keeps its value across reruns even when its default changes: the page resets the ones whose default
    did (code's own lr, the one-run β), and keeps a value the user typed while its default stays."""
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _zoo_pool(tiny_llama, tmp_path)
    manifest = json.loads((pool_yaml.parent / MANIFEST).read_text(encoding="utf-8"))
    manifest["settings"]["finetune_lr"] = {"copy": 5e-4}          # the tiny pool's second task gets its own lr
    (pool_yaml.parent / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    at = open_page("finetune", pool_yaml)
    at.run()
    assert at.number_input(key="finetune_sfa_beta").value == SFA_BETA_COMPARE
    at.number_input(key="finetune_steps").set_value(7).run()
    at.selectbox(key="finetune_task").set_value("copy").run()
    assert at.number_input(key="finetune_lr").value == pytest.approx(5e-4)
    assert at.number_input(key="finetune_steps").value == 7                  # same default: the user's value stays
    assert at.number_input(key="finetune_eval_every").value == default_record_every(7)
    at.radio(key="finetune_mode").set_value("one run").run()
    assert at.number_input(key="finetune_sfa_beta").value == SFA_BETA
    assert not at.exception and not at.warning
