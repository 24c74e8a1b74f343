"""Every analysis ends with a takeaway: one or two plain sentences built from its result, naming its largest
effect with the number and its unit (issue 43, item 2). Each takeaway function is tested on hand-made results:
the number in the sentence is the result's largest effect (computed here from the result's own fields), the sign
and the unit are right, and a tie or an empty result does not crash."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from forgetlab.analysis.attribution_results import AttributionResult, AttributionRow
from forgetlab.analysis.attribution_results import takeaway as attribution_takeaway
from forgetlab.analysis.base import ANALYSES
from forgetlab.analysis.features_results import TsneResult
from forgetlab.analysis.features_results import takeaway as features_takeaway
from forgetlab.analysis.finetune import takeaway as finetune_takeaway
from forgetlab.analysis.lambda_search import LambdaSearchResult
from forgetlab.analysis.lambda_search import takeaway as pcb_takeaway
from forgetlab.analysis.linearity_results import NonlinearityResult, SubmoduleScore
from forgetlab.analysis.linearity_results import takeaway as linearity_takeaway
from forgetlab.analysis.measures import best_tradeoff, change_text, value_text
from forgetlab.analysis.retention import merge_retention
from forgetlab.analysis.retention import takeaway as merge_takeaway
from forgetlab.analysis.search_results import SearchPoint, SearchResult
from forgetlab.analysis.search_results import takeaway as search_takeaway
from forgetlab.analysis.slwm_weights import takeaway as slwm_takeaway
from forgetlab.analysis.sweep_analysis import takeaway as sweep_takeaway
from forgetlab.analysis.sweep_results import SweepPoint, SweepResult
from forgetlab.analysis.taskvec import TaskvecResult
from forgetlab.analysis.taskvec import takeaway as taskvec_takeaway
from forgetlab.analysis.textdiff_results import COLUMNS, TextDiffResult
from forgetlab.analysis.textdiff_results import takeaway as textdiff_takeaway
from forgetlab.core.anatomy import part_words
from forgetlab.core.evaluate import Scorecard, TaskScore, scorecards_takeaway
from forgetlab.core.taskvectors import CosineMatrix, TaskVectorNorms
from forgetlab.merge.methods.slwm import SlwmWeights, SubmoduleWeights
from forgetlab.train.results import FinetuneComparison, FinetuneConfig, FinetuneRun
from forgetlab.train.trainer import TrainResult


def card(name: str, general_loss: float, **tasks: tuple[float, float]) -> Scorecard:
    """A scorecard: general loss and, per task, (exact match, answer loss)."""
    return Scorecard(name, general_loss, math.exp(general_loss), 100,
                     {t: TaskScore(t, em, al, 10) for t, (em, al) in tasks.items()})


def test_every_registered_analysis_has_a_takeaway():
    missing = [name for name, a in ANALYSES.items() if a.takeaway_fn is None]
    assert not missing, f"analyses without a takeaway: {missing}"


def test_part_words_names_parts_in_plain_words():
    assert part_words(0, "mlp") == "layer 0's MLP"
    assert part_words(2, "attn", 3) == "layer 2's attention head 3"
    assert part_words(1, "layer") == "layer 1"
    assert part_words(None, "embed") == "the embeddings"
    assert part_words(-1, "other") == "the weights outside the layers"
    assert part_words(pd.NA, "lm_head", pd.NA) == "the output head"


def test_value_and_change_texts_carry_their_units():
    assert value_text("exact_match", 0.625) == "exact match 0.62"
    assert value_text("answer_loss", 2.31) == "answer loss 2.310 nats"
    assert change_text("exact_match", 0.5) == "+0.50 exact match"
    assert change_text("answer_loss", -0.83) == "-0.830 nats of answer loss"
    assert change_text("general_loss", 0.049).startswith("+0.049 nats (perplexity +5.0 %")


# ---------------------------------------------------------------------------------------------- linearity

def score(level: str, layer, head, nls: float) -> SubmoduleScore:
    return SubmoduleScore(level, layer, head, "m", np.zeros((2, 2)), np.array([nls, nls]), np.zeros(2))


def linearity(scores) -> NonlinearityResult:
    return NonlinearityResult("math", "math", (0.0, 0.5), 2, "finetuned", ("model", "attn", "mlp"), scores)


def test_linearity_names_the_least_and_the_most_linear_part():
    lines = linearity_takeaway(linearity([score("model", None, None, 0.578), score("attn", 0, None, 0.021),
                                          score("mlp", 1, None, 0.412), score("mlp", 0, None, float("nan"))]))
    assert len(lines) == 2
    assert lines[0].startswith("Layer 1's MLP is the least linear part") and "0.412" in lines[0]
    assert "layer 0's attention the most linear (0.021)" in lines[0]
    assert "whole model scores 0.578" in lines[0]
    assert "straight line" in lines[1]


def test_linearity_tie_model_only_and_empty():
    tie = linearity_takeaway(linearity([score("attn", 0, None, 0.2), score("mlp", 0, None, 0.2)]))
    assert "0.200" in tie[0]
    assert "0.578" in linearity_takeaway(linearity([score("model", None, None, 0.578)]))[0]
    assert linearity_takeaway(linearity([])) == []
    assert linearity_takeaway(linearity([score("mlp", 0, None, float("nan"))])) == []


# ---------------------------------------------------------------------------------------------- sweeps

def test_best_tradeoff_is_the_front_point_with_most_rescaled_speciality_for_least_loss():
    # speciality rises fast then flattens; general loss rises steadily: the knee is the second point
    assert best_tradeoff([0.0, 0.8, 0.9, 1.0], [4.0, 4.1, 4.3, 4.6]) == 1
    assert best_tradeoff([0.5, 0.5], [4.0, 4.0]) == 0                    # a tie: the first
    assert best_tradeoff([], []) is None
    assert best_tradeoff([float("nan")], [4.0]) is None


def sweep(points, measure: str = "exact_match") -> SweepResult:
    pts = [SweepPoint("wise-ft", a, {}, card("m", g, math=(em, al)), 0.0) for a, em, al, g in points]
    return SweepResult("alpha", "math", "math", "alpha", pts, measure=measure)


def test_sweep_names_its_best_tradeoff_with_its_numbers():
    r = sweep([(0.0, 0.0, 3.0, 4.0), (0.5, 0.8, 2.0, 4.1), (1.0, 1.0, 1.5, 4.6)])
    lines = sweep_takeaway(r)
    assert lines[0].startswith("Best trade-off: wise-ft at α 0.5 scores exact match 0.80 on math for +0.100 nats")
    assert "wise-ft at α 0, the point that forgets least" in lines[0]
    assert "wise-ft at α 1" in lines[1] and "exact match 1.00" in lines[1] and "+0.600 nats" in lines[1]


def test_sweep_in_answer_loss_tie_and_empty():
    r = sweep([(0.0, 0.0, 3.0, 4.0), (0.5, 0.0, 2.0, 4.1), (1.0, 0.0, 1.5, 4.6)], measure="answer_loss")
    lines = sweep_takeaway(r)
    assert lines[0].startswith("Best trade-off: wise-ft at α 0.5 scores answer loss 2.000 nats on math for +0.100")
    r.measure = "exact_match"         # exact match 0 at every point: the sentence says so and speaks answer loss
    assert sweep_takeaway(r)[0].startswith("Best trade-off in answer loss (exact match does not move along this "
                                           "sweep): wise-ft at α 0.5 scores answer loss 2.000 nats")
    flat = sweep([(0.0, 0.5, 2.0, 4.0), (1.0, 0.5, 2.0, 4.0)])
    assert "wise-ft at α 0, the point that forgets least, scores answer loss 2.000 nats" in sweep_takeaway(flat)[0]
    assert sweep_takeaway(sweep([])) == []


# ---------------------------------------------------------------------------------------------- attribution

def arow(key, layer, module, d_general, d_spec, d_answer, *, zero=False, alpha=1.0, which="only_this"):
    return AttributionRow(which, key, layer, module, None, alpha, 0, 0, 0, d_general, d_spec, d_answer, 1.0, 0.1,
                          zero)


def attribution(rows) -> AttributionResult:
    base = card("base", 4.0, math=(0.0, 3.0))
    return AttributionResult("math", "math", "module", base, base, rows)


def test_attribution_names_the_part_that_buys_most_and_the_part_that_costs_most():
    lines = attribution_takeaway(attribution([
        arow("0.mlp", 0, "mlp", 0.002, 0.5, -1.0), arow("0.attn", 0, "attn", 0.016, 0.0, -0.1),
        arow("1.mlp", 1, "mlp", 0.5, 0.9, -2.0, zero=True),            # τ = 0: not evaluated, left out
        arow("0.mlp", 0, "mlp", 0.9, 0.9, 0.0, which="leave_one_out", alpha=0.0)]))
    assert lines[0] == "Layer 0's MLP alone buys +0.50 exact match on math."
    assert lines[1].startswith("Layer 0's attention alone costs the most general-text loss, +0.016 nats")
    assert lines[1].endswith("and buys nothing in exact match.")


def test_attribution_falls_back_to_answer_loss_and_survives_ties_and_empty():
    lines = attribution_takeaway(attribution([arow("0.mlp", 0, "mlp", 0.01, 0.0, -0.8),
                                              arow("0.attn", 0, "attn", 0.01, 0.0, -0.2)]))
    assert "the largest drop of its answer loss comes from layer 0's MLP: -0.800 nats" in lines[0]
    assert "+0.010 nats" in lines[1]
    assert attribution_takeaway(attribution([])) == []
    none_costs = attribution_takeaway(attribution([arow("embed", None, "embed", -0.002, 0.1, -0.1)]))
    assert none_costs[0].startswith("The embeddings alone buy +0.10") and "-0.002 nats" in none_costs[1]
    norms = attribution_takeaway(attribution([arow("1.norm", 1, "norm", 0.003, 0.1, -0.1)]))
    assert norms[1] == "Layer 1's norms alone cost the most general-text loss, +0.003 nats (perplexity +0.3 %), and buy " \
                       "+0.10 exact match."


# ---------------------------------------------------------------------------------------------- textdiff

def textdiff(tokens) -> TextDiffResult:
    rows = []
    for doc, seq in enumerate(tokens):
        for pos, (tok, cls, rise) in enumerate(seq):
            row = dict.fromkeys(COLUMNS, "")
            row.update({c: 0.1 for c in COLUMNS if c.startswith("p") and c[1:2].isdigit()})
            row.update(doc=doc, position=pos, token_id=pos, token=tok, token_class=cls, logp_base=-1.0,
                       logp_model=-1.0 - rise, rise=rise, kl=abs(rise))
            rows.append(row)
    return TextDiffResult("math", "base", "heldout", pd.DataFrame(rows, columns=COLUMNS), [f"d{i}" for i in
                                                                                          range(len(tokens))])


def test_textdiff_gives_the_mean_rise_and_the_class_that_rises_most():
    seq = [("The", "word", 0.0), (" cat", "word", 0.2), (" 12", "number", 0.9), (".", "punctuation", -0.1),
           (" 12", "number", 0.7)]
    r = textdiff([seq, seq])
    lines = textdiff_takeaway(r)
    scored = r.to_frame()[r.to_frame()["position"] > 0]
    assert f"rises by {scored['rise'].mean():+.4f} nats per token" in lines[0] and "8 tokens" in lines[0]
    numbers = scored[scored["token_class"] == "number"]["rise"]
    assert lines[1].startswith(f"Number tokens rise most: {numbers.mean():+.3f} nats each on average")
    assert f"{100 * numbers.sum() / scored['rise'].sum():.0f} % of the total rise" in lines[1]
    assert "the token ' 12' loses most in all, +3.200 nats over 4 occurrences" in lines[1]


def test_textdiff_with_a_falling_loss_and_empty():
    lines = textdiff_takeaway(textdiff([[("a", "word", 0.0), ("b", "word", -0.5), ("c", "word", -0.5)]]))
    assert "rises by -0.5000 nats per token" in lines[0] and "total rise" not in lines[1]
    assert textdiff_takeaway(textdiff([[("a", "word", 0.0)]])) == []


# ---------------------------------------------------------------------------------------------- features

def tsne(distances) -> TsneResult:
    frame = pd.DataFrame(distances, columns=["model", "task_a", "task_b", "distance_tsne", "distance_pca"])
    return TsneResult(pd.DataFrame(columns=["x", "y", "task", "model", "sample"]), frame, "sklearn", 5.0, 12, 0,
                      {"level": "mlp", "layer": 3, "head": None})


def test_features_gives_how_far_apart_the_tasks_sit():
    r = tsne([("base", "math", "code", 1, 8.0), ("base", "math", "translate", 1, 6.0),
              ("math", "math", "code", 1, 12.5), ("math", "math", "translate", 1, 3.0)])
    lines = features_takeaway(r)
    means = r.cluster_summary().set_index("model")["mean_distance_pca"]
    assert lines[0].startswith("Read at layer 3's MLP, the tasks sit furthest apart in the math model: "
                               f"{means['math']:.3g} on average")
    assert f"closest in the base model ({means['base']:.3g})" in lines[0] and "12-dimension PCA" in lines[0]
    assert "math and code are the most separated pair (12.5), math and translate the least (3)" in lines[1]


def test_features_one_model_one_pair_and_no_pair():
    one = features_takeaway(tsne([("math", "math", "code", 1, 2.0)]))
    assert len(one) == 1 and "2 on average" in one[0] and "closest" not in one[0]
    assert features_takeaway(tsne([])) == []


# ---------------------------------------------------------------------------------------------- task vectors

def norms(model: str, mlp: float, outside: float) -> TaskVectorNorms:
    return TaskVectorNorms(model, [
        {"name": "l0.mlp", "layer": 0, "module": "mlp", "part": "up", "numel": 4, "norm": mlp, "base_norm": 1.0,
         "relative": mlp},
        {"name": "embed", "layer": None, "module": None, "part": "embed", "numel": 4, "norm": outside,
         "base_norm": 1.0, "relative": outside}])


def test_taskvec_names_the_module_that_moved_most_and_the_most_and_least_alike_pair():
    cos = CosineMatrix(["math", "code", "translate"], [[1, 0.1, 0.05], [0.1, 1, 0.3], [0.05, 0.3, 1]], [1, 1, 1])
    r = TaskvecResult([norms("math", 0.0123, 0.001), norms("code", 0.0201, 0.002)], cos)
    lines = taskvec_takeaway(r)
    top = r.by_level()["relative"].max()
    assert lines[0] == (f"Fine-tuning changed code most in layer 0's MLP: by {100 * top:.3g} % of the weights' "
                        "size there (the norm of the change over the base's).")
    assert "code's and translate's (cosine similarity 0.300)" in lines[1]
    assert "math's and translate's (0.050" in lines[1]


def test_taskvec_one_model_two_models_and_empty():
    assert len(taskvec_takeaway(TaskvecResult([norms("math", 0.01, 0.02)]))) == 1
    assert "the weights outside the layers" in taskvec_takeaway(TaskvecResult([norms("math", 0.01, 0.02)]))[0]
    two = TaskvecResult([norms("a", 0.01, 0.0), norms("b", 0.01, 0.0)],
                        CosineMatrix(["a", "b"], [[1, -0.25], [-0.25, 1]], [1, 1]))
    assert "cosine similarity of -0.250" in taskvec_takeaway(two)[1]
    assert taskvec_takeaway(TaskvecResult([])) == []


# ---------------------------------------------------------------------------------------------- searches

def search(points, objective: str = "constrained", best: int | None = 1) -> SearchResult:
    pts = [SearchPoint(i, [1.0], speciality=s, forgetting=f, general_loss=4.0 + f) for i, (s, f) in
           enumerate(points)]
    return SearchResult("ties", "weight", ["math"], objective, "exact_match", 0.05, 1.0, 4.0, 0.1, pts, best)


def test_search_gives_the_best_point_its_speciality_and_its_forgetting():
    lines = search_takeaway(search([(0.5, 0.01), (0.7, 0.03), (0.9, 0.2)]))
    assert lines[0].startswith("The best merge found (point 1 of 3) scores exact match 0.70 (the base: exact "
                               "match 0.10) for +0.030 nats")
    assert lines[1] == "It keeps within the forgetting bound of 0.05 nats."
    assert "No point kept" in search_takeaway(search([(0.5, 0.1), (0.7, 0.2)], best=0))[1]
    assert search_takeaway(search([], best=None)) == []


def test_pcb_search_gives_the_loss_it_lowered():
    r = LambdaSearchResult([0.8, 1.2], 2.25, 2.5, [([1.0, 1.0], 2.5), ([0.8, 1.2], 2.25)],
                           recipe={"models": [{"model": "math"}, "code"]})
    lines = pcb_takeaway(r)
    assert lines == ["The search lowered the mean answer loss on the probe split from 2.5000 to 2.2500 nats "
                     "(-0.2500) with the weights math 0.800, code 1.200."]
    assert pcb_takeaway(LambdaSearchResult([], float("nan"), float("nan"))) == []


def test_slwm_weights_gives_the_largest_weight():
    subs = [SubmoduleWeights(0, "attn", None, np.array([0.4, 0.9]), False, np.eye(2)),
            SubmoduleWeights(1, "head", 2, np.array([1.3, 0.5]), False, np.eye(2)),
            SubmoduleWeights(1, "mlp", None, np.array([0.5, 0.5]), True, np.eye(2))]
    lines = slwm_takeaway(SlwmWeights("head_mlp", ["math", "code"], ["math", "code"], 30, 1e-4, "finetuned", subs))
    assert lines[0].startswith("The largest weight is math's in layer 1's attention head 2: 1.300;")
    assert "math 0.733, code 0.633" in lines[0]
    assert lines[1] == "1 of 3 submodules were changed by no task and take equal weights (0.500 each)."
    assert slwm_takeaway(SlwmWeights("layer", ["math"], ["math"], 30, 1e-4, "finetuned", [])) == []


# ---------------------------------------------------------------------------------------------- fine-tune

def run(label: str, start: tuple, final: tuple) -> FinetuneRun:
    return FinetuneRun(FinetuneConfig(label=label), "math", "base", TrainResult(steps=10, completed_steps=10),
                       final=card(label, final[0], math=final[1:]), start_card=card("base", start[0], math=start[1:]))


def test_finetune_gives_each_runs_forgetting_against_its_gain():
    comp = FinetuneComparison("math", "base", [run("adamw", (4.0, 0.0, 3.0), (4.08, 0.9, 1.0)),
                                               run("sfa-p0.25", (4.0, 0.0, 3.0), (4.01, 0.4, 2.0))],
                              {"measure": "exact_match"})
    lines = finetune_takeaway(comp)
    assert "adamw +0.080 nats for +0.90 exact match; sfa-p0.25 +0.010 nats for +0.40 exact match" in lines[0]
    assert lines[1].startswith("sfa-p0.25 forgets least, +0.010 nats") and lines[1].endswith(
        "adamw gains most, +0.90 exact match.")
    comp.recipe["measure"] = "answer_loss"
    assert "adamw gains most, -2.000 nats of answer loss" in finetune_takeaway(comp)[1]


def test_finetune_single_run_and_empty():
    one = FinetuneComparison("math", "base", [run("adamw", (4.0, 0.0, 3.0), (4.05, 0.5, 1.0))])
    assert finetune_takeaway(one) == ["adamw forgot +0.050 nats (perplexity +5.1 %) of general loss and gained "
                                      "+0.50 exact match on math."]
    assert finetune_takeaway(FinetuneComparison("math", "base", [])) == []


# ---------------------------------------------------------------------------------------------- scorecards, merges

def test_scorecards_takeaway_names_the_model_that_forgets_most():
    cards = [card("base", 4.0, math=(0.0, 3.0), code=(0.1, 2.0)), card("math", 4.12, math=(0.9, 1.0), code=(0.1, 2.1)),
             card("code", 4.02, math=(0.0, 3.1), code=(0.6, 1.0))]
    lines = scorecards_takeaway(cards)
    assert lines[0].startswith("math forgets most: its general loss is +0.120 nats (perplexity +12.7 %) above")
    assert "code forgets least, +0.020 nats" in lines[0]
    assert lines[1] == "The largest skill gain is math's on math: exact match 0.00 → 0.90."
    flat = [card("base", 4.0, math=(0.0, 3.0)), card("math", 3.9, math=(0.0, 2.5))]
    lines = scorecards_takeaway(flat)
    assert lines[0].startswith("math forgets most: its general loss is -0.100 nats")
    assert lines[1].endswith("the largest drop of answer loss is math's on math: 3.000 → 2.500 nats.")
    assert scorecards_takeaway([card("math", 4.0, math=(0.0, 1.0))]) == []
    assert scorecards_takeaway([]) == []


def test_merge_takeaway_gives_the_share_of_the_gains_kept_and_the_cost():
    cards = [card("base", 4.0, math=(0.0, 3.0), code=(0.0, 3.0)), card("math", 4.1, math=(0.8, 1.0), code=(0.0, 3.0)),
             card("code", 4.1, math=(0.0, 3.0), code=(0.5, 1.0)), card("ties", 4.05, math=(0.64, 1.5), code=(0.2, 2.0)),
             card("linear", 4.01, math=(0.2, 2.5), code=(0.075, 2.5))]
    one = merge_retention(cards, ["ties"], {"math": "math", "code": "code"})
    assert merge_takeaway(one, {"ties": "The merge"}) == [
        "The merge keeps 60 % of its parents' own-task gains on average (math 80 %, code 40 %), in exact match, and "
        "costs +0.050 nats (perplexity +5.1 %) of general loss against the base."]
    both = merge_retention(cards, ["ties", "linear"], {"math": "math", "code": "code"})
    lines = merge_takeaway(both, {"ties": "TIES", "linear": "weight average"})
    assert lines[0].startswith("TIES keeps the most: 60 %") and lines[1].startswith("Weight average keeps the "
                                                                                    "least: 20 %, for +0.010 nats")
    assert merge_takeaway(one)[0].startswith("ties keeps 60 %")          # a folder name is not capitalised
    nothing = merge_retention([card("base", 4.0, math=(0.5, 1.0)), card("math", 4.1, math=(0.5, 1.0)),
                               card("m", 4.2, math=(0.5, 1.0))], ["m"], {"math": "math"})
    assert "+0.200 nats" in merge_takeaway(nothing)[0] and "undefined" in merge_takeaway(nothing)[0]


# ---------------------------------------------------------------------------------------------- the CLI prints them

def test_the_cli_prints_the_takeaway_after_the_table(tiny_llama, tmp_path):
    """`forgetlab taskvec` and `forgetlab eval` in a fresh process end with their sentences, whose numbers are the
    ones of the tables they wrote."""
    import subprocess
    import sys
    from pathlib import Path

    env = {"FORGETLAB_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"}
    out = tmp_path / "norms.csv"
    r = subprocess.run([sys.executable, "-m", "forgetlab", "taskvec", str(tiny_llama.pool_yaml), "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(out)
    top = table.loc[table["relative"].idxmax()]
    lines = r.stdout.strip().splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("Fine-tuning changed")]
    assert said and said[0] > 0 and lines[said[0]].startswith(f"Fine-tuning changed {top['model']} most in "), lines
    assert f"by {100 * top['relative']:.3g} % of the weights' size there" in lines[said[0]]
    cosine = pd.read_csv(tmp_path / "norms.cosine.csv").set_index("model")
    assert f"cosine similarity of {cosine.loc['ft0', 'ft1']:.3f}" in lines[said[0] + 1]

    cards = tmp_path / "cards.json"
    r = subprocess.run([sys.executable, "-m", "forgetlab", "eval", str(tiny_llama.pool_yaml), "--max-general", "2",
                        "--max-task", "4", "--no-lm-eval", "--out", str(cards)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import json

    saved = {c["model"]: c for c in json.loads(cards.read_text())}
    lost = {m: c["general_loss"] - saved["base"]["general_loss"] for m, c in saved.items() if m != "base"}
    most = max(lost, key=lost.get)
    assert f"{most} forgets most: its general loss is {lost[most]:+.3f} nats" in r.stdout, r.stdout[-800:]


def test_the_runs_page_reopens_a_run_with_its_takeaway(tmp_path):
    """A saved run says on the Runs page what it said when it was made: its analysis' takeaway, or the
    scorecards' for a set of scorecards."""
    from forgetlab.core.workspace import list_runs, save_run
    from forgetlab.ui.runs import run_takeaway

    result = TaskvecResult([norms("math", 0.0123, 0.001), norms("code", 0.0201, 0.002)])
    ANALYSES.get("taskvec").save(result, home_path=tmp_path)
    cards = [card("base", 4.0, math=(0.0, 3.0)), card("math", 4.2, math=(0.5, 1.0))]
    save_run("scorecards", {}, {"cards": [c.to_dict() for c in cards]}, home_path=tmp_path)
    runs = {r.kind: r for r in list_runs(tmp_path)}
    assert run_takeaway(runs["taskvec"]) == taskvec_takeaway(result)
    assert run_takeaway(runs["scorecards"]) == scorecards_takeaway(cards)
    save_run("benchmarks", {}, {"nothing": 1}, home_path=tmp_path)
    assert run_takeaway({r.kind: r for r in list_runs(tmp_path)}["benchmarks"]) == []
