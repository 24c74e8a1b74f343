"""What a linearity run returns: per-submodule scores (d(α) curves, NLS, Property 1 residuals) and the result
that holds them, with its tables and save format (computed by `forgetlab.analysis.linearity`)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd

from forgetlab.core.anatomy import part_words
from forgetlab.core.errors import ParameterError


@dataclass
class SubmoduleScore:
    """Scores of one submodule over the samples: ``d`` [samples, alphas], ``nls`` [samples] (NLS_x) and
    ``residual`` [samples] (the Property 1 residual r_x). NaN where the submodule did not change (τ = 0)."""

    level: str
    layer: Optional[int]
    head: Optional[int]
    module: str
    d: np.ndarray
    nls: np.ndarray
    residual: np.ndarray

    @staticmethod
    def _nanstat(fn, x, axis=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(x, axis=axis)

    @property
    def nls_mean(self) -> float:
        """Mean NLS over samples."""
        return float(self._nanstat(np.nanmean, self.nls))

    @property
    def nls_std(self) -> float:
        """Population standard deviation of NLS over samples."""
        return float(self._nanstat(np.nanstd, self.nls))

    @property
    def curve(self) -> np.ndarray:
        """Mean d(α) over samples, one value per α."""
        return self._nanstat(np.nanmean, self.d, axis=0)

    @property
    def curve_std(self) -> np.ndarray:
        """Standard deviation of d(α) over samples."""
        return self._nanstat(np.nanstd, self.d, axis=0)


@dataclass
class NonlinearityResult:
    """Non-linearity scores of every requested submodule for one task and model (see the module docstring)."""

    task: str
    model: str
    alphas: tuple
    samples: int
    capture: str
    levels: tuple
    scores: list[SubmoduleScore]
    seed: Optional[int] = None     # the seed of the probe draw (None: the first `samples` probe pairs)

    def to_frame(self) -> pd.DataFrame:
        """One row per submodule: level, layer, module, head, nls_mean, nls_std, residual_mean, n, curve
        (mean d per α, a list), curve_std."""
        rows = []
        for s in self.scores:
            rows.append({
                "level": s.level, "layer": s.layer, "module": s.module, "head": s.head,
                "nls_mean": s.nls_mean, "nls_std": s.nls_std,
                "residual_mean": float(SubmoduleScore._nanstat(np.nanmean, s.residual)),
                "n": int(np.isfinite(s.nls).sum()),
                "curve": [float(v) for v in s.curve], "curve_std": [float(v) for v in s.curve_std],
            })
        df = pd.DataFrame(rows, columns=["level", "layer", "module", "head", "nls_mean", "nls_std",
                                         "residual_mean", "n", "curve", "curve_std"])
        df["layer"] = df["layer"].astype("Int64")
        df["head"] = df["head"].astype("Int64")
        return df

    def flat_frame(self) -> pd.DataFrame:
        """`to_frame` with each curve written as one text field 'd(α0);d(α1);…' (for CSV files)."""
        df = self.to_frame()
        return df.assign(curve=[";".join(f"{v:.6g}" for v in c) for c in df["curve"]],
                         curve_std=[";".join(f"{v:.6g}" for v in c) for c in df["curve_std"]])

    def curves_frame(self) -> pd.DataFrame:
        """Long format: level, layer, module, head, alpha, d_mean, d_std, ideal (= 1 − α)."""
        rows = []
        for s in self.scores:
            for a, m, sd in zip(self.alphas, s.curve, s.curve_std):
                rows.append({"level": s.level, "layer": s.layer, "module": s.module, "head": s.head,
                             "alpha": float(a), "d_mean": float(m), "d_std": float(sd), "ideal": 1.0 - float(a)})
        df = pd.DataFrame(rows)
        if len(df):
            df["layer"] = df["layer"].astype("Int64")
            df["head"] = df["head"].astype("Int64")
        return df

    def by_level(self) -> pd.DataFrame:
        """Per level: mean and std of NLS over all samples of all its submodules, the count of submodules and
        of those the task vector leaves unchanged (τ = 0 there, e.g. modules a LoRA adapter does not target:
        their NLS is undefined, NaN, and left out of the mean)."""
        rows = []
        for level in self.levels:
            mine = [s for s in self.scores if s.level == level]
            vals = np.concatenate([s.nls for s in mine] or [np.array([])])
            vals = vals[np.isfinite(vals)]
            rows.append({"level": level, "nls_mean": float(vals.mean()) if len(vals) else float("nan"),
                         "nls_std": float(vals.std()) if len(vals) else float("nan"),
                         "submodules": len(mine),
                         "unchanged": sum(not np.isfinite(s.nls).any() for s in mine)})
        return pd.DataFrame(rows)

    def unchanged_note(self) -> str | None:
        """A sentence naming the levels whose NLS is NaN because τ = 0 on every one of their submodules."""
        df = self.by_level()
        empty = [r.level for r in df.itertuples() if r.submodules and r.unchanged == r.submodules]
        if not empty:
            return None
        return (f"NLS is undefined (NaN) at the {', '.join(empty)} level(s): the task vector is zero on every "
                "submodule there (a LoRA adapter changes only the modules it targets), so nothing moves with α.")

    def get(self, level: str, layer: Optional[int] = None, head: Optional[int] = None) -> SubmoduleScore:
        """The score of one submodule."""
        for s in self.scores:
            if s.level == level and s.layer == layer and s.head == head:
                return s
        raise ParameterError(f"No score for level={level}, layer={layer}, head={head} in this result.")

    def to_dict(self) -> dict:
        """A JSON-ready dict (per-sample arrays included)."""
        return {"task": self.task, "model": self.model, "alphas": list(self.alphas), "samples": self.samples,
                "capture": self.capture, "levels": list(self.levels), "seed": self.seed,
                "scores": [{"level": s.level, "layer": s.layer, "head": s.head, "module": s.module,
                            "d": np.nan_to_num(s.d, nan=-1.0).tolist(), "nls": s.nls.tolist(),
                            "residual": s.residual.tolist()} for s in self.scores]}

    @classmethod
    def from_dict(cls, data: dict) -> "NonlinearityResult":
        """Inverse of `to_dict`."""
        scores = []
        for s in data["scores"]:
            d = np.asarray(s["d"], dtype=float)
            d[d == -1.0] = np.nan
            scores.append(SubmoduleScore(s["level"], s["layer"], s["head"], s["module"], d,
                                         np.asarray(s["nls"], dtype=float), np.asarray(s["residual"], dtype=float)))
        return cls(data["task"], data["model"], tuple(data["alphas"]), int(data["samples"]), data["capture"],
                   tuple(data["levels"]), scores, data.get("seed"))


NLS_MEANING = ("A score of 0 means that scaling a part's change between the base and the fine-tune moves its output "
               "in a straight line from the base's to the fine-tune's; the larger the score, the less interpolating "
               "or merging that part behaves as its weights suggest.")


def score_words(score: SubmoduleScore) -> str:
    """A scored submodule in plain words ("layer 1's MLP", "layer 0's attention head 2", "the whole model")."""
    return part_words(score.layer, score.level, score.head)


def takeaway(result: NonlinearityResult) -> list[str]:
    """The scores in two sentences: the least and the most linear scored part (mean non-linearity score over the
    samples, unitless) beside the whole model's, then what the score means. Parts whose task vector is zero (NaN
    score) are left out; with the model level alone, its score."""
    scored = [s for s in result.scores if np.isfinite(s.nls_mean)]
    whole = next((s for s in scored if s.level == "model"), None)
    parts = [s for s in scored if s.level != "model"]
    if not parts:
        if whole is None:
            return []
        return [f"The whole model scores a non-linearity score (NLS) of {whole.nls_mean:.3f}.", NLS_MEANING]
    least = max(parts, key=lambda s: s.nls_mean)
    most = min(parts, key=lambda s: s.nls_mean)
    name = score_words(least)
    first = (f"{name[:1].upper()}{name[1:]} is the least linear part (non-linearity score, NLS, "
             f"{least.nls_mean:.3f}) and {score_words(most)} the most linear "
             f"({most.nls_mean:.3f})" + (f"; the whole model scores {whole.nls_mean:.3f}." if whole else "."))
    return [first, NLS_MEANING]
