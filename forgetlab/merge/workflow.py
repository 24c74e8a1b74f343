"""Merging from a model pool into the workspace, and judging the result at once (the Merge page's core).

`pool_recipe` turns pool model names into a Recipe; `merge_into_workspace` runs the streaming engine into
`<workspace>/merges/<name>/`; `evaluate_merge` scores the merge beside the base and its parents with
forgetlab.core.evaluate (scorecards saved next to the weights as `scorecards.json`); `saved_merges` lists the
earlier merges with their recipes and scorecards so that they can be reopened and compared.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import yaml

from forgetlab.core import workspace
from forgetlab.core.benchmarks import checked_manager
from forgetlab.core.checkpoints import load_model, open_checkpoint
from forgetlab.core.errors import ForgetlabError, ParameterError, WorkspaceError
from forgetlab.core.evaluate import Scorecard, evaluate, scorecards_frame
from forgetlab.core.memory import job_dtype, recorded_peak
from forgetlab.core.outputs import atomic_output_dir, check_output_dir, record_file
from forgetlab.core.progress import Progress, scaled
from forgetlab.core.scorecards import Budget, pool_scorecard
from forgetlab.core.tokenization import check_same_tokenizer
from forgetlab.core.yamlio import load_file
from forgetlab.merge.engine import MergeResult, open_sources, run
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.recipes import ModelEntry, Recipe, recipe_parents
from forgetlab.merge.registry import get_method, method_title

SCORECARDS = "scorecards.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def pool_recipe(pool, method: str, models: Sequence[str], params: Mapping[str, Any] | None = None,
                dtype: str | None = None, seed: int | None = None, name: str | None = None) -> Recipe:
    """A Recipe merging the pool's `models` (names) into its base; per-model values of `params` (lists) are
    written under each model (e.g. `weights` → `weight`)."""
    if not models:
        raise ParameterError("Pick at least one fine-tuned model to merge.")
    unknown = [m for m in models if m not in pool.model_names]
    if unknown:
        raise ParameterError(f"{', '.join(unknown)} is not in the pool; its models are {', '.join(pool.model_names)}.")
    spec = get_method(method)
    params = dict(params or {})
    entries = [ModelEntry(pool.entries[m].ref) for m in models]
    for p in spec.params:
        if p.per_model and isinstance(params.get(p.name), (list, tuple)):
            values = params.pop(p.name)
            if len(values) != len(models):
                raise ParameterError(f"{p.name} has {len(values)} values for {len(models)} models.")
            for e, v in zip(entries, values):
                e.params[p.model_key or p.name] = v
    return Recipe(method, str(pool.base_ref), entries, params, dtype, seed, name)


COMPARE_METHODS = ("linear", "ties", "task_arithmetic")
"""What the Merge page compares by default: the plain weight average beside TIES and task arithmetic."""


def merge_folder_name(method: str, models: Sequence[str], stamp: str = "") -> str:
    """The folder name the app proposes for a merge: the method's display name as a slug (`MethodSpec.slug`:
    "weight-average", the name the page shows, not the registry's "linear"), the merged models and a time
    stamp, at most 100 characters (`check_merge_name`). The recipe inside keeps the registry name."""
    head = f"{get_method(method).slug}-{'-'.join(models)}"[:80]
    return f"{head}-{stamp}" if stamp else head


def default_merge_models(pool) -> list[str]:
    """The models a merge starts from: the pool's full fine-tunes (not its LoRA adapters) when there are at least
    two of them — what merging papers merge, one model per task — else every fine-tuned model of the pool."""
    full = [m for m in pool.model_names if not pool.entries[m].adapter]
    return full if len(full) >= 2 else list(pool.model_names)


def recipe_form(pool, recipe) -> tuple[str, list[str], dict[str, Any]]:
    """What `pool_recipe` takes to make `recipe` again (its inverse, for a form that composes merges): the method,
    the pool names of the recipe's models and every parameter of the method (defaults filled in, per-model ones
    as lists in model order). `recipe`: a Recipe or its dict / YAML / file. ParameterError (as `recipe_parents`)
    for a recipe into another base or of models the pool does not hold, or one that lists the base among them."""
    recipe = load_recipe(recipe)
    models = recipe_parents(pool, recipe)
    if len(models) != len(recipe.models):
        raise ParameterError("The recipe lists the base among the models it merges; the form merges fine-tuned "
                             "models only: remove the base from the recipe's models.")
    return recipe.method, models, recipe.validated_params()


def check_merge_name(name: str) -> str:
    """A merge name usable as a folder name (letters, digits, . _ -)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # fullmatch: `$` would let "abc\n" through
        raise ParameterError(f"Merge name {name!r} is not usable as a folder name: use letters, digits, '.', '_' "
                             "or '-' (at most 100 characters).")
    return name


def workspace_merge_dir(name: str, home: str | Path | None = None) -> Path:
    """`<workspace>/merges/<name>`, the name checked (`check_merge_name`)."""
    return workspace.merges_dir(home) / check_merge_name(name)


def merge_into_workspace(recipe: Recipe, name: str, *, home: str | Path | None = None, overwrite: bool = False,
                         device: str = "cpu", pool=None, progress: Progress = None) -> MergeResult:
    """Run the recipe into `<workspace>/merges/<name>` (atomic; an existing merge is kept unless `overwrite`)."""
    out = workspace_merge_dir(name, home)
    recipe.name = name
    return run(recipe, out, progress=progress, overwrite=overwrite, device=device, pool=pool)


def evaluate_merge(pool, merged_dir: str | Path, parents: Sequence[str], *, device: str | None = None,
                   dtype=None, max_general: int | None = 32, max_task: int | None = 50,
                   benchmarks=None, benchmark_manager=None, name: str | None = None,
                   progress: Progress = None) -> list[Scorecard]:
    """Scorecards of the base, the parents and the merged model (in that order) on the pool's probe data
    (eval split); saves them as scorecards.json in the merged folder. The base's and parents' cards come from
    the pool's scorecard cache (`forgetlab.core.scorecards.pool_scorecard`: computed once per budget, device and
    dtype, the numbers every page shows for them). Every model is scored in `dtype` (default: bfloat16 on cuda,
    float32 on the CPU; `forgetlab.core.memory.job_dtype`), one at a time: a model this call loads is released
    before the next one is (`ModelPool.released`). `benchmarks` (a BenchmarkSpec, e.g. the
    pool's `probes.benchmarks`) adds its lm-eval metrics to every scorecard (`benchmark_manager`: its lm-eval
    TaskManager, if already made). The merge's card is named `name` (default: the folder's name). A merge whose
    tokenizer gives the base's tokens other ids is refused (`forgetlab.core.tokenization.check_same_tokenizer`)."""
    if pool.probes is None:
        raise ParameterError("The pool has no probe data, so the merge cannot be evaluated; add probes to pool.yaml.")
    merged_dir = Path(merged_dir)
    # every card is scored with the base's token ids (pool.tokenizer): the merge must read them as the base does
    check_same_tokenizer(pool.base, open_checkpoint(merged_dir), f"the merge {merged_dir.name}")
    names = ["base", *parents]
    cards: list[Scorecard] = []
    steps = len(names) + 1

    manager = benchmark_manager or checked_manager(benchmarks)
    bench = dict(benchmarks=benchmarks if manager is not None else None, benchmark_manager=manager)
    budget = Budget(max_general, max_task)
    dt = job_dtype(dtype, device)
    for i, n in enumerate(names):
        with pool.released():
            cards.append(pool_scorecard(pool, n, budget, device=device, dtype=dt,
                                        progress=scaled(progress, i / steps, (i + 1) / steps), **bench))
    model = load_model(merged_dir, device=device, dtype=dt)
    cards.append(evaluate(model, pool.tokenizer, pool.probes, name=name or merged_dir.name, max_general=max_general,
                          max_task=max_task, progress=scaled(progress, (steps - 1) / steps, 1.0), **bench))
    del model
    payload = {"parents": list(parents), "max_general": max_general, "max_task": max_task,
               "device": str(device or "cpu"), "dtype": str(dt).removeprefix("torch."),
               "memory": recorded_peak(),     # the peak so far (merge and scoring), measured by the CLI or app
               "cards": [c.to_dict() for c in cards]}
    try:
        (merged_dir / SCORECARDS).write_text(json.dumps(payload, indent=2))
        record_file(merged_dir, SCORECARDS)
    except OSError as exc:
        raise WorkspaceError(f"Cannot save the scorecards into {merged_dir} ({exc}).") from None
    return cards


def merge_and_evaluate(recipe: Recipe | str | Path, out_dir: str | Path, pool, *, overwrite: bool = False,
                       device: str = "cpu", dtype=None, max_general: int | None = 32, max_task: int | None = 50,
                       benchmarks=None, benchmark_manager=None,
                       progress: Progress = None) -> tuple[MergeResult, list[Scorecard]]:
    """Merge `recipe` into `out_dir` and score it beside the pool's base and the recipe's parents
    (`evaluate_merge` in `dtype`, with `benchmarks`' lm-eval metrics in every card), as one output: the folder appears
    complete with its scorecards.json, or not at all. Parents, tasks, include folder and limit are checked
    before the merge starts; a failed evaluation leaves nothing (an existing `out_dir`, replaced only with
    `overwrite`, stays as it was). `benchmark_manager`: the lm-eval TaskManager of `benchmarks`, if already
    made; the base's and parents' scorecards come from the pool's cache (`evaluate_merge`). Returns the
    MergeResult (its out_dir the final folder) and the cards. The CLI (`merge --eval`) and the Merge page both
    take this path."""
    recipe = load_recipe(recipe)
    if pool.probes is None:
        raise ParameterError("The pool has no probe data, so the merge cannot be evaluated; add probes to pool.yaml.")
    parents = recipe_parents(pool, recipe)
    manager = benchmark_manager or checked_manager(benchmarks)
    sources = open_sources(recipe)                       # opened once: for the inputs here and for the merge
    out = check_output_dir(out_dir, overwrite, sources.inputs)
    with atomic_output_dir(out, overwrite, inputs=sources.inputs, kind="merge") as tmp:
        inner = tmp / out.name
        result = run(recipe, inner, progress=scaled(progress, 0.0, 0.4), device=device, pool=pool, sources=sources)
        for f in inner.iterdir():               # the merged folder's files become the output's own
            f.replace(tmp / f.name)
        inner.rmdir()
        cards = evaluate_merge(pool, tmp, parents, device=device, dtype=dtype, max_general=max_general,
                               max_task=max_task, benchmarks=benchmarks, benchmark_manager=manager, name=out.name,
                               progress=scaled(progress, 0.4, 1.0))
    return replace(result, out_dir=out), cards


def cards_frame(cards: Sequence[Scorecard], merged: Sequence[str] = ()) -> pd.DataFrame:
    """Scorecards as a table with a `role` column (base / parent / merge) and mean speciality."""
    df = scorecards_frame(list(cards))
    if df.empty:
        return df
    em = [c for c in df.columns if c.endswith("/exact_match")]
    df.insert(1, "role", ["base" if m == "base" else ("merge" if m in merged else "parent") for m in df["model"]])
    df["speciality"] = df[em].mean(axis=1) if em else float("nan")
    return df


@dataclass
class SavedMerge:
    """A merge folder of the workspace: its recipe and, if it was evaluated, its scorecards."""

    name: str
    path: Path
    recipe: dict
    created: float
    cards: list[Scorecard] = field(default_factory=list)
    budget: tuple = (None, None)            # (max_general, max_task) the cards were computed with

    @property
    def parents(self) -> list[str]:
        """The pool names of the merge's parents: its cards are the base, the parents, then the merge."""
        return [c.model for c in self.cards[1:-1]]

    def budget_text(self) -> str:
        """"32 blocks, 50 pairs" ("all" for no limit or when not recorded)."""
        g, t = self.budget
        return f"{'all' if g is None else g} blocks, {'all' if t is None else t} pairs"

    @property
    def notes(self) -> list[str]:
        """The notes of the recipe it was merged from (`Recipe.notes`, kept in recipe.yaml)."""
        meta = self.recipe.get("forgetlab")
        return [str(n) for n in (meta.get("notes") or [])] if isinstance(meta, dict) else []

    def to_row(self) -> dict:
        models = [Path(str(m.get("model") if isinstance(m, dict) else m)).name for m in self.recipe.get("models", [])]
        method = self.recipe.get("method")     # the page's name for it, whatever the folder says (old `linear-…`)
        return {"name": self.name, "method": method_title(method) if isinstance(method, str) else method,
                "models": ", ".join(models),
                "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created)),
                "evaluated": bool(self.cards), "evaluation budget": self.budget_text() if self.cards else "",
                "notes": " ".join(self.notes)}

    def recipe_yaml(self) -> str:
        return yaml.safe_dump({k: v for k, v in self.recipe.items() if k != "forgetlab"}, sort_keys=False)


def load_merge(path: str | Path) -> SavedMerge:
    """Read one merge folder (recipe.yaml, optional scorecards.json)."""
    path = Path(path)
    try:
        recipe = load_file(path / "recipe.yaml", "merge recipe") or {}
    except ForgetlabError as exc:
        raise WorkspaceError(f"{path}/recipe.yaml is unreadable ({exc}).") from None
    cards: list[Scorecard] = []
    budget = (None, None)
    sc = path / SCORECARDS
    if sc.exists():
        try:
            payload = json.loads(sc.read_text())
            cards = [Scorecard.from_dict(d) for d in payload["cards"]]
            budget = (payload.get("max_general"), payload.get("max_task"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            cards = []
    return SavedMerge(path.name, path, recipe, (path / "recipe.yaml").stat().st_mtime, cards, budget)


def saved_merges(home: str | Path | None = None) -> list[SavedMerge]:
    """Every complete merge under `<workspace>/merges/`, newest first."""
    out = []
    for p in workspace.list_merges(home):
        try:
            out.append(load_merge(p))
        except WorkspaceError:
            continue
    return sorted(out, key=lambda m: m.created, reverse=True)
