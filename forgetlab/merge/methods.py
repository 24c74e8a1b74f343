"""The built-in merge methods of METHODS.md, registered under their names. Each `_merge_*` takes a TensorJob
(one named tensor of the base and of every fine-tuned model, float32) and returns the merged tensor."""
from __future__ import annotations

import math as _math

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge import consensus as _consensus
from forgetlab.merge import interpolation as _interp
from forgetlab.merge import kernels as _k
from forgetlab.merge import pcb as _pcb
from forgetlab.merge import sparsify as _sp
from forgetlab.merge.fapm import ADAPTER_RATIO, SCORES, fapm_prune
from forgetlab.merge.registry import MethodSpec, ParamSpec, TensorJob, register
from forgetlab.merge.stats import TiesGlobalCollector
from forgetlab.merge.ties import ties_combine

UNIT = (0.0, 1.0)
LAM_RANGE = (-10.0, 10.0)


def _lam(default: float = 1.0) -> ParamSpec:
    return ParamSpec("lam", "float", default, "Scaling λ of the merged task vector (θ = θ0 + λ·…).", LAM_RANGE)


def _weights() -> ParamSpec:
    return ParamSpec("weights", "float", 1.0, "Weight wt of each fine-tuned model (one number, or one per model).",
                     LAM_RANGE, per_model=True, model_key="weight")


def _seed() -> ParamSpec:
    return ParamSpec("seed", "int", 0, "Seed of the random drop masks (same seed, same masks).", (0, 2**63 - 1))


def _add_scaled(job: TensorJob, parts: list[torch.Tensor], lam: float) -> torch.Tensor:
    """θ0 + λ·Σ wt·partt, accumulated into the base tensor, which the job owns (the engine's reads are
    copies) and which no method reads after its parts are made: no output buffer to allocate."""
    out = job.base
    for part, w in zip(parts, job.params["weights"]):
        out.add_(part, alpha=float(lam) * float(w))
    return out


# -- interpolation family

def _merge_linear(job: TensorJob) -> torch.Tensor:
    return _interp.linear(job.finetuned, job.params["weights"], job.params["normalize"])


def _check_linear(params: dict, n: int) -> None:
    if params["normalize"] and abs(sum(params["weights"])) < 1e-12:
        raise ParameterError("linear weights sum to 0, so normalising by their sum is undefined; change a weight "
                             "or set normalize: false.")


def _merge_wise_ft(job: TensorJob) -> torch.Tensor:
    return _interp.wise_ft(job.base, job.finetuned[0], job.params["alpha"])


def _merge_hma(job: TensorJob) -> torch.Tensor:
    alpha = _interp.hma_alpha_for(job.layer, job.num_layers, job.params["alphas"])
    return _interp.hma(job.base, job.finetuned[0], alpha)


# -- task-vector family

def _merge_task_arithmetic(job: TensorJob) -> torch.Tensor:
    return _add_scaled(job, job.take_taus(), job.params["lam"])


def _ties_trimmed(job: TensorJob) -> list[torch.Tensor]:
    keep, taus = job.params["keep"], job.take_taus()
    if job.params["scope"] == "global":
        return [tau.mul_(_sp.threshold_mask(tau.abs(), thr)) for tau, thr in zip(taus, job.stats)]
    return [tau if keep >= 1 else tau.mul_(_sp.magnitude_mask(tau, keep)) for tau in taus]


def _merge_ties(job: TensorJob) -> torch.Tensor:
    p = job.params
    taus = job.take_taus()
    if _k.on_cpu_fast_path(job.base, *taus):
        # the same trim, election and disjoint mean, in place: exact selection instead of a sort, numpy masks,
        # blocks that stay in cache; the result is written into the base the job owns (forgetlab.merge.kernels)
        if p["scope"] == "global":
            cuts = [_math.inf if thr is None else thr for thr in job.stats]
        elif p["keep"] < 1:
            k = _sp.keep_count(job.base.numel(), p["keep"])
            cuts = [_k.top_cut_(tau, k) for tau in taus]
        else:
            cuts = None
        return _k.ties_combine_into_(job.base, taus, p["weights"], p["lam"], cuts)
    merged = ties_combine(_ties_trimmed(job), p["weights"])  # other devices: torch.kthvalue, no copies to the CPU
    return job.base + p["lam"] * merged


def _dare_parts(job: TensorJob) -> list[torch.Tensor]:
    taus = job.take_taus()
    if _k.on_cpu_fast_path(job.base, *taus):  # in place, block by block, the same draws (forgetlab.merge.kernels)
        return [_k.dare_(tau, job.params["drop"], job.generator(i)) for i, tau in enumerate(taus)]
    return [_sp.dare(tau, job.params["drop"], job.generator(i)) for i, tau in enumerate(taus)]


def _merge_dare_linear(job: TensorJob) -> torch.Tensor:
    return _add_scaled(job, _dare_parts(job), job.params["lam"])


def _merge_dare_ties(job: TensorJob) -> torch.Tensor:
    parts = _dare_parts(job)
    if _k.on_cpu_fast_path(job.base, *parts):
        return _k.ties_combine_into_(job.base, parts, job.params["weights"], job.params["lam"])
    return job.base + job.params["lam"] * ties_combine(parts, job.params["weights"])


def _merge_breadcrumbs(job: TensorJob) -> torch.Tensor:
    p = job.params
    taus = job.take_taus()
    if _k.on_cpu_fast_path(job.base, *taus) and p["keep"] < 1:  # exact selection, in place
        if p["keep"] + p["gamma"] > 1 + 1e-12:
            _sp.breadcrumbs(taus[0], p["keep"], p["gamma"])  # raises the same message
        n_top, n_keep = _sp.breadcrumbs_counts(job.base.numel(), p["keep"], p["gamma"])
        return _add_scaled(job, [_k.breadcrumbs_(tau, n_top, n_keep) for tau in taus], p["lam"])
    parts = [_sp.breadcrumbs(tau, p["keep"], p["gamma"]) for tau in taus]
    return _add_scaled(job, parts, p["lam"])


def _check_breadcrumbs(params: dict, n: int) -> None:
    if params["keep"] + params["gamma"] > 1 + 1e-12:
        raise ParameterError(f"breadcrumbs needs keep + gamma ≤ 1; got keep={params['keep']}, "
                             f"gamma={params['gamma']}. Lower one of them.")


def _merge_consensus(job: TensorJob) -> torch.Tensor:
    p = job.params
    taus = job.take_taus()
    if _k.on_cpu_fast_path(job.base, *taus):
        lams = [float(p["lam"])] * len(taus) if isinstance(p["lam"], (int, float)) else p["lam"]
        return _k.consensus_into_(job.base, taus, lams, p["k"], p["alpha"])
    return job.base + _consensus.consensus_merge(taus, p["lam"], p["k"], p["alpha"])


def _check_consensus(params: dict, n: int) -> None:
    if n and params["k"] > n:
        raise ParameterError(f"consensus: k={params['k']} exceeds the {n} fine-tuned models, so no entry could "
                             f"ever be kept; choose k between 1 and {n}.")


def _merge_pcb(job: TensorJob) -> torch.Tensor:
    p = job.params
    stats = job.stats if p["scope"] == "global" else None
    taus = job.take_taus()
    if _k.on_cpu_fast_path(job.base, *taus):  # blocked passes, exact selection of the β thresholds
        lams = [float(p["lam"])] * len(taus) if isinstance(p["lam"], (int, float)) else p["lam"]
        return _k.pcb_merge_into_(job.base, taus, p["keep"], lams, stats)
    return job.base + _pcb.pcb_merge(taus, p["keep"], p["lam"], stats)


def _merge_fapm(job: TensorJob) -> torch.Tensor:
    p = job.params
    ratios = [p["adapter_ratio"] if job.is_adapter(i) else p["ratio"] for i in range(len(job.finetuned))]
    taus = job.take_taus()
    if _k.on_cpu_fast_path(job.base, *taus) and p["score"] in SCORES:
        # the scores of fapm.fapm_scores block by block, exact selection, pruned in place (forgetlab.merge.kernels)
        w0_abs = job.base.abs()
        mean0 = w0_abs.mean()
        mean0 = float(mean0) if bool(mean0 > 0) else None  # all-zero base tensor: magnitude (fapm.py)
        score = torch.empty_like(w0_abs)
        parts = [_k.fapm_prune_(tau, w0_abs, mean0, r, p["score"], score) for tau, r in zip(taus, ratios)]
        return _add_scaled(job, parts, p["lam"])
    parts = [fapm_prune(tau, job.base, r, p["score"]) for tau, r in zip(taus, ratios)]
    return _add_scaled(job, parts, p["lam"])


def _scope(default: str) -> ParamSpec:
    return ParamSpec("scope", "str", default, "\"tensor\": statistics per tensor; \"global\": over the whole "
                     "flattened task vector (a first streaming pass).", choices=("tensor", "global"))


BUILTIN = [
    MethodSpec("linear", "Model soup: weighted average of the fine-tuned models.",
               (_weights(), ParamSpec("normalize", "bool", True, "Divide by the sum of the weights.")),
               _merge_linear, check=_check_linear, mergekit="linear", formula="θ = Σ wi·θi / Σ wi"),
    MethodSpec("wise_ft", "WiSE-FT: interpolate the base and one fine-tuned model.",
               (ParamSpec("alpha", "float", 0.5, "α = 0 gives the base, α = 1 the fine-tuned model.", UNIT),),
               _merge_wise_ft, max_models=1, formula="θ = (1 − α)·θ0 + α·θ1"),
    MethodSpec("hma", "Heterogeneous model averaging: WiSE-FT with one α per block of layers.",
               (ParamSpec("alphas", "floats", [0.1, 0.2, 0.3], "One α per block of decoder layers, input to "
                          "output (B = number of values); embeddings use the first, final norm/lm_head the last.",
                          UNIT),),
               _merge_hma, max_models=1, needs_layers=True, formula="θ = (1 − αb)·θ0 + αb·θ1 for block b"),
    MethodSpec("task_arithmetic", "Task arithmetic: add the weighted sum of task vectors to the base.",
               (_lam(), _weights()), _merge_task_arithmetic, mergekit="task_arithmetic",
               formula="θ = θ0 + λ·Σ wt·τt"),
    MethodSpec("ties", "TIES: trim each task vector, elect signs, average the agreeing entries.",
               (ParamSpec("keep", "float", 0.2, "Fraction of each task vector's entries kept (top |τ|).", UNIT),
                _lam(), _scope("tensor"), _weights()),
               _merge_ties, mergekit="ties",
               collector=lambda n, total, p: TiesGlobalCollector(n, total, p["keep"]),
               global_when=lambda p: p.get("scope") == "global",
               formula="θ = θ0 + λ·disjoint_mean(sign_elect(trim(τt, keep)))"),
    MethodSpec("dare_linear", "DARE: randomly drop task-vector entries, rescale, then task arithmetic.",
               (ParamSpec("drop", "float", 0.9, "Probability p of dropping each entry; survivors × 1/(1 − p).", UNIT),
                _lam(), _weights(), _seed()),
               _merge_dare_linear, mergekit="dare_linear", formula="θ = θ0 + λ·Σ wt·dare(τt, p)"),
    MethodSpec("dare_ties", "DARE then TIES sign election and disjoint mean.",
               (ParamSpec("drop", "float", 0.9, "Probability p of dropping each entry; survivors × 1/(1 − p).", UNIT),
                _lam(), _weights(), _seed()),
               _merge_dare_ties, mergekit="dare_ties",
               formula="θ = θ0 + λ·disjoint_mean(sign_elect(dare(τt, p)))"),
    MethodSpec("breadcrumbs", "Model Breadcrumbs: drop the largest outliers and the smallest entries, then add.",
               (ParamSpec("keep", "float", 0.1, "Fraction of entries kept per tensor (keep + gamma ≤ 1).", UNIT),
                ParamSpec("gamma", "float", 0.01, "Fraction of largest-magnitude entries removed per tensor.", UNIT),
                _lam(), _weights()),
               _merge_breadcrumbs, check=_check_breadcrumbs, mergekit="breadcrumbs",
               formula="θ = θ0 + λ·Σ wt·breadcrumbs(τt, keep, γ)"),
    MethodSpec("consensus", "Consensus / TALL masks: keep the entries that at least k tasks find important.",
               (ParamSpec("lam", "float", 0.4, "TALL-mask threshold λt: mt = |τt| ≥ λt·|θMT − θt| (one or per "
                          "model).", (0.0, 100.0), per_model=True, model_key="lam"),
                ParamSpec("k", "int", 2, "Minimum number of task masks that must select an entry.", (1, 1000)),
                ParamSpec("alpha", "float", 1.0, "Scaling α of the masked sum of task vectors.", UNIT)),
               _merge_consensus, check=_check_consensus,
               formula="θ = θ0 + α·(Σt τt) ⊙ [Σt mt ≥ k]"),
    MethodSpec("pcb", "PCB-merging: balance intra- and inter-task parameter competition, drop, average.",
               (ParamSpec("keep", "float", 0.2, "Fraction r of entries of each balance matrix β kept.", UNIT),
                ParamSpec("lam", "float", 1.0, "Scaling λ (one number, or one λi per model, e.g. from the "
                          "CMA-ES search).", LAM_RANGE, per_model=True, model_key="lam"),
                _scope("global")),
               _merge_pcb,
               collector=lambda n, total, p: _pcb.PCBGlobalCollector(n, total, p["keep"]),
               global_when=lambda p: p.get("scope") == "global",
               formula="θ = θ0 + Σi λi·β̂i ⊙ τi / Σi β̂i"),
    MethodSpec("fapm", "FAPM: prune each task vector by forgetting-aware scores, then add (task arithmetic).",
               (ParamSpec("ratio", "float", 0.9, "Pruning ratio: fraction of each tensor's task-vector entries "
                          "zeroed (full fine-tunes; 0.9 as in the FAPM paper).", UNIT),
                ParamSpec("adapter_ratio", "float", ADAPTER_RATIO, "Pruning ratio for LoRA adapters' ΔW = B·A. The "
                          "FAPM rebuttal says it \"needs to be relatively small\" for LoRA (low-rank ΔW has few "
                          "redundant entries) but gives no number; 0.5 is forgetlab's choice.", UNIT),
                ParamSpec("score", "str", "fapm", "\"fapm\": |τ| − mean|W0|·|τ|/|W0|; ablations \"magnitude\" "
                          "(|τ|) and \"relative\" (−|τ|/|W0|).", choices=SCORES),
                _lam(), _weights()),
               _merge_fapm, formula="θ = θ0 + λ·Σ wt·mask_t ⊙ τt"),
]


def register_builtin() -> None:
    """Register every built-in method (idempotent)."""
    from forgetlab.merge.registry import METHODS
    for spec in BUILTIN:
        if spec.name not in METHODS:
            register(spec)


register_builtin()
