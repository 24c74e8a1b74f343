"""Every word the app's pages show, collected for tests/test_glossary.py, which asks the Glossary
(forgetlab.ui.glossary) to explain each of them.

What is collected, and from where (each item a `Shown(text, where)`):

- `page_words(pool_yaml)`: every page of pages/ run with AppTest on a small pool, once as it opens and once per
  variation (`_variations`: each sweep kind, each merge method, the fine-tune page's other mode, …): every
  widget's label, the options its radio, select box or multiselect shows (as formatted), metric labels, the
  headers of the tables and the texts of the charts it draws.
- `source_words()`: the literal labels of every widget and metric call in pages/ and forgetlab/ui/ (the labels of
  result views and branches that `page_words` does not open), read from the source with `ast`.
- `figure_words()` and `table_words()`: every figure function of forgetlab.plots (and the Runs page's) drawn on
  small results — the runs saved in tests/data/runs_before_issue42 reopened through their analyses, and results
  made here by hand (`_figures`) — and the tables the pages show of them, with the headers `show_table` writes.
  `figure_words` also names the figure functions (and analyses' figures) that no builder drew: a new chart
  needs a builder.

Of a figure, its texts: the title, every axis title, colour-bar and legend titles, subplot titles (annotations)
and legend entries (trace names).

To extend: a new page variation → `_variations`; a new chart function → a builder in `_figures` (the test says which one
is missing); a new table → `_tables`. A new word → an entry in forgetlab/ui/glossary_terms.py, or (an everyday word
used in its everyday sense) `PLAIN` in tests/test_glossary.py.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "tests" / "data" / "runs_before_issue42"
# the names of the data the words are collected on (pool models, tasks, layers): not words of the app
DATA_NAMES = {"base", "ft0", "ft1", "math", "code", "translate", "copy", "ft-math", "ft-code", "ft-translate",
              "merged", "latest", "openTSNE", "sklearn", "zoo_math", "zoo_wiki_cloze", "acc", "acc_norm", "a", "b"}
RUN_IDS: set[str] = set()     # the saved runs' ids and their tails (the Runs page names runs by them): data too


@dataclass(frozen=True)
class Shown:
    """A text the app shows and where it was found (for the test's message)."""

    text: str
    where: str


# ------------------------------------------------------------------------------------------- the pages

WIDGETS = ("selectbox", "radio", "multiselect", "number_input", "text_input", "text_area", "checkbox", "slider",
           "toggle", "select_slider", "date_input", "color_picker", "metric")
CHOICES = ("selectbox", "radio", "multiselect", "select_slider")


def _variations() -> dict[str, list[dict]]:
    """Session-state settings each page is also run with (its other modes), beside the page as it opens."""
    from forgetlab.analysis.sweeps import KINDS
    from forgetlab.merge import METHODS

    return {
        "forgetting": [{"forgetting_kind": k} for k in KINDS],
        "merge": [{"merge_method": m} for m in METHODS.names()],
        "finetune": [{"finetune_mode": "one run"}, {"finetune_mode": "one run", "finetune_trains": "a LoRA adapter"}],
        "text": [{"text_source": "my own text", "text_use_alpha": True}],
        "features": [{"features_level": level} for level in ("layer", "attn", "mlp", "head")],
        "sequence": [{"sequence_override": True}],
    }


def _element_words(at, where: str) -> Iterator[Shown]:
    for kind in WIDGETS:
        for w in getattr(at, kind):
            yield Shown(str(w.label), f"{where}: {kind} {w.label!r}")
            if kind in CHOICES:
                for option in w.options:
                    yield Shown(str(option), f"{where}: option of {kind} {w.label!r}")
    for frame in at.dataframe:
        for column in frame.value.columns:
            yield Shown(str(column), f"{where}: table column")
    for chart in at.get("plotly_chart"):
        yield from spec_words(json.loads(chart.proto.spec), f"{where}: chart")


def page_words(pool_yaml) -> list[Shown]:
    """What every page shows as it opens, and in each of its variations (`_variations`), on the pool `pool_yaml`
    (the caller sets FORGETLAB_HOME to an empty workspace)."""
    from forgetlab.ui.navigation import existing_pages
    from tests.jobs_helper import open_page

    variations = _variations()
    out: list[Shown] = []
    for page in existing_pages(ROOT / "pages"):
        for state in [{}, *variations.get(page.stem, [])]:
            at = open_page(page.stem, pool_yaml)
            for key, value in state.items():
                at.session_state[key] = value
            at.run()
            assert not at.exception, (page.stem, state, at.exception)
            out.extend(_element_words(at, f"pages/{page.stem}.py {state or ''}".strip()))
    return out


# ------------------------------------------------------------------------------------------- the source

SOURCE_CALLS = set(WIDGETS) | {"field_widget"}


def _literal(node) -> str | None:
    """A string literal's text; an f-string's literal parts (its fields become a space); else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " " for v in node.values)
    return None


def source_words() -> list[Shown]:
    """The literal label of every widget and metric call (and every `label=` of `field_widget`) in pages/ and
    forgetlab/ui/."""
    out = []
    for path in sorted([*(ROOT / "pages").glob("*.py"), *(ROOT / "forgetlab" / "ui").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in SOURCE_CALLS:
                continue
            labels = [k.value for k in node.keywords if k.arg == "label"]
            if name != "field_widget" and node.args:
                labels.append(node.args[0])
            for label in filter(None, map(_literal, labels)):
                out.append(Shown(label, f"{path.relative_to(ROOT)}:{node.lineno}: {name}"))
    return out


# ------------------------------------------------------------------------------------------- the figures

def spec_words(spec: dict, where: str) -> Iterator[Shown]:
    """The texts a plotly figure (its JSON: `fig.to_plotly_json()` or a chart element's spec) shows: the title,
    axis, colour-bar and legend titles, subplot titles (annotations) and legend entries (trace names)."""
    layout = spec.get("layout", {})

    def title(value) -> str | None:
        return value.get("text") if isinstance(value, dict) else value

    for key, value in layout.items():
        if isinstance(value, dict) and (key == "title" or "title" in value):
            text = title(value) if key == "title" else title(value.get("title"))
            if text:
                yield Shown(str(text), f"{where}: {key}" + (" title" if key != "title" else ""))
        if key == "coloraxis" and isinstance(value, dict):
            text = title((value.get("colorbar") or {}).get("title"))
            if text:
                yield Shown(str(text), f"{where}: colour bar")
    if isinstance(layout.get("title"), str):
        yield Shown(layout["title"], f"{where}: title")
    for note in layout.get("annotations", []) or []:
        if note.get("text") and note.get("xref", "paper") == "paper":
            yield Shown(str(note["text"]), f"{where}: subplot title")
    for trace in spec.get("data", []):
        if trace.get("name") and trace.get("showlegend", True) is not False:
            yield Shown(str(trace["name"]), f"{where}: legend entry")
        for text in (title((trace.get("colorbar") or {}).get("title")),
                     title(trace.get("legendgrouptitle"))):
            if text:
                yield Shown(str(text), f"{where}: legend or colour-bar title")


def figure_functions() -> dict[object, str]:
    """The code object of every public figure function (annotated to return a figure or figures) in
    forgetlab.plots and the Runs page's module, and of every analysis' `figures` and `compare`, by its name."""
    import forgetlab.plots

    modules = [forgetlab.plots] + [importlib.import_module(f"forgetlab.plots.{m.name}")
                                   for m in pkgutil.iter_modules(forgetlab.plots.__path__)]
    modules.append(importlib.import_module("forgetlab.ui.runs"))
    out = {}
    for module in modules:
        for name, fn in vars(module).items():
            if (inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("_")
                    and "Figure" in str(inspect.signature(fn).return_annotation)):
                out[fn.__code__] = f"{module.__name__}.{name}"
    from forgetlab.analysis.base import ANALYSES

    for name in ANALYSES.names():          # and every analysis' own figures and comparison
        analysis = ANALYSES.get(name)
        for what, fn in (("figures", analysis.figures_fn), ("compare", analysis.compare_fn)):
            if fn is not None:
                out.setdefault(fn.__code__, f"the {what} of analysis {name}")
    return out


def _saved_results(tmp: Path) -> dict[str, tuple]:
    """Each run of tests/data/runs_before_issue42 as (analysis, result, SavedRun), by folder name."""
    from forgetlab.analysis.base import analysis_for_kind
    from forgetlab.core.workspace import load_run

    out = {}
    for folder in sorted(SAVED.iterdir()):
        copy = Path(shutil.copytree(folder, tmp / folder.name))
        run = load_run(copy)
        RUN_IDS.update({run.id, run.id[-6:]})
        analysis = analysis_for_kind(str(run.kind))
        out[folder.name] = (analysis, analysis.load(copy), run)
    return out


def _cards():
    from forgetlab.core.evaluate import Scorecard, TaskScore

    def card(model, loss, em):
        return Scorecard(model, loss, 2.718 ** loss, 100, {t: TaskScore(t, em, 1.0 - em, 8) for t in ("math", "code")},
                         {"zoo_math": {"acc": em}})
    return [card("base", 4.0, 0.1), card("ft-math", 4.2, 0.8), card("merged", 4.1, 0.5)]


def _tsne():
    from forgetlab.analysis.features_results import TsneResult

    coords = pd.DataFrame({"x": [0.0, 1.0, 0.5, 1.5], "y": [0.0, 1.0, 1.0, 0.0], "task": ["math", "code"] * 2,
                           "model": ["base", "base", "ft-math", "ft-math"], "sample": [0, 0, 1, 1]})
    distances = pd.DataFrame({"model": ["base", "ft-math"], "task_a": ["math"] * 2, "task_b": ["code"] * 2,
                              "distance_tsne": [1.0, 2.0], "distance_pca": [3.0, 4.0]})
    return TsneResult(coords, distances, "openTSNE", 30.0, 50, 0, {"level": "mlp", "layer": 1})


def _retention():
    from forgetlab.analysis.retention import MergeRetention, RetentionRow

    row = RetentionRow("merged", "ft-math", "math", 0.1, 0.8, 0.5, 0.57, 0.2, 0.1)
    return MergeRetention("exact_match", 4.0, [row], {"ft-math": 0.2, "merged": 0.1}, ["merged"], ["ft-math"])


def _snapshots():
    from forgetlab.zoo.watch import PretrainingSnapshot

    return [PretrainingSnapshot(step, 100, 5.0 - step / 50, ()) for step in (0, 50, 100)]


def _benchmarks():
    from forgetlab.core.benchmarks import BenchmarkTable

    return BenchmarkTable({"base": {"zoo_math": {"acc": 0.4}}, "ft-math": {"zoo_math": {"acc": 0.6}}}, ["zoo_math"])


def _sequence():
    """A three-task sequence made by hand: two fine-tuning chains and a merge chain, whose OP and BWT put two of
    them on the Pareto front (so that the OP–BWT chart draws its front line)."""
    from forgetlab.train.sequence_results import SequenceChain, SequenceResult, StageScores

    order = ["math", "code", "translate"]

    def stage(i, em, general):
        return StageScores(i, order[i - 1] if i else None, dict(zip(order, em)),
                           {t: 2.0 * (1.0 - v) for t, v in zip(order, em)}, general, 0.01 * i,
                           0.01 if i else float("nan"), 1.5 * i)

    def chain(method, rows, kind="finetune"):
        return SequenceChain(method, [stage(i + 1, em, 4.0 + 0.1 * (i + 1)) for i, em in enumerate(rows)], kind)

    base = stage(0, [0.1, 0.0, 0.05], 4.0)
    return SequenceResult(order, base, [
        chain("adamw", [[0.8, 0.0, 0.05], [0.3, 0.7, 0.05], [0.2, 0.3, 0.9]]),
        chain("mofo+replay", [[0.7, 0.0, 0.05], [0.6, 0.6, 0.05], [0.5, 0.5, 0.8]]),
        chain("merge:opcm", [[0.7, 0.0, 0.05], [0.6, 0.5, 0.05], [0.55, 0.45, 0.4]], kind="merge")])


def _sweeps(saved) -> list:
    """The saved α sweep redrawn as every sweep kind (each kind's swept setting names its axis)."""
    from forgetlab.analysis.sweeps import KINDS, X_NAMES

    alpha = saved["sweep-alpha"][1]
    return [replace(alpha, kind=f"sweep-{k}", x_name=X_NAMES[k]) for k in KINDS]


def _relative_figures(saved) -> Iterator[tuple[str, object]]:
    """The Forgetting page's relative axes of the pruning and α sweeps, and the fapm-relative study's figure."""
    from forgetlab.analysis.retention import ENDPOINTS, relative_frame
    from forgetlab.analysis.studies.fapm import STUDY, relative_table
    from forgetlab.analysis.study import StudyResult, Verdict
    from forgetlab.plots.relative import relative_figure

    for sweep in _sweeps(saved):
        if sweep.x_name in ENDPOINTS:
            frame = relative_frame(sweep)
            yield f"Forgetting: {sweep.kind} on relative axes", relative_figure(frame, x_title=sweep.x_name, mark=0.9)
            if sweep.x_name == "ratio":
                table = relative_table(frame.assign(model=sweep.model))
                for fig in STUDY.figures(StudyResult("fapm-relative", table, Verdict("", None))):
                    yield "Forgetting: the fapm-relative study", fig


def _figures(saved) -> Iterator[tuple[str, object]]:
    """(where, figure) for every builder: the saved runs' own charts in both speciality measures, their
    comparisons and the Runs page's, then the charts of results made here."""
    from forgetlab.plots import merge as merge_plots
    from forgetlab.plots import models, textdiff, zoo
    from forgetlab.plots import sequence as sequence_plots
    from forgetlab.plots.features import figures as feature_figures
    from forgetlab.plots.forgetting import curves_figure, tradeoff_figure
    from forgetlab.ui.runs import compare_figures, figures_from_frame, run_figures

    for name, (analysis, result, run) in saved.items():
        for measure in ("exact_match", "answer_loss"):
            for fig in analysis.figures(result, measure):
                yield f"{name} ({measure})", fig
        if analysis.compare_fn is not None:
            for fig in analysis.compare([result, result], ["a", "b"]):
                yield f"{name} compared", fig
        for fig in [*run_figures(run), *compare_figures([run, run])]:
            yield f"Runs page: {name}", fig
        for fig in figures_from_frame(run.frame(), title=name):
            yield f"Runs page, from the table: {name}", fig
    for sweep in _sweeps(saved):
        yield f"Forgetting: {sweep.kind}", curves_figure(sweep)
        yield f"Forgetting: {sweep.kind}", tradeoff_figure(sweep)
    yield from _relative_figures(saved)
    text = saved["textdiff"][1]
    for measure in ("mean_rise", "total_rise", "share_of_rise", "mean_kl"):
        yield f"Text: classes by {measure}", textdiff.class_bars(text, measure)
    cards = _cards()
    for measure in ("exact_match", "answer_loss", "zoo_math/acc"):
        yield f"Models: scorecards in {measure}", models.scorecard_bars(cards, measure)
        yield f"Merge: scorecards in {measure}", merge_plots.scorecard_figure(cards, measure, merged=["merged"])
    yield "Models: scorecards without the base", models.scorecards_figure(cards[1:])
    yield "Models: benchmarks", models.benchmark_bars(_benchmarks())
    by_level = saved["taskvec"][1].norms[0].by_level()
    for value in ("relative", "norm"):
        yield f"Models: norms ({value})", models.norms_heatmap(by_level, value)
    yield "Merge: what merges kept", merge_plots.retention_figure(_retention())
    for fig in feature_figures(_tsne()):
        yield "Features", fig
    yield "Models: the base's pre-training", zoo.pretraining_figure(_snapshots())
    sequence = _sequence()
    for score in ("exact_match", "answer_loss"):
        yield f"Sequence: heatmaps of R ({score})", sequence_plots.heatmaps(sequence, score)
        yield f"Sequence: each task over the stages ({score})", sequence_plots.task_lines(sequence, score)
        for bwt in ("bwt_trace", "bwt_gem"):
            yield f"Sequence: OP against BWT ({score}, {bwt})", sequence_plots.op_bwt_figure(sequence, score, bwt)
        for fig in sequence_plots.figures(sequence, score):
            yield f"Sequence: the analysis' figures ({score})", fig
    yield "Sequence: general loss over the stages", sequence_plots.general_loss_figure(sequence)


class _Drawn:
    """Records which of `codes` run (sys.setprofile) while it is active."""

    def __init__(self, codes: Iterable):
        self.codes, self.seen = set(codes), set()

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code in self.codes:
            self.seen.add(frame.f_code)

    def __enter__(self):
        self.previous = sys.getprofile()
        sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self.previous)


def figure_words() -> tuple[list[Shown], list[str]]:
    """The texts of every builder's figures, and the figure functions no builder drew."""
    functions = figure_functions()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        saved = _saved_results(Path(tmp))
        with _Drawn(functions) as drawn:
            figures = list(_figures(saved))
    for where, fig in figures:
        out.extend(spec_words(fig.to_plotly_json(), where))
    return out, sorted(functions[c] for c in set(functions) - drawn.seen)


# ------------------------------------------------------------------------------------------- the tables

def _tables(saved) -> Iterator[tuple[str, pd.DataFrame]]:
    """(where, table) for every table the pages show of the results (before `show_table` renames its headers)."""
    from forgetlab.core.evaluate import scorecards_frame
    from forgetlab.merge.workflow import cards_frame
    from forgetlab.ui.runs import compare_frame, runs_table

    for name, (analysis, result, run) in saved.items():
        yield f"{name}: results", analysis.frame(result)
        yield f"Runs page: {name}", compare_frame([run])
    yield "Runs page: the list", runs_table([run for *_, run in saved.values()])
    text = saved["textdiff"][1]
    yield "Text: contexts", text.top_contexts("rise", 5)[["where", "position", "context", "token_class", "rise", "kl",
                                                           "top1_base", "top1_model"]]
    yield "Text: tokens", text.top_tokens("rise", 5)
    yield "Text: classes", text.by_class()
    yield "Attribution: additivity", saved["attribution"][1].additivity()
    tsne = _tsne()
    yield "Features: summary", tsne.cluster_summary()
    yield "Features: distances", tsne.distances
    cards = _cards()
    yield "Models: scorecards", scorecards_frame(cards)
    yield "Runs page: a merge's scorecards", cards_frame(cards, merged=["merged"])
    yield "Merge: what merges kept", _retention().to_frame()
    sequence = _sequence()
    yield "Sequence: metrics per method", sequence.summary_frame()
    yield "Sequence: every stage", sequence.stage_frame()
    yield "Sequence: matrix.csv", sequence.matrix_frame()


def table_words() -> list[Shown]:
    """Every header the pages' tables show of the results: `show_table`'s own headers (forgetlab.ui.tables)."""
    from forgetlab.ui.tables import styled

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for where, frame in _tables(_saved_results(Path(tmp))):
            out.extend(Shown(str(c), f"{where}: table column") for c in styled(frame).data.columns)
    return out

