"""The Models page's claims in the app's words (forgetlab.zoo.claim_reasons through ZooClaims.to_frame): grouped
(fine-tunes, fixes, merges), each merge named as the app names its method with that method's own paper, and
every ✗ saying why, from its own numbers against the claim's threshold — also for claims an older build stored
(registry names in the text, one source for every merge, non-finite numbers stored as None)."""
from __future__ import annotations

import inspect

from forgetlab.analysis.linearity import LinearitySettings
from forgetlab.merge import METHODS
from forgetlab.zoo.claim_reasons import held_text, per_nat_text
from forgetlab.zoo.claims import Claim, ZooClaims, zoo_claims
from forgetlab.zoo.presets import ClaimsSpec, get_spec


def _claims(**settings) -> ZooClaims:
    """Claims as an older build stored them (registry names, one source for all merges), through JSON."""
    old_source = "PCB-merging / submodule-linearity merging"
    claims = [
        Claim("finetune:math", "fine-tuning math gains math and costs general ability", "catastrophic forgetting",
              False, "math EM 0.00 → 0.00 …", {"task": "math", "exact_match": [0.0, 0.0], "answer_loss": [2.0, 1.5],
                                                "general_loss": [4.0, 3.9], "gain": 0.0, "forgetting": -0.1}),
        Claim("finetune:code", "fine-tuning code gains code and costs general ability", "catastrophic forgetting",
              True, "…", {"task": "code", "exact_match": [0.1, 0.9], "answer_loss": [2.0, 0.5],
                          "general_loss": [4.0, 4.2], "gain": 0.8, "forgetting": 0.2}),
        Claim("distinct", "the tasks are distinct …", "task arithmetic / TIES", False, "…",
              {"cosines": {"math–code": 0.45, "math–translate": 0.1}, "max_cosine": 0.45,
               "off_task_share": {"math": {"code": 0.5, "translate": 0.0}}, "max_off_task_share": 0.5}),
        Claim("wise_ft", "WiSE-FT α = 0.5 …", "WiSE-FT", False, "…",
              {"math": {"task": "math", "recovered": -0.25, "kept": 0.4}}),
        Claim("fapm", "FAPM ratio 0.9 …", "FAPM", False, "…",
              {"math": {"fapm_gain": -0.2, "fapm_forgetting": 0.01, "fapm_efficiency": float("-inf"),
                        "wise_gain": 0.3, "wise_forgetting": 0.0, "wise_efficiency": float("inf")}}),
        Claim("linearity", "submodules … lower NLS", "submodule linearity", False, "math: model 0.56 vs …",
              {"math": {"model": 0.5781, "layer": 0.2, "attn": 0.61234, "mlp": 0.1, "head": 0.3}}),
        Claim("merge:iso_c", "a iso_c merge of the fine-tunes keeps their own-task gains better than their weight "
              "average", old_source, False, "…", {"mean_share": 0.52, "average_mean_share": 0.95}),
        Claim("merge:ties", "a ties merge of the fine-tunes keeps their own-task gains better than their weight "
              "average", old_source, True, "…", {"mean_share": 0.99, "average_mean_share": 0.95}),
        Claim("merge:della", "a della merge …", old_source, None, "…", {"mean_share": None}),
    ]
    return ZooClaims.from_dict(ZooClaims(claims, {"measure": "exact_match", **settings}).to_dict())


def test_claims_are_grouped_and_merges_use_display_names_and_their_own_papers():
    frame = _claims().to_frame().set_index("key")
    assert list(frame.columns) == ["group", "holds", "claim", "why not", "measured", "source"]
    assert frame["group"].to_dict() == {
        "finetune:math": "finetune", "finetune:code": "finetune", "distinct": "finetune", "linearity": "finetune",
        "wise_ft": "fixes", "fapm": "fixes", "merge:iso_c": "merges", "merge:ties": "merges",
        "merge:della": "merges"}
    assert frame.loc["merge:iso_c", "claim"].startswith("an Iso-C merge of the fine-tunes")
    assert frame.loc["merge:ties", "claim"].startswith("a TIES merge")
    assert "iso_c" not in frame.loc["merge:iso_c", "claim"]
    assert frame.loc["merge:della", "claim"].startswith("a DELLA merge")
    from forgetlab.zoo.claim_reasons import merge_claim_text

    assert merge_claim_text("pcb").startswith("a PCB merge") and merge_claim_text("tsv").startswith("a TSV merge")
    assert merge_claim_text("slwm").startswith("a submodule-linearity merge of")
    papers = {k: frame.loc[k, "source"] for k in ("merge:iso_c", "merge:ties", "merge:della")}
    assert papers == {"merge:iso_c": METHODS["iso_c"].paper, "merge:ties": METHODS["ties"].paper,
                      "merge:della": METHODS["della"].paper}
    assert len(set(papers.values())) == 3                                   # each merge its own paper
    assert frame.loc["wise_ft", "source"] == METHODS["wise_ft"].paper
    assert frame.loc["linearity", "source"] == METHODS["slwm"].paper


def test_every_failing_claim_says_why_from_its_numbers_and_threshold():
    why = _claims().to_frame().set_index("key")["why not"]
    assert why["finetune:code"] == "" and why["merge:ties"] == ""            # holds: nothing to explain
    assert "no gain on math: exact match 0.00 → 0.00" in why["finetune:math"]
    assert "no forgetting: held-out loss 4.000 → 3.900 (-0.100 nats" in why["finetune:math"]
    assert "cos math–code 0.45 > 0.3" in why["distinct"] and "math–translate" not in why["distinct"]
    assert "the code fine-tune gains 50% of the math fine-tune's gain on math" in why["distinct"]
    assert why["wise_ft"] == "math: recovers -25% of the forgetting (the claim needs > 0%)"
    # infinite efficiencies are stored as None: the reason is rebuilt from the gains and forgettings
    assert why["fapm"].startswith("math: FAPM no gain (-0.20) vs WiSE-FT +0.30 with no forgetting")
    assert why["linearity"] == "math: NLS attn 0.612 not below the whole model's 0.578"
    assert "keeps 52% of the fine-tunes' gains on average, the weight average 95%" in why["merge:iso_c"]
    assert why["merge:della"].startswith("not measurable")
    assert per_nat_text(0.3, 0.02) == "15.00 EM per nat"


def test_group_headings_count_the_claims_that_hold():
    frame = _claims().to_frame()
    counts = {g: held_text(rows["holds"]) for g, rows in frame.groupby("group")}
    assert counts == {"finetune": "1 of 4 claims hold", "fixes": "0 of 2 claims hold",
                      "merges": "1 of 3 claims hold (1 not measurable)"}
    assert held_text(["✓"]) == "1 of 1 claim holds"


def test_the_claims_nls_is_the_linearity_pages_number_or_says_what_differs():
    """One number for a model's NLS: the claims measure it as the Linearity page does at its defaults (its
    samples and α grid); claims stored with other samples say so beside their numbers."""
    default = LinearitySettings().samples
    assert inspect.signature(zoo_claims).parameters["nls_samples"].default == default
    assert ClaimsSpec().nls_samples == default and get_spec("pico").claims.nls_samples == default
    same = _claims(nls_samples=default).to_frame().set_index("key").loc["linearity", "measured"]
    assert "probe samples" not in same
    older = _claims(nls_samples=12).to_frame().set_index("key").loc["linearity", "measured"]
    assert older.endswith(f"measured on 12 probe samples; the Linearity page's default, {default}, gives other "
                          "NLS values")
