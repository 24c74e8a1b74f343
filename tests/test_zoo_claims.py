""""What this zoo shows": the claims are measured from the zoo's models (change a model, the table changes),
stored in the manifest, shown by `forgetlab zoo show` and by the Models page's view."""
from __future__ import annotations

import json
import math

import pytest
import torch

from forgetlab.core.errors import ParameterError, ProbeDataError
from forgetlab.zoo.claim_reasons import GROUPS
from forgetlab.zoo.claims import MERGE_METHODS, Claim, ZooClaims, stored_claims, zoo_claims

TASKS = ("math", "code", "translate")
SMALL = dict(max_general=6, max_task=12, nls_samples=3, slwm_samples=3, measure="answer_loss")


@pytest.fixture(scope="module")
def zoo_pool(pico_zoo):
    from forgetlab.core.pool import ModelPool

    return ModelPool.from_yaml(pico_zoo.pool_yaml)


@pytest.fixture(scope="module")
def measured(zoo_pool):
    """Claims of two full fine-tunes and one adapter of the tiny zoo, measured now with small limits."""
    return zoo_claims(zoo_pool, models={"math": "math", "translate": "translate", "lora-code": "code"},
                      merges=("ties",), **SMALL)


def test_the_build_stores_every_claim_in_the_manifest(pico_zoo):
    claims = pico_zoo.claims()
    assert isinstance(claims, ZooClaims)
    keys = [c.key for c in claims.claims]
    models = [*TASKS, *(f"lora-{t}" for t in TASKS)]
    assert keys == [*(f"finetune:{m}" for m in models), "distinct", "wise_ft", "fapm", "linearity",
                    *(f"merge:{m}" for m in MERGE_METHODS)]
    assert all(c.holds in (True, False, None) and c.numbers for c in claims.claims)
    frame = claims.to_frame()
    assert list(frame.columns) == ["group", "holds", "claim", "why not", "measured", "source", "key"]
    assert (frame["why not"] != "").tolist() == (frame["holds"] != "✓").tolist()    # every ✗ and – says why
    assert set(frame["holds"]) <= {"✓", "✗", "–"}
    assert claims.settings["max_task"] == 32 and claims.seconds > 0
    # stored as strict JSON (no NaN/Infinity) and round-tripped exactly
    text = (pico_zoo.root / "manifest.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in the manifest"))
    assert ZooClaims.from_dict(claims.to_dict()).to_dict() == claims.to_dict()
    assert stored_claims(pico_zoo.pool_yaml).to_dict() == claims.to_dict()
    assert stored_claims(pico_zoo.root).to_dict() == claims.to_dict()


def test_finetune_claims_are_the_models_own_evaluation(zoo_pool, measured):
    """The numbers of claim (a) are what evaluate() gives for the models, with the same limits."""
    from forgetlab.core.evaluate import evaluate

    for name, task in (("math", "math"), ("lora-code", "code")):
        card = evaluate(zoo_pool.load(name), zoo_pool.tokenizer, zoo_pool.probes, name=name,
                        max_general=SMALL["max_general"], max_task=SMALL["max_task"])
        base = evaluate(zoo_pool.load("base"), zoo_pool.tokenizer, zoo_pool.probes, name="base",
                        max_general=SMALL["max_general"], max_task=SMALL["max_task"])
        v = measured.get(f"finetune:{name}").values
        assert v["general_loss"] == pytest.approx([base.general_loss, card.general_loss])
        assert v["exact_match"] == pytest.approx([base.tasks[task].exact_match, card.tasks[task].exact_match])
        assert v["forgetting"] == pytest.approx(card.general_loss - base.general_loss)
        assert measured.get(f"finetune:{name}").holds == (v["gain"] > 0 and v["forgetting"] > 0)
    # WiSE-FT and FAPM only for the full fine-tunes; the merge of the two full fine-tunes beside their average
    assert set(measured.get("wise_ft").values) == {"math", "translate"}
    assert set(measured.get("fapm").values) == {"math", "translate"}
    lin = measured.get("linearity").values["math"]
    assert set(lin) == {"model", "layer", "attn", "mlp", "head"} and all(math.isfinite(x) for x in lin.values())
    assert [c.key for c in measured.claims if c.key.startswith("merge:")] == ["merge:ties"]
    shares = measured.get("merge:ties").values["shares"]
    assert set(shares) == {"math", "translate"}


def test_the_claims_nls_is_the_linearity_analysis_number(zoo_pool, measured):
    """One number for a model's NLS: the claim's equals what the Linearity page computes (the linearity analysis
    with its default α grid and levels) on the same probe samples, and its text shows it as that page does."""
    from forgetlab.analysis.linearity import ANALYSIS, LinearitySettings
    from forgetlab.zoo.claim_reasons import nls_text

    result = ANALYSIS.run(zoo_pool, LinearitySettings(task="math", model="math", samples=SMALL["nls_samples"]))
    page = result.by_level().set_index("level")["nls_mean"]
    claim = measured.get("linearity")
    for level, value in claim.values["math"].items():
        assert value == pytest.approx(page[level], rel=1e-6), level
    assert f"math: model {nls_text(page['model'])} vs " in claim.numbers
    assert f"{SMALL['nls_samples']} probe samples" in claim.numbers


def test_distinct_tasks_claim_is_plain_torch_cosines_and_off_task_gains(zoo_pool, measured):
    """The `distinct` row, computed another way: cosines of the flattened task vectors read with safetensors
    alone, and the off-task gain as a share of the own-task gain from the models' own scorecards."""
    from safetensors.torch import load_file

    from forgetlab.core.evaluate import evaluate

    def flat(name):
        path = zoo_pool.base.path if name == "base" else zoo_pool.checkpoint(name).path
        sd = load_file(str(path / "model.safetensors"))
        return torch.cat([sd[k].double().flatten() for k in sorted(sd)])

    base = flat("base")
    tm, tt = flat("math") - base, flat("translate") - base
    expected = float(tm @ tt / (tm.norm() * tt.norm()))
    row = measured.get("distinct")
    assert row.values["cosines"]["math–translate"] == pytest.approx(expected, abs=1e-5)
    kw = dict(max_general=SMALL["max_general"], max_task=SMALL["max_task"])
    cards = {n: evaluate(zoo_pool.load(n), zoo_pool.tokenizer, zoo_pool.probes, name=n, **kw)
             for n in ("base", "math", "translate")}
    loss = lambda n, t: cards[n].tasks[t].answer_loss  # noqa: E731 - SMALL measures the answer loss
    own = loss("base", "translate") - loss("translate", "translate")
    share = (loss("base", "translate") - loss("math", "translate")) / own
    assert row.values["off_task_share"]["translate"]["math"] == pytest.approx(share, rel=1e-6)
    worst = max(v for d in row.values["off_task_share"].values() for v in d.values())
    assert row.holds == (row.values["max_cosine"] <= 0.3 and worst <= 1 / 3)


def test_claims_measure_mergekit_and_closed_form_merges_as_forgetlab_merges_them(zoo_pool):
    """A merge row of any many-model method is the registry's merge of the full fine-tunes, scored like the rest:
    model_stock (mergekit), DELLA at the claims' density 0.5, and RegMean with statistics from each task's probes."""
    from forgetlab.core.evaluate import evaluate
    from forgetlab.merge.api import merge_state_dicts
    from forgetlab.zoo.claims import CLAIM_PARAMS

    models = {"math": "math", "translate": "translate"}
    got = zoo_claims(zoo_pool, models=models, merges=("model_stock", "della", "regmean"), **SMALL)
    assert [c.key for c in got.claims if c.key.startswith("merge:")] == ["merge:model_stock", "merge:della",
                                                                         "merge:regmean"]
    assert got.get("merge:della").values["params"] == CLAIM_PARAMS["della"] == {"density": 0.5}
    base = zoo_pool.load("base")
    sd = lambda n: {k: v.float() for k, v in zoo_pool.load(n).state_dict().items()}  # noqa: E731
    merged = merge_state_dicts("model_stock", sd("base"), [sd("math"), sd("translate")], config=base.config)
    base.load_state_dict(merged, strict=False)
    card = evaluate(base, zoo_pool.tokenizer, zoo_pool.probes, name="m", tasks=["math", "translate"],
                    max_general=SMALL["max_general"], max_task=SMALL["max_task"])
    assert got.get("merge:model_stock").values["general_loss"] == pytest.approx(card.general_loss, rel=1e-6)
    with pytest.raises(ParameterError, match="Unknown claim merge"):
        zoo_claims(zoo_pool, models=models, merges=("slerp",), **SMALL)


def test_changing_a_model_changes_the_table(zoo_pool, measured, tmp_path):
    """Replace the math fine-tune by a copy of the base: its gain and its forgetting become exactly 0, so
    claim (a) fails for it and the WiSE-FT/merge numbers move — nothing is copied from constants."""
    from forgetlab.core.pool import ModelPool

    pool = ModelPool(zoo_pool.base.path, {"math": str(zoo_pool.base.path),
                                          "translate": str(zoo_pool.checkpoint("translate").path),
                                          "lora-code": {"adapter": str(zoo_pool.checkpoint("lora-code").path)}},
                     probes=zoo_pool.probes)
    changed = zoo_claims(pool, models={"math": "math", "translate": "translate", "lora-code": "code"},
                         merges=("ties",), **SMALL)
    a = changed.get("finetune:math")
    assert a.values["gain"] == 0 and a.values["forgetting"] == pytest.approx(0, abs=1e-6) and a.holds is False
    assert changed.get("finetune:translate").values == measured.get("finetune:translate").values
    assert changed.get("merge:ties").values != measured.get("merge:ties").values
    assert changed.to_frame()["measured"].tolist() != measured.to_frame()["measured"].tolist()
    # no gain to keep: WiSE-FT's kept share is undefined for math, so the claim cannot hold for it
    assert changed.get("wise_ft").values["math"]["kept"] != changed.get("wise_ft").values["math"]["kept"]  # NaN


def test_claims_on_a_pool_that_is_not_a_zoo(pool):
    """The tiny random pool: models ft0/ft1 are not named after tasks, so the models must be given."""
    assert stored_claims(pool) is None
    with pytest.raises(ParameterError, match="models="):
        zoo_claims(pool, **SMALL)
    with pytest.raises(ParameterError, match="no fine-tuned model 'nope'"):
        zoo_claims(pool, models={"nope": pool.task_names[0]}, **SMALL)
    with pytest.raises(ProbeDataError, match="no task 'nope'"):
        zoo_claims(pool, models={"ft0": "nope"}, **SMALL)
    with pytest.raises(ParameterError, match="measure"):
        zoo_claims(pool, models={"ft0": pool.task_names[0]}, measure="bleu")
    with pytest.raises(ParameterError, match="merge"):
        zoo_claims(pool, models={"ft0": pool.task_names[0]}, merges=("soup",))
    with pytest.raises(ParameterError, match="nls_samples"):
        zoo_claims(pool, models={"ft0": pool.task_names[0]}, nls_samples=0)


def test_claim_marks_and_lookup():
    c = ZooClaims([Claim("a", "x", "p", True, "1"), Claim("b", "y", "p", False, "2"), Claim("c", "z", "p", None, "3")])
    assert c.to_frame()["holds"].tolist() == ["✓", "✗", "–"]
    with pytest.raises(ParameterError, match="No claim 'd'.*a, b, c"):
        c.get("d")
    d = ZooClaims([Claim("a", "x", "p", True, "1", {"v": float("inf"), "w": [float("nan"), 1.0]})]).to_dict()
    assert d["claims"][0]["values"] == {"v": None, "w": [None, 1.0]}


def test_zoo_show_prints_the_claims(pico_zoo, zoo_home, capsys):
    from forgetlab.cli import main

    assert main(["zoo", "show", "--size", "tiny", "--home", str(zoo_home)]) == 0
    out = capsys.readouterr().out
    assert "What this zoo shows" in out
    for c in pico_zoo.claims().claims:
        assert c.key in out
    frame = pico_zoo.claims().to_frame()           # every ✗ and – says why, in the page's words
    assert out.count("why not: ") == int((frame["holds"] != "✓").sum())
    for text in frame["why not"]:
        assert text in out


def test_models_page_view_draws_the_claims_only_for_a_zoo(pico_zoo, tiny_llama):
    from streamlit.testing.v1 import AppTest

    def page(pool_yaml: str):
        import streamlit as st

        from forgetlab.core.pool import ModelPool
        from forgetlab.ui.zoo_claims import render_zoo_claims

        drawn = render_zoo_claims(ModelPool.from_yaml(pool_yaml))
        st.text(f"drawn={drawn}")

    at = AppTest.from_function(page, args=(str(pico_zoo.pool_yaml),)).run(timeout=60)
    assert not at.exception
    assert [s.value for s in at.subheader] == ["What this zoo shows"]
    frame = pico_zoo.claims().to_frame()
    groups = [g for g, _, _ in GROUPS if g in set(frame["group"])]
    # one static table per group (whole: no inner scroll), each in a folded expander
    assert at.text[-1].value == "drawn=True" and len(at.table) == len(groups) == 3 and not at.dataframe
    assert len(at.expander) == 3 and not any(e.proto.expanded for e in at.expander)
    for table, group in zip(at.table, groups):
        rows = frame[frame["group"] == group]
        assert table.value["claim"].tolist() == rows["claim"].tolist()
        assert table.value["measured"].tolist() == rows["measured"].tolist()

    at = AppTest.from_function(page, args=(str(tiny_llama.pool_yaml),)).run(timeout=60)
    assert not at.exception and not at.subheader and at.text[-1].value == "drawn=False"
