"""The zoo's task-sequence claims (forgetlab.zoo.sequence_claims): each claim against hand-made score matrices, its
reasons when it fails, and the build step that measures them on a zoo's own models."""
from __future__ import annotations

from dataclasses import replace

import pytest

from forgetlab.train.defaults import sequence_defaults
from forgetlab.train.sequence import DEFAULT_COMPARE, stage_budgets
from forgetlab.train.sequence_results import SequenceChain, SequenceResult, StageScores
from forgetlab.zoo.build import _Builder
from forgetlab.zoo.claim_reasons import claim_group, why_not
from forgetlab.zoo.claims import ZooClaims
from forgetlab.zoo.presets import SequenceClaimsSpec, get_spec, zoo_stage_budgets
from forgetlab.zoo.sequence_claims import sequence_claims, sequence_table

ORDER = ["math", "code"]


def stage(i, em) -> StageScores:
    return StageScores(stage=i, after_task=None if i == 0 else ORDER[i - 1], exact_match=dict(zip(ORDER, em)),
                       answer_loss={t: 1.0 - v for t, v in zip(ORDER, em)}, general_loss=4.0 + 0.1 * i)


def result(rows: dict[str, list[list[float]]]) -> SequenceResult:
    """Chains whose exact-match rows after stages 1 and 2 are given (the base scores 0 on both tasks)."""
    chains = [SequenceChain(m, [stage(1, r[0]), stage(2, r[1])], seconds=10.0) for m, r in rows.items()]
    return SequenceResult(order=ORDER, base=stage(0, [0.0, 0.0]), chains=chains)


# OP = mean of the last row; BWT (TRACE) = (R[2, math] − R[1, math]) / 2; retained = R[2, math] / R[1, math]
GOOD = {"adamw": [[0.8, 0.0], [0.2, 0.8]],          # OP 0.5,  BWT −0.30, retained 25 %
        "mofo": [[0.8, 0.0], [0.6, 0.8]],           # OP 0.7,  BWT −0.10
        "sfa": [[0.8, 0.0], [0.7, 0.6]],            # OP 0.65, BWT −0.05
        "proximal": [[0.8, 0.0], [0.4, 0.8]],       # OP 0.6,  BWT −0.20
        "ewc": [[0.8, 0.0], [0.5, 0.8]],            # OP 0.65, BWT −0.15
        "replay": [[0.8, 0.0], [0.7, 0.7]],         # OP 0.7,  BWT −0.05
        "mofo+replay": [[0.8, 0.0], [0.8, 0.8]]}    # OP 0.8,  BWT 0


def test_every_claim_holds_on_a_sequence_made_to_show_them():
    claims = {c.key: c for c in sequence_claims(result(GOOD))}
    assert list(claims) == ["sequence:forgets", "sequence:sfa", "sequence:mofo", "sequence:between",
                            "sequence:mofo+replay"]
    assert all(c.holds for c in claims.values())
    assert "BWT -0.300" in claims["sequence:forgets"].numbers and "25%" in claims["sequence:forgets"].numbers
    assert all(claim_group(k) == "sequence" for k in claims)


@pytest.mark.parametrize("change,key,reason", [
    ({"adamw": [[0.8, 0.0], [0.6, 0.8]]}, "sequence:forgets", "keeps 75% of its gain, not less than half"),
    ({"sfa": [[0.8, 0.0], [0.5, 0.6]]}, "sequence:sfa", "more than 0.05 below replay's"),
    ({"mofo": [[0.8, 0.0], [0.2, 0.7]]}, "sequence:mofo", "MoFO's OP 0.45 is not above AdamW's 0.50"),
    ({"ewc": [[0.8, 0.0], [0.9, 0.8]]}, "sequence:between", "EWC's bwt 0.050 is outside [-0.300, -0.100]"),
    ({"mofo+replay": [[0.8, 0.0], [0.6, 0.7]]}, "sequence:mofo+replay", "is not above MoFO's"),
])
def test_a_claim_that_fails_says_which_number_fails(change, key, reason):
    claims = ZooClaims(sequence_claims(result({**GOOD, **change})), settings={"measure": "exact_match"})
    claim = claims.get(key)
    assert claim.holds is False
    assert reason in why_not(claim)
    stored = ZooClaims.from_dict(claims.to_dict()).get(key)    # a stored claim explains itself the same way
    assert why_not(stored) == why_not(claim)


def test_the_demo_table_has_a_row_per_chain():
    rows = sequence_table(result(GOOD))
    assert [r["method"] for r in rows] == list(GOOD)
    adamw = rows[0]
    assert (adamw["op"], adamw["bwt"], adamw["retained"]) == (pytest.approx(0.5), pytest.approx(-0.3),
                                                              pytest.approx(0.25))
    assert adamw["general_loss"] == pytest.approx(4.2) and adamw["seconds"] == 10.0


def test_the_claims_need_every_compared_chain():
    with pytest.raises(KeyError, match="ewc"):
        sequence_claims(result({k: v for k, v in GOOD.items() if k != "ewc"}))


def test_the_pico_preset_measures_the_default_comparison():
    seq = get_spec("pico", "default").claims.sequence
    assert seq is not None and tuple(seq.methods) == DEFAULT_COMPARE and list(seq.order) == ["math", "code", "translate"]


def test_the_build_step_measures_the_claims_on_the_zoos_models_with_the_pages_budgets(pico_zoo):
    spec = get_spec("pico", "tiny")
    seq = SequenceClaimsSpec(order=("math", "code"), steps=2, lr=1e-3)
    spec = replace(spec, claims=replace(spec.claims, sequence=seq))
    part = _Builder(spec, pico_zoo.root).run_sequence_claims(progress=None)
    assert [c["key"] for c in part["claims"]] == ["sequence:forgets", "sequence:sfa", "sequence:mofo",
                                                  "sequence:between", "sequence:mofo+replay"]
    assert [r["method"] for r in part["sequence"]["table"]] == list(DEFAULT_COMPARE)
    budgets = zoo_stage_budgets(spec, ["math", "code"], seq)
    assert {b.steps for b in budgets.values()} == {2} and {b.lr for b in budgets.values()} == {1e-3}


def test_a_built_zoo_hands_its_sequence_to_the_page_and_the_cli(pico_zoo):
    """The tiny preset measures no sequence: the page falls back to its own defaults and the pool's recipe."""
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(pico_zoo.pool_yaml)
    assert sequence_defaults(pool) is None
    spec = get_spec("pico", "tiny")
    assert stage_budgets(pool, ["math"])["math"].steps == spec.finetune_for("math").steps
    assert zoo_stage_budgets(spec, ["math"])["math"].steps == spec.finetune_for("math").steps


def test_the_zoos_sequence_settings_are_the_page_and_cli_defaults_on_it(tmp_path):
    """The budgets the build measures its claims with (from the preset) are the ones the Sequence page and
    `forgetlab sequence` read back from the built zoo's manifest; given values win; LoRA keeps its own recipe."""
    import json
    from types import SimpleNamespace

    spec = get_spec("pico", "default")
    (tmp_path / "manifest.json").write_text(json.dumps({"settings": spec.to_dict()}))
    pool = SimpleNamespace(source=str(tmp_path / "pool.yaml"))
    zoo = sequence_defaults(pool)
    assert zoo.order == ("math", "code", "translate") and zoo.methods == DEFAULT_COMPARE and zoo.lr == 1e-3
    order = list(zoo.order)
    assert stage_budgets(pool, order) == {t: replace(b, source=stage_budgets(pool, order)[t].source)
                                          for t, b in zoo_stage_budgets(spec, order, spec.claims.sequence).items()}
    assert {b.lr for b in stage_budgets(pool, order).values()} == {1e-3}
    assert {b.lr for b in stage_budgets(pool, order, lr=5e-4).values()} == {5e-4}
    assert {b.lr for b in stage_budgets(pool, order, lora=True).values()} == {spec.lora.train.lr}


def test_the_takeaway_says_what_the_first_task_kept_in_exact_match_or_else_in_answer_loss():
    from forgetlab.analysis.sequence import takeaway

    lines = takeaway(result(GOOD))
    assert lines[0].startswith("Share of the first task's (math) exact-match gain left after the last stage: adamw 25%;")
    assert "mofo+replay ends with the highest overall exact match (OP 0.80)" in lines[1]
    # no chain ever answers exactly: the answer loss (1 − exact match here) tells the story instead
    flat = result({m: [[0.0, 0.0], [0.0, 0.0]] for m in GOOD})
    for c in flat.chains:
        c.stages[0].answer_loss["math"], c.stages[1].answer_loss["math"] = 0.6, 0.9     # gained 0.4, kept 0.1
    lines = takeaway(flat)
    assert lines[0].startswith("Share of the first task's (math) answer-loss gain left after the last stage: adamw 25%")
    assert "ends with the lowest mean answer loss" in lines[1]
