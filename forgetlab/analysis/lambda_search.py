"""PCB's per-task λ search with CMA-ES (docs/methods.md#pcb-lambda-search): `pcb_lambda_search(pool, recipe)`,
for the CLI (`forgetlab pcb-search`), the Merge page and scripts, in this process or on an executor's workers;
`search_then_merge`: the search, then the recipe with the λ found merged and scored (the Merge page's "search a
λ per task first" and `forgetlab pcb-search … --merge OUT_DIR`).

θ(λ) = θ0 + Σi λi·Ci with Ci = β̂i ⊙ τi / Σj β̂j: the balance matrices β̂ do not depend on λ, so they are
computed once (`pcb_components`) and every evaluation is a cheap weighted sum. CMA-ES (the `cma` package)
starts from λi = λ and minimises a validation loss the caller supplies — a function of the merged state
dict, or of the λ vector — under a budget of evaluations; the best λ seen (the start included) is returned.
`probe_loss(pool)` builds the validation loss that the app and the CLI use: the mean answer loss on the
pool's tasks' probe split (forgetlab.core.evaluate.task_score), on one working copy of the base model.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import pandas as pd
import torch

from forgetlab.analysis.base import ANALYSES, Analysis, Output
from forgetlab.analysis.lambda_search_memory import estimate_pcb_search
from forgetlab.analysis.search import SEED_MAX, tuned_recipe
from forgetlab.core.checkpoints import load_model, open_checkpoint
from forgetlab.core.errors import MissingDependencyError, ParameterError, ProbeDataError
from forgetlab.core.evaluate import Scorecard, forgetting_text, task_score
from forgetlab.core.memory import job_dtype
from forgetlab.core.outputs import check_output_dir
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.core.settings import count_field, device_field, dtype_field, setting
from forgetlab.executors import PoolWorkerFactory, make_executor, worker_id, worker_label
from forgetlab.merge.api import without_tied_copies
from forgetlab.merge.core import DictSource, check_compatible, collect_stats
from forgetlab.merge.engine import MergeResult
from forgetlab.merge.memory import estimate_merge
from forgetlab.merge.methods import pcb as pcbmod
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.recipes import Recipe
from forgetlab.merge.registry import get_method, validate_params
from forgetlab.merge.workflow import SCORECARDS, cards_frame, merge_and_evaluate, recipe_parents


@dataclass
class LambdaSearchResult:
    """Best per-task λ found, its loss, the start's loss and every evaluation (λ vector, loss). A search run as
    the `pcb-search` analysis also records its input recipe, the recipe with the λ found (`best_recipe`), its
    settings, where it ran (`executor`, `workers`) and, with `--merge`, the merge (`merged`: the MergeResult's
    dict and the scorecards)."""

    lambdas: list[float]
    loss: float
    initial_loss: float
    history: list[tuple[list[float], float]] = field(default_factory=list)
    recipe: dict[str, Any] = field(default_factory=dict)
    best_recipe: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    executor: dict[str, Any] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)
    merged: Optional[dict[str, Any]] = None

    @property
    def n_evals(self) -> int:
        """How many λ vectors were evaluated (the start included)."""
        return len(self.history)

    def to_frame(self) -> pd.DataFrame:
        """One row per evaluation: its number, λ per model (`lam_<i>`) and the loss."""
        rows = [{"eval": i + 1, **{f"lam_{j}": v for j, v in enumerate(l)}, "loss": s}
                for i, (l, s) in enumerate(self.history)]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """Every field, the history as {"lambdas", "loss"} records (a run's results.json)."""
        return {"lambdas": self.lambdas, "loss": self.loss, "initial_loss": self.initial_loss,
                "history": [{"lambdas": l, "loss": s} for l, s in self.history], "recipe": self.recipe,
                "best_recipe": self.best_recipe, "settings": self.settings, "executor": self.executor,
                "workers": self.workers, "merged": self.merged}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LambdaSearchResult":
        """The search `to_dict` saved."""
        return cls(list(d["lambdas"]), float(d["loss"]), float(d["initial_loss"]),
                   [(list(h["lambdas"]), float(h["loss"])) for h in d.get("history", [])],
                   dict(d.get("recipe") or {}), dict(d.get("best_recipe") or {}), dict(d.get("settings") or {}),
                   dict(d.get("executor") or {}), list(d.get("workers") or []), d.get("merged"))

    @property
    def cards(self) -> list[Scorecard]:
        """The scorecards of the merge made with the λ found (base, parents, merge), or [] without one."""
        return [Scorecard.from_dict(c) for c in (self.merged or {}).get("cards", [])]


def pcb_components(base: Mapping[str, torch.Tensor], finetuned: Sequence[Mapping[str, torch.Tensor]],
                   keep: float = 0.2, scope: str = "global", progress: Progress = None, *,
                   activation: str = "softmax", self_term: bool = True) -> list[dict[str, torch.Tensor]]:
    """Ci = β̂i ⊙ τi / Σj β̂j per tensor and task (0 where Σ β̂ = 0): PCB's merged task vector is Σi λi·Ci
    (β with PCB's `activation` and `self_term` options, docs/methods.md#pcb-activation)."""
    spec = get_method("pcb")
    params = validate_params(spec, {"keep": keep, "scope": scope, "activation": activation, "self_term": self_term},
                             n_models=len(finetuned))
    finetuned = without_tied_copies(base, finetuned)
    base_src = DictSource(base, "the base")
    models = [DictSource(sd, f"model {i + 1}") for i, sd in enumerate(finetuned)]
    entries = check_compatible(base_src, models)
    stats = collect_stats(spec, params, base_src, models, entries, progress=scaled(progress, 0, 0.5))
    comps: list[dict[str, torch.Tensor]] = [{} for _ in finetuned]
    for n, e in enumerate(entries):
        if not e.dtype.is_floating_point:
            continue
        b = base[e.name].to(torch.float32)
        taus = [sd[e.name].to(torch.float32) - b for sd in finetuned]
        st = stats if scope == "global" else pcbmod.pcb_stats(taus, keep, activation, self_term)
        betas = pcbmod.pcb_balance(taus, st)
        bhat = [torch.zeros_like(x) if t is None else torch.where(x >= t, x, torch.zeros_like(x))
                for x, t in zip(betas, st.thresholds)]
        den = sum(bhat)
        safe = torch.where(den > 0, den, torch.ones_like(den))
        for i in range(len(taus)):
            comps[i][e.name] = torch.where(den > 0, bhat[i] * taus[i] / safe, torch.zeros_like(den))
        report(progress, 0.5 + 0.5 * (n + 1) / len(entries), f"PCB components {e.name}")
    return comps


def compose(base: Mapping[str, torch.Tensor], components: Sequence[Mapping[str, torch.Tensor]],
            lambdas: Sequence[float]) -> dict[str, torch.Tensor]:
    """θ0 + Σi λi·Ci, in the base's dtypes."""
    out = {}
    for name, b in base.items():
        if not b.is_floating_point() or name not in components[0]:
            out[name] = b
            continue
        acc = b.to(torch.float32).clone()
        for lam, c in zip(lambdas, components):
            acc.add_(c[name], alpha=float(lam))
        out[name] = acc.to(b.dtype)
    return out


def cma_lambdas(base: Mapping[str, torch.Tensor], finetuned: Sequence[Mapping[str, torch.Tensor]],
                       validation_loss: Callable, *, keep: float = 0.2, lam: float = 1.0, scope: str = "global",
                       budget: int = 30, sigma0: float = 0.3, bounds: tuple[float, float] = (0.0, 3.0),
                       seed: int = 0, loss_of: str = "state_dict", progress: Progress = None,
                       batch_loss: Callable | None = None, activation: str = "softmax",
                       self_term: bool = True) -> LambdaSearchResult:
    """Search per-task λi for PCB with CMA-ES from λi = `lam`, minimising `validation_loss`.

    `validation_loss(state_dict) -> float` (loss_of="state_dict") or `validation_loss(lambdas) -> float`
    (loss_of="lambdas"). At most `budget` evaluations (the start counts as one); λi stay within `bounds`.
    `batch_loss(list of λ vectors) -> list of losses`, when given, evaluates each CMA-ES generation at once
    (e.g. on Ray workers, `forgetlab.analysis.search.pcb_batch_loss`); the points and the result are the same.
    `activation`, `self_term`: PCB's options (`pcb_components`).
    """
    try:
        import cma
    except ImportError:  # pragma: no cover - cma is a dependency
        raise MissingDependencyError("The λ search needs the cma package: pip install cma") from None
    if loss_of not in ("state_dict", "lambdas"):
        raise ParameterError(f"loss_of must be 'state_dict' or 'lambdas'; got {loss_of!r}.")
    if int(budget) < 1:
        raise ParameterError(f"budget must be at least 1 evaluation; got {budget}.")
    if not bounds[0] <= lam <= bounds[1]:
        raise ParameterError(f"The start λ={lam} lies outside the bounds {bounds}; widen the bounds.")
    n = len(finetuned)
    comps = pcb_components(base, finetuned, keep, scope, scaled(progress, 0, 0.2), activation=activation,
                           self_term=self_term)
    history: list[tuple[list[float], float]] = []

    def record(lams: list[float], value: float) -> float:
        value = float(value)
        history.append((lams, value))
        report(progress, 0.2 + 0.8 * len(history) / budget, f"λ search {len(history)}/{budget}: loss {value:.4f}")
        return value if value == value else float("inf")

    def f(x) -> float:
        lams = [float(v) for v in x]
        return record(lams, validation_loss(lams) if loss_of == "lambdas"
                      else validation_loss(compose(base, comps, lams)))

    def many(xs) -> list[float]:
        if batch_loss is None:
            return [f(x) for x in xs]
        lams = [[float(v) for v in x] for x in xs]
        return [record(lv, value) for lv, value in zip(lams, batch_loss(lams))]

    x0 = [float(lam)] * n
    initial = many([x0])[0]
    if budget > 1:
        es = cma.CMAEvolutionStrategy(x0, sigma0, {"bounds": [bounds[0], bounds[1]], "seed": int(seed) + 1,
                                                   "verbose": -9, "maxfevals": budget - 1})
        while not es.stop() and len(history) < budget:
            xs = es.ask()
            xs = xs[: budget - len(history)]
            losses = many(xs)
            if len(xs) < es.popsize:
                break
            es.tell(xs, losses)
    best = min(history, key=lambda h: h[1] if h[1] == h[1] else float("inf"))
    report(progress, 1.0, f"best λ {best[0]} loss {best[1]:.4f}")
    return LambdaSearchResult(best[0], best[1], initial, history)


def probe_loss(pool, tasks: Sequence[str] | None = None, split: str = "probe", max_task: int | None = 32,
               batch_size: int = 16, device: str | None = None,
               dtype=None) -> Callable[[Mapping[str, torch.Tensor]], float]:
    """Validation loss for the λ search: the mean answer loss over the pool's tasks (their `split` pairs),
    on one working copy of the base model in `dtype` (default: bfloat16 on cuda, float32 on the CPU) whose
    weights are replaced at every call."""
    probes = pool.probes
    if probes is None or not probes.tasks:
        raise ParameterError("The λ search needs probe data: give the pool task probe files (pool.yaml probes).")
    names = list(tasks) if tasks else list(probes.tasks)
    model = load_model(pool.checkpoint("base"), device=device, dtype=job_dtype(dtype, device))
    tok = pool.tokenizer
    dev = next(model.parameters()).device

    def loss(state: Mapping[str, torch.Tensor]) -> float:
        with torch.no_grad():
            model.load_state_dict({k: v.to(dev) for k, v in state.items()}, strict=False)
        vals = []
        for t in names:
            pairs = getattr(probes.task(t), split)[: max_task]
            vals.append(task_score(model, tok, t, pairs, template=probes.template, batch_size=batch_size).answer_loss)
        return float(sum(vals) / len(vals))

    return loss


# ------------------------------------------------------------------------------------ PCB λ search on workers


class _PcbState:
    """A PCB λ-search worker: base weights and PCB components Ci resident, one working copy for the probe loss."""

    def __init__(self, pool, base_ref: str, model_refs: Sequence[str], keep: float, scope: str,
                 device: Optional[str], dtype=None, max_task: Optional[int] = 32, options: Optional[dict] = None):
        base = open_checkpoint(base_ref)
        self.base = base.state_dict()
        fts = [open_checkpoint(r, base=base).state_dict() for r in model_refs]
        self.comps = pcb_components(self.base, fts, keep, scope, **(options or {}))
        del fts
        self.loss = probe_loss(pool, max_task=max_task, device=device, dtype=dtype)

    def __call__(self, lambdas, progress: Progress = None) -> float:
        return float(self.loss(compose(self.base, self.comps, lambdas)))


class _PcbFactory(PoolWorkerFactory):
    """Builds a `_PcbState` on a worker."""

    members: Sequence[str] = ()

    def build(self, pool) -> _PcbState:
        return _PcbState(pool, *self.args)


class pcb_batch_loss:
    """Context manager giving `batch_loss(list of λ vectors) -> losses` for `cma_lambdas`, evaluated on an
    executor's workers (each holds the base and the PCB components once). `.executor` says where points ran."""

    def __init__(self, executor, pool, recipe, *, keep: float, scope: str, device: Optional[str] = None,
                 dtype=None, max_task: Optional[int] = 32, options: Optional[dict] = None):
        self.executor = make_executor(executor)
        refs = [pool.resolve_ref(m.model) for m in recipe.models]
        self.factory = _PcbFactory(pool, pool.resolve_ref(recipe.base), refs, float(keep), scope, device,
                                   None if dtype is None else str(dtype).removeprefix("torch."), max_task,
                                   dict(options or {}))
        self.workers_used: list[dict] = []

    def __enter__(self):
        self._workers = self.executor.workers(self.factory)

        def batch(lams: list[list[float]]) -> list[float]:
            outs = self._workers.map(lams)
            self.workers_used += [dict(o.worker or {}) for o in outs]
            return [o.value if o.ok else float("nan") for o in outs]
        return batch

    def __exit__(self, *exc) -> None:
        self._workers.close()


def pcb_lambda_search(pool, recipe, *, budget: int = 30, seed: int = 0, max_task: Optional[int] = 32,
                      device: Optional[str] = None, dtype=None, executor=None, progress: Progress = None):
    """PCB's per-task λ search (CMA-ES, `cma_lambdas`) for a pcb `recipe` (its keep, scope and first λ as the
    start), minimising the mean answer loss on `pool`'s probe split, scored in `dtype` (`probe_loss`; its memory:
    `lambda_search_memory`) — in this process, or with each CMA-ES generation evaluated at once on an executor's
    workers (`pcb_batch_loss`).
    Returns (LambdaSearchResult, the workers that evaluated points: [{"host", "pid"}])."""
    if recipe.method != "pcb":
        raise ParameterError(f"The λ search is PCB's; this recipe uses {recipe.method}.")
    p = recipe.validated_params()
    lam0 = float(p["lam"][0] if isinstance(p["lam"], (list, tuple)) else p["lam"])
    base = open_checkpoint(pool.resolve_ref(recipe.base))
    fts = [open_checkpoint(pool.resolve_ref(m.model), base=base).state_dict() for m in recipe.models]
    options = {"activation": p["activation"], "self_term": p["self_term"]}   # PCB's options, as the recipe sets them
    kw = dict(keep=p["keep"], lam=lam0, scope=p["scope"], budget=int(budget), seed=int(seed), progress=progress,
              **options)
    executor = make_executor(executor)
    if executor.name == "local":
        loss = probe_loss(pool, max_task=max_task, device=device, dtype=dtype)
        return cma_lambdas(base.state_dict(), fts, loss, **kw), [worker_id()]
    on = pcb_batch_loss(executor, pool, recipe, keep=p["keep"], scope=p["scope"], device=device, dtype=dtype,
                        max_task=max_task, options=options)
    with on as batch:
        res = cma_lambdas(base.state_dict(), fts, None, batch_loss=batch, **kw)
    return res, on.workers_used


# ------------------------------------------------------------------------------ λ search, then merge


def recipe_with_lambdas(recipe: Recipe, lambdas: Sequence[float]) -> Recipe:
    """The pcb `recipe` with the λ found, one per model (`lam` under each model, rounded to 6 digits; the
    method-wide λ dropped): what `pcb-search --out` writes and what `search_then_merge` merges."""
    return tuned_recipe(recipe, get_method("pcb").param("lam"), lambdas)


@dataclass
class SearchedMerge:
    """PCB's λ search and the merge of its result (`search_then_merge`): the search, the workers that evaluated
    its points, the recipe merged, the merge and the scorecards (base, parents, merge)."""

    search: LambdaSearchResult
    workers: list[dict[str, Any]]
    recipe: Recipe
    merge: MergeResult
    cards: list[Scorecard]


def search_then_merge(pool, recipe: Recipe, out_dir: str | Path, *, budget: int = 30, seed: int = 0,
                      max_task: Optional[int] = 32, max_general: Optional[int] = None, device: Optional[str] = None,
                      dtype=None, executor=None, benchmarks=None, overwrite: bool = False,
                      progress: Progress = None) -> SearchedMerge:
    """PCB's λ search on the pcb `recipe` (`pcb_lambda_search`, `max_task` probe pairs per task), then the recipe
    with the λ found (`recipe_with_lambdas`; its name and dtype kept) merged into `out_dir` and scored beside the
    pool's base and the recipe's parents on `max_general` general-text blocks and `max_task` eval pairs per task
    (`forgetlab.merge.workflow.merge_and_evaluate`: all or nothing). The Merge page's "search a λ per task first"
    and `forgetlab pcb-search … --merge OUT_DIR` both take this path."""
    found, workers = pcb_lambda_search(pool, recipe, budget=budget, seed=seed, max_task=max_task, device=device,
                                       dtype=dtype, executor=executor, progress=scaled(progress, 0.0, 0.4))
    merged = recipe_with_lambdas(recipe, found.lambdas)
    result, cards = merge_and_evaluate(merged, out_dir, pool, overwrite=overwrite, device=device, dtype=dtype,
                                       max_general=max_general, max_task=max_task, benchmarks=benchmarks,
                                       progress=scaled(progress, 0.4, 1.0))
    return SearchedMerge(found, workers, merged, result, cards)


# ------------------------------------------------------------------------------------------ the analysis


@dataclass
class PcbSearchSettings:
    """What `forgetlab pcb-search` runs: CMA-ES over the per-task λ of a pcb `recipe` (its file, or its YAML
    text) for `budget` evaluations of the probe answer loss and, with `merge`, the merge of the λ found."""

    recipe: Optional[str] = setting(None, positional=True, help="A pcb recipe (its keep, lam and scope are used; λ "
                                                                "is the start).")
    budget: int = count_field(30, "Number of loss evaluations")
    seed: int = setting(0, range=(0, SEED_MAX), help="Seed of CMA-ES (a whole number from 0 to 2**32 − 2)")
    device: Optional[str] = device_field()
    dtype: Optional[str] = dtype_field("the working copy that scores each λ")
    merge: Optional[str] = setting(None, metavar="OUT_DIR",
                                   help="then merge the recipe with the λ found into this folder and score it beside "
                                        "the base and its parents, as `forgetlab merge --eval` does (all or "
                                        "nothing; scorecards.json beside the weights)")
    overwrite: bool = setting(False, help="replace output files that exist already")
    max_task: Optional[int] = count_field(32, "probe pairs per task of the λ search's loss (and, with a merge, "
                                              "eval pairs per task of its scores)", cli=False)
    max_general: Optional[int] = count_field(None, "general-text blocks of the merge's scores (default: all)",
                                             cli=False)


def check_settings(settings: PcbSearchSettings, pool=None) -> None:
    """What the declarations cannot say: a pcb recipe with valid parameters, a merge folder that may be written;
    with the pool, its probe data (and, for a merge, the recipe's models in it)."""
    if settings.recipe is None:
        raise ParameterError("pcb-search needs a pcb recipe: the merge whose λ it searches.")
    recipe = load_recipe(settings.recipe)
    if recipe.method != "pcb":
        raise ParameterError(f"pcb-search needs a pcb recipe; this one uses {recipe.method}.")
    recipe.validated_params()
    if settings.merge is not None:
        check_output_dir(settings.merge, settings.overwrite)
    if pool is not None:
        if pool.probes is None or not pool.probes.tasks:
            raise ProbeDataError("The λ search needs probe data: give the pool task probe files (pool.yaml probes).")
        if settings.merge is not None:
            recipe_parents(pool, recipe)


def compute(pool, settings: PcbSearchSettings, progress: Progress = None, executor=None) -> LambdaSearchResult:
    """`pcb_lambda_search` (or, with `merge`, `search_then_merge`) with these settings, its result recording the
    recipes, the settings, where its points ran and the merge."""
    recipe = load_recipe(settings.recipe)
    executor = make_executor(executor)
    kw = dict(budget=settings.budget, seed=settings.seed, max_task=settings.max_task, device=settings.device,
              dtype=settings.dtype, executor=executor, progress=progress)
    merged = None
    if settings.merge is None:
        found, workers = pcb_lambda_search(pool, recipe, **kw)
    else:
        done = search_then_merge(pool, recipe, settings.merge, max_general=settings.max_general,
                                 overwrite=settings.overwrite, **kw)
        found, workers = done.search, done.workers
        merged = {**done.merge.to_dict(), "cards": [c.to_dict() for c in done.cards]}
    return replace(found, recipe=recipe.to_dict(), best_recipe=recipe_with_lambdas(recipe, found.lambdas).to_dict(),
                   settings={k: getattr(settings, k) for k in ("budget", "seed", "max_task", "max_general", "device",
                                                                 "dtype", "merge")},
                   executor=executor.describe(), workers=workers, merged=merged)


def estimate(pool, settings: PcbSearchSettings):
    """The search's peak (`estimate_pcb_search`); with a merge, the larger of it and the merge's with its scoring
    (`forgetlab.merge.memory.estimate_merge`): they run one after the other."""
    searching = estimate_pcb_search(pool, settings.recipe, device=settings.device, dtype=settings.dtype,
                                    max_task=settings.max_task)
    if settings.merge is None:
        return searching
    merging = estimate_merge(load_recipe(settings.recipe), pool=pool, device=settings.device, dtype=settings.dtype,
                             evaluate=True, max_general=settings.max_general, max_task=settings.max_task)
    return max((searching, merging), key=lambda e: e.total)


def recipe(result: LambdaSearchResult) -> dict:
    """What a saved λ search records (besides its pool): the input recipe and the settings."""
    return {"recipe": result.recipe, **result.settings}


def found_recipe_yaml(result: LambdaSearchResult) -> str:
    """The recipe with the λ found, as YAML (what `--out` writes)."""
    return Recipe.from_dict(result.best_recipe).to_yaml()


def cli_report(result: LambdaSearchResult) -> list:
    """The CLI's lines: the worker processes (on an executor other than local), the start's and the best loss,
    the λ found; with a merge, where it went, the scorecards and where they are saved."""
    lines: list = []
    name = result.executor.get("name", "local")
    if name != "local":
        pids = sorted({worker_label(w) for w in result.workers})
        lines.append(f"executor {name}: {len(pids)} worker process(es) ({', '.join(pids)})")
    lines += [f"start loss {result.initial_loss:.4f} → best {result.loss:.4f} after {result.n_evals} evaluations",
              "λ = " + ", ".join(f"{v:.4f}" for v in result.lambdas)]
    if result.merged is not None:
        m, cards = result.merged, result.cards
        lines += [f"note: {note}" for note in m.get("notes", [])]
        lines += [f"merged {m['n_tensors']} tensors ({m['n_parameters']:,} parameters) with {m['method']} in "
                  f"{m['seconds']:.1f} s into {m['out_dir']}", cards_frame(cards, merged=[cards[-1].model]),
                  f"scorecards saved in {Path(m['out_dir']) / SCORECARDS}"]
    return lines


def takeaway(result: LambdaSearchResult) -> list[str]:
    """The search in one or two sentences: how far the per-task λ found lowered the mean answer loss on the probe
    split (nats) and the λ themselves; with a merge, what the merged model costs in general loss (nats)."""
    if not result.history:
        return []
    models = [str(m.get("model")) if isinstance(m, Mapping) else str(m) for m in (result.recipe.get("models") or [])]
    names = models if len(models) == len(result.lambdas) else [f"model {i + 1}" for i in range(len(result.lambdas))]
    lines = [f"The search lowered the mean answer loss on the probe split from {result.initial_loss:.4f} to "
             f"{result.loss:.4f} nats ({result.loss - result.initial_loss:+.4f}) with the weights "
             + ", ".join(f"{n} {v:.3f}" for n, v in zip(names, result.lambdas)) + "."]
    cards = result.cards
    if len(cards) >= 2 and cards[0].model == "base":
        lines.append(f"The merge made with them costs {forgetting_text(cards[-1].forgetting(cards[0]))} of general "
                     "loss against the base.")
    return lines


ANALYSIS = ANALYSES.add("pcb-search", Analysis(
    "pcb-search", "PCB λ search", PcbSearchSettings, compute, LambdaSearchResult,
    help="Search PCB's per-task λ with CMA-ES on the pool's probe data (and merge the λ found: --merge).",
    description="CMA-ES over PCB's per-task λ, minimising the mean answer loss on the pool's tasks' probe split; "
                "prints the λ found, writes the recipe with them (--out) and, with --merge OUT_DIR, merges it and "
                "scores it beside the base and its parents, as the Merge page's 'search a λ per task first' does.",
    checks=check_settings, estimate_fn=estimate, recipe=recipe, report=cli_report, takeaway_fn=takeaway,
    outputs=(Output("--out", "Write the recipe with the λ found (per model) to this YAML file.",
                    text=found_recipe_yaml),),
    points=True, pool_arg="option", pool_help="pool.yaml whose tasks' probe split gives the validation loss."))

