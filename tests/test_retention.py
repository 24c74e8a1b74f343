"""What a merge kept of each parent's own-task gain (forgetlab.analysis.retention), the figure that shows it, the
Merge page's default set of models, and honest axes (from 0, or a delta view that says so)."""
from __future__ import annotations

import json
import math

import pytest

from forgetlab.analysis.retention import gain_share, merge_retention, own_tasks
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import Scorecard, TaskScore


def _card(name, loss, em: dict, al: dict | None = None):
    al = al or {t: 1.0 - v for t, v in em.items()}
    return Scorecard(name, loss, math.exp(loss), 100, {t: TaskScore(t, em[t], al[t], 50) for t in em})


# the numbers: parents 1.00 / 0.88 / 0.54 on their own tasks, off-task parents already high elsewhere
BASE = _card("base", 5.00, {"math": 0.0, "code": 0.0, "translate": 0.0})
MATH = _card("math", 5.05, {"math": 1.00, "code": 0.40, "translate": 0.90})
CODE = _card("code", 5.06, {"math": 0.40, "code": 0.88, "translate": 0.90})
TRANSLATE = _card("translate", 5.07, {"math": 0.45, "code": 0.45, "translate": 0.54})
TIES = _card("ties", 5.07, {"math": 0.88, "code": 0.62, "translate": 0.42})
CARDS = [BASE, MATH, CODE, TRANSLATE, TIES]
TASKS = {"math": "math", "code": "code", "translate": "translate"}


def test_gain_share_is_the_share_of_the_parents_own_task_gain():
    assert gain_share(BASE, MATH, TIES, "math") == pytest.approx(0.88)              # (0.88 − 0) / (1.00 − 0)
    assert gain_share(BASE, CODE, TIES, "code") == pytest.approx(0.62 / 0.88)
    assert gain_share(BASE, TRANSLATE, TIES, "translate") == pytest.approx(0.42 / 0.54)
    # answer loss: lower is better, so the gain is the drop of the loss (1.0 → 0.0 for math; merge 0.12)
    assert gain_share(BASE, MATH, TIES, "math", "answer_loss") == pytest.approx((1.0 - 0.12) / (1.0 - 0.0))
    assert math.isnan(gain_share(BASE, BASE, TIES, "math"))                        # no gain: nothing to keep


def test_merge_retention_rows_forgetting_and_frame():
    result = merge_retention(CARDS, ["ties"], TASKS)
    assert [(r.parent, r.task) for r in result.rows] == [("math", "math"), ("code", "code"), ("translate", "translate")]
    assert [r.retention for r in result.rows] == pytest.approx([0.88, 0.62 / 0.88, 0.42 / 0.54])
    assert result.mean_retention("ties") == pytest.approx((0.88 + 0.62 / 0.88 + 0.42 / 0.54) / 3)
    assert result.forgetting == pytest.approx({"math": 0.05, "code": 0.06, "translate": 0.07, "ties": 0.07})
    frame = result.to_frame()
    assert frame["perplexity_change"].tolist() == pytest.approx([math.exp(0.07) - 1] * 3)
    with pytest.raises(ParameterError, match="No scorecard for ties"):
        merge_retention(CARDS[:-1], ["ties"], TASKS)
    with pytest.raises(ParameterError, match="exact_match or answer_loss"):
        merge_retention(CARDS, ["ties"], TASKS, measure="zoo_math/acc")


def test_own_task_by_name_else_by_the_largest_gain(pool):
    # the tiny pool's models are ft0/ft1 (no task in the name): the task each gained most on
    base = _card("base", 5.0, {"math": 0.1, "copy": 0.1})
    ft0 = _card("ft0", 5.1, {"math": 0.2, "copy": 0.6})
    ft1 = _card("ft1", 5.1, {"math": 0.1, "copy": 0.1}, {"math": 0.5, "copy": 0.95})   # only the loss moved
    assert own_tasks(pool, ["ft0", "ft1"], [base, ft0, ft1]) == {"ft0": "copy", "ft1": "math"}
    assert own_tasks(pool, ["ft0"], []) == {"ft0": None}


def test_retention_figure_starts_both_axes_at_zero_and_says_the_delta():
    from forgetlab.plots.merge import retention_figure

    fig = retention_figure(merge_retention(CARDS, ["ties"], TASKS), {"ties": "TIES"})
    spec = json.loads(fig.to_json())
    layout = spec["layout"]
    assert layout["yaxis"]["rangemode"] == "tozero" and layout["yaxis2"]["rangemode"] == "tozero"
    assert "0 = base 5.000" in layout["yaxis2"]["title"]["text"] and "Δ general loss" in layout["yaxis2"]["title"]["text"]
    bars = [t for t in spec["data"] if t["type"] == "bar"]
    kept = next(t for t in bars if t.get("name") == "TIES")
    assert kept["y"] == pytest.approx([88.0, 100 * 0.62 / 0.88, 100 * 0.42 / 0.54])     # % of each own-task gain
    assert kept["x"] == ["math (parent math)", "code (parent code)", "translate (parent translate)"]
    forgetting = next(t for t in bars if t.get("name") != "TIES")
    assert forgetting["y"] == pytest.approx([0.05, 0.06, 0.07, 0.07])
    assert forgetting["text"][0] == "+0.050<br>+5.1 %"                                  # exp(0.05) − 1 = 5.13 %


def test_models_chart_is_a_delta_from_zero_with_the_base_and_absolute_from_zero_without():
    from forgetlab.plots.models import scorecards_figure

    spec = json.loads(scorecards_figure(CARDS[:3]).to_json())
    assert spec["layout"]["yaxis"]["rangemode"] == "tozero" and "range" not in spec["layout"]["yaxis"]
    assert spec["layout"]["yaxis"]["title"]["text"] == "Δ general loss vs base, nats ↓"
    assert spec["layout"]["xaxis"]["title"]["text"] == "forgetting (0 = base, 5.000)"
    general = [t for t in spec["data"] if t["x"] == ["held-out text"]]
    assert [t["y"][0] for t in general] == pytest.approx([0.0, 0.05, 0.06])
    assert general[1]["text"] == ["+0.050<br>+5.1 %"]
    spec = json.loads(scorecards_figure(CARDS[1:3]).to_json())                          # no base: absolute
    assert spec["layout"]["yaxis"]["title"]["text"] == "general loss (nats) ↓"
    assert spec["layout"]["yaxis"]["rangemode"] == "tozero"


def test_the_default_merge_set_is_the_full_fine_tunes(tiny_llama, tmp_path):
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.workflow import default_merge_models
    from tests.test_checkpoints import _make_lora

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    assert default_merge_models(pool) == ["ft0", "ft1"]
    _make_lora(tiny_llama.base, tmp_path / "lora")
    mixed = ModelPool(tiny_llama.base, {"math": tiny_llama.finetuned["ft0"], "lora-math": {"adapter": tmp_path / "lora"},
                                        "copy": tiny_llama.finetuned["ft1"]})
    assert default_merge_models(mixed) == ["math", "copy"]                              # the adapter left out
    one = ModelPool(tiny_llama.base, {"math": tiny_llama.finetuned["ft0"], "lora-math": {"adapter": tmp_path / "lora"}})
    assert default_merge_models(one) == ["math", "lora-math"]                           # one full: merge them all


def test_the_cli_says_what_a_merge_kept(tiny_llama, tmp_path, capsys):
    """`forgetlab merge --eval` prints each parent's own-task retention beside the scorecards (the Merge page's
    verdict), computed from the saved scorecards the same way."""
    from forgetlab.cli import main
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.workflow import load_merge, pool_recipe

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(pool_recipe(pool, "linear", ["ft0", "ft1"]).to_yaml())
    out = tmp_path / "avg"
    assert main(["merge", str(recipe), str(out), "--pool", str(tiny_llama.pool_yaml), "--eval", "--max-general", "2",
                 "--max-task", "3"]) == 0
    text = capsys.readouterr().out
    saved = load_merge(out)
    expected = merge_retention(saved.cards, ["avg"], own_tasks(pool, ["ft0", "ft1"], saved.cards))
    mean = expected.mean_retention("avg")
    line = next(li for li in text.splitlines() if li.startswith("own-task gain kept"))
    assert (f"mean {100 * mean:.0f} %" if mean == mean else "mean nan %") in line
    assert "nats (perplexity" in line
    assert saved.budget == (2, 3)
    # and it ends with the Merge page's takeaway: what the merge kept and what it cost, in nats
    cards = {c.model: c for c in saved.cards}
    said = [li for li in text.splitlines() if li.startswith("avg keeps") or li.startswith("avg costs")]
    assert said and f"{cards['avg'].general_loss - cards['base'].general_loss:+.3f} nats" in said[0], text[-600:]
