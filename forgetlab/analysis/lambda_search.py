"""PCB's per-task λ search with CMA-ES (docs/methods.md#pcb-lambda-search): `pcb_lambda_search(pool, recipe)`,
for the CLI (`forgetlab pcb-search`), the Merge page and scripts, in this process or on an executor's workers.

θ(λ) = θ0 + Σi λi·Ci with Ci = β̂i ⊙ τi / Σj β̂j: the balance matrices β̂ do not depend on λ, so they are
computed once (`pcb_components`) and every evaluation is a cheap weighted sum. CMA-ES (the `cma` package)
starts from λi = λ and minimises a validation loss the caller supplies — a function of the merged state
dict, or of the λ vector — under a budget of evaluations; the best λ seen (the start included) is returned.
`probe_loss(pool)` builds the validation loss that the app and the CLI use: the mean answer loss on the
pool's tasks' probe split (forgetlab.core.evaluate.task_score), on one working copy of the base model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import pandas as pd
import torch

from forgetlab.core.errors import MissingDependencyError, ParameterError
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.executors import PoolWorkerFactory
from forgetlab.analysis.lambda_search_memory import estimate_pcb_search  # noqa: F401  (registers its estimate)
from forgetlab.merge.api import without_tied_copies
from forgetlab.merge.core import DictSource, check_compatible, collect_stats
from forgetlab.merge.methods import pcb as pcbmod
from forgetlab.merge.registry import get_method, validate_params


@dataclass
class LambdaSearchResult:
    """Best per-task λ found, its loss, the start's loss and every evaluation (λ vector, loss)."""

    lambdas: list[float]
    loss: float
    initial_loss: float
    history: list[tuple[list[float], float]] = field(default_factory=list)

    @property
    def n_evals(self) -> int:
        return len(self.history)

    def to_frame(self) -> pd.DataFrame:
        rows = [{"eval": i + 1, **{f"lam_{j}": v for j, v in enumerate(l)}, "loss": s}
                for i, (l, s) in enumerate(self.history)]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        return {"lambdas": self.lambdas, "loss": self.loss, "initial_loss": self.initial_loss,
                "history": [{"lambdas": l, "loss": s} for l, s in self.history]}


def pcb_components(base: Mapping[str, torch.Tensor], finetuned: Sequence[Mapping[str, torch.Tensor]],
                   keep: float = 0.2, scope: str = "global", progress: Progress = None) -> list[dict[str, torch.Tensor]]:
    """Ci = β̂i ⊙ τi / Σj β̂j per tensor and task (0 where Σ β̂ = 0): PCB's merged task vector is Σi λi·Ci."""
    spec = get_method("pcb")
    params = validate_params(spec, {"keep": keep, "scope": scope}, n_models=len(finetuned))
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
        st = stats if scope == "global" else pcbmod.pcb_stats(taus, keep)
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
                       batch_loss: Callable | None = None) -> LambdaSearchResult:
    """Search per-task λi for PCB with CMA-ES from λi = `lam`, minimising `validation_loss`.

    `validation_loss(state_dict) -> float` (loss_of="state_dict") or `validation_loss(lambdas) -> float`
    (loss_of="lambdas"). At most `budget` evaluations (the start counts as one); λi stay within `bounds`.
    `batch_loss(list of λ vectors) -> list of losses`, when given, evaluates each CMA-ES generation at once
    (e.g. on Ray workers, `forgetlab.analysis.search.pcb_batch_loss`); the points and the result are the same.
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
    comps = pcb_components(base, finetuned, keep, scope, scaled(progress, 0, 0.2))
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
    from forgetlab.core.checkpoints import load_model
    from forgetlab.core.evaluate import task_score
    from forgetlab.core.memory import job_dtype

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
                 device: Optional[str], dtype=None):
        from forgetlab.core.checkpoints import open_checkpoint

        base = open_checkpoint(base_ref)
        self.base = base.state_dict()
        fts = [open_checkpoint(r, base=base).state_dict() for r in model_refs]
        self.comps = pcb_components(self.base, fts, keep, scope)
        del fts
        self.loss = probe_loss(pool, device=device, dtype=dtype)

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
                 dtype=None):
        from forgetlab.executors import make_executor

        self.executor = make_executor(executor)
        refs = [pool.resolve_ref(m.model) for m in recipe.models]
        self.factory = _PcbFactory(pool, pool.resolve_ref(recipe.base), refs, float(keep), scope, device,
                                   None if dtype is None else str(dtype).removeprefix("torch."))
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
    from forgetlab.core.checkpoints import open_checkpoint
    from forgetlab.executors import make_executor, worker_id

    if recipe.method != "pcb":
        raise ParameterError(f"The λ search is PCB's; this recipe uses {recipe.method}.")
    p = recipe.validated_params()
    lam0 = float(p["lam"][0] if isinstance(p["lam"], (list, tuple)) else p["lam"])
    base = open_checkpoint(pool.resolve_ref(recipe.base))
    fts = [open_checkpoint(pool.resolve_ref(m.model), base=base).state_dict() for m in recipe.models]
    kw = dict(keep=p["keep"], lam=lam0, scope=p["scope"], budget=int(budget), seed=int(seed), progress=progress)
    executor = make_executor(executor)
    if executor.name == "local":
        loss = probe_loss(pool, max_task=max_task, device=device, dtype=dtype)
        return cma_lambdas(base.state_dict(), fts, loss, **kw), [worker_id()]
    on = pcb_batch_loss(executor, pool, recipe, keep=p["keep"], scope=p["scope"], device=device, dtype=dtype)
    with on as batch:
        res = cma_lambdas(base.state_dict(), fts, None, batch_loss=batch, **kw)
    return res, on.workers_used
