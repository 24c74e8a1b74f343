"""Merging from a model pool into the workspace, and judging the result at once (the Merge page's core).

`pool_recipe` turns pool model names into a Recipe; `merge_into_workspace` runs the streaming engine into
`<workspace>/merges/<name>/`; `evaluate_merge` scores the merge beside the base and its parents with
forgetlab.evaluate (scorecards saved next to the weights as `scorecards.json`); `saved_merges` lists the
earlier merges with their recipes and scorecards so that they can be reopened and compared.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import yaml

from forgetlab import workspace
from forgetlab.errors import ForgetlabError, ParameterError, WorkspaceError
from forgetlab.evaluate import Scorecard, evaluate, scorecards_frame
from forgetlab.merge.engine import MergeResult, run
from forgetlab.merge.recipes import ModelEntry, Recipe
from forgetlab.merge.registry import get_method
from forgetlab.progress import Progress, scaled
from forgetlab.yamlio import load_file

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


def check_merge_name(name: str) -> str:
    """A merge name usable as a folder name (letters, digits, . _ -)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # fullmatch: `$` would let "abc\n" through
        raise ParameterError(f"Merge name {name!r} is not usable as a folder name: use letters, digits, '.', '_' "
                             "or '-' (at most 100 characters).")
    return name


def merge_into_workspace(recipe: Recipe, name: str, *, home: str | Path | None = None, overwrite: bool = False,
                         device: str = "cpu", pool=None, progress: Progress = None) -> MergeResult:
    """Run the recipe into `<workspace>/merges/<name>` (atomic; an existing merge is kept unless `overwrite`)."""
    out = workspace.merges_dir(home) / check_merge_name(name)
    recipe.name = name
    return run(recipe, out, progress=progress, overwrite=overwrite, device=device, pool=pool)


def evaluate_merge(pool, merged_dir: str | Path, parents: Sequence[str], *, device: str | None = None,
                   max_general: int | None = 32, max_task: int | None = 50, cache: dict | None = None,
                   benchmarks=None, progress: Progress = None) -> list[Scorecard]:
    """Scorecards of the base, the parents and the merged model (in that order) on the pool's probe data
    (eval split); saves them as scorecards.json in the merged folder. `cache` (a dict) reuses the scorecards
    of the base and parents between calls with the same settings. `benchmarks` (a BenchmarkSpec, e.g. the
    pool's `probes.benchmarks`) adds its lm-eval metrics to every scorecard."""
    from forgetlab.checkpoints import load_model

    if pool.probes is None:
        raise ParameterError("The pool has no probe data, so the merge cannot be evaluated; add probes to pool.yaml.")
    merged_dir = Path(merged_dir)
    names = ["base", *parents]
    cards: list[Scorecard] = []
    steps = len(names) + 1
    manager = None
    if benchmarks is not None and benchmarks.all_tasks:
        from forgetlab.benchmarks import check_tasks, task_manager

        manager = task_manager(benchmarks.include, benchmarks.all_tasks)
        check_tasks(benchmarks.all_tasks, manager)
    bench = dict(benchmarks=benchmarks if manager is not None else None, benchmark_manager=manager)
    bench_key = json.dumps(benchmarks.to_dict(), sort_keys=True) if manager is not None else None
    for i, n in enumerate(names):
        key = (getattr(pool, "key", ""), n, max_general, max_task, str(device), bench_key)
        if cache is not None and key in cache:
            cards.append(cache[key])
            continue
        model = pool.load(n, device=device)
        card = evaluate(model, pool.tokenizer, pool.probes, name=n, max_general=max_general, max_task=max_task,
                        progress=scaled(progress, i / steps, (i + 1) / steps), **bench)
        if cache is not None:
            cache[key] = card
        cards.append(card)
    model = load_model(merged_dir, device=device)
    cards.append(evaluate(model, pool.tokenizer, pool.probes, name=merged_dir.name, max_general=max_general,
                          max_task=max_task, progress=scaled(progress, (steps - 1) / steps, 1.0), **bench))
    del model
    payload = {"parents": list(parents), "max_general": max_general, "max_task": max_task,
               "cards": [c.to_dict() for c in cards]}
    try:
        (merged_dir / SCORECARDS).write_text(json.dumps(payload, indent=2))
    except OSError as exc:
        raise WorkspaceError(f"Cannot save the scorecards into {merged_dir} ({exc}).") from None
    return cards


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

    def to_row(self) -> dict:
        models = [Path(str(m.get("model") if isinstance(m, dict) else m)).name for m in self.recipe.get("models", [])]
        return {"name": self.name, "method": self.recipe.get("method"), "models": ", ".join(models),
                "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created)),
                "evaluated": bool(self.cards)}

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
    sc = path / SCORECARDS
    if sc.exists():
        try:
            cards = [Scorecard.from_dict(d) for d in json.loads(sc.read_text())["cards"]]
        except (OSError, ValueError, KeyError, TypeError):
            cards = []
    return SavedMerge(path.name, path, recipe, (path / "recipe.yaml").stat().st_mtime, cards)


def saved_merges(home: str | Path | None = None) -> list[SavedMerge]:
    """Every complete merge under `<workspace>/merges/`, newest first."""
    out = []
    for p in workspace.list_merges(home):
        try:
            out.append(load_merge(p))
        except WorkspaceError:
            continue
    return sorted(out, key=lambda m: m.created, reverse=True)


def search_pool_lambdas(pool, models: Sequence[str], *, keep: float = 0.2, lam: float = 1.0, scope: str = "global",
                        budget: int = 20, max_task: int | None = 32, seed: int = 0, device: str | None = None,
                        executor=None, progress: Progress = None):
    """PCB per-task λ search (CMA-ES) for pool models, minimising the mean answer loss on the pool tasks'
    probe split (`forgetlab.search.pcb_lambda_search`, on `executor`'s workers when given). Returns a
    LambdaSearchResult (λ in the order of `models`)."""
    from forgetlab.search import pcb_lambda_search

    recipe = pool_recipe(pool, "pcb", models, {"keep": keep, "lam": lam, "scope": scope})
    return pcb_lambda_search(pool, recipe, budget=budget, seed=seed, max_task=max_task, device=device,
                             executor=executor, progress=progress)[0]
