"""Forgetting, measured: generality on held-out text and speciality on each task (docs/methods.md).

- Generality: mean token loss (and perplexity = exp(loss)) on held-out general text.
- Speciality: per task, teacher-forced exact match — the argmax at every answer position (answer tokens and
  the closing EOS) equals the target token, the verdict greedy decoding would give, in one forward pass —
  and the mean answer-token loss.
Forward passes are batched, without gradients, and deterministic.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from forgetlab.core.benchmarks import evaluate_benchmarks
from forgetlab.core.data import (IGNORE, EncodedExample, Probes, TaskPair, check_template, collate,
                                 encode_documents, encode_pairs, encode_text)
from forgetlab.core.errors import ParameterError, ProbeDataError
from forgetlab.core.progress import Progress, report, scaled


@dataclass
class TaskScore:
    """Speciality on one task: exact-match rate, mean answer-token loss, number of pairs."""

    task: str
    exact_match: float
    answer_loss: float
    n: int


BENCHMARK_PREFIX = "lm-eval:"


@dataclass
class Scorecard:
    """Generality and speciality of one model."""

    model: str
    general_loss: float
    perplexity: float
    general_tokens: int
    tasks: dict[str, TaskScore] = field(default_factory=dict)
    benchmarks: dict[str, dict[str, float]] = field(default_factory=dict)   # lm-eval: {task: {metric: value}}

    def speciality(self, task: str | None = None) -> float:
        """Exact match on `task`, or the mean over tasks when None."""
        if task is not None:
            return self.tasks[task].exact_match
        return sum(t.exact_match for t in self.tasks.values()) / max(1, len(self.tasks))

    def forgetting(self, base: "Scorecard") -> float:
        """Generality lost against `base`: general loss(model) − general loss(base) (positive = forgot)."""
        return self.general_loss - base.general_loss

    def perplexity_change(self, base: "Scorecard") -> float:
        """The forgetting as a relative change of perplexity: exp(forgetting) − 1 (`perplexity_change`)."""
        return perplexity_change(self.forgetting(base))

    def to_frame(self) -> pd.DataFrame:
        """One row: model, general_loss, perplexity, then `<task>/exact_match` and `<task>/answer_loss`, then
        `lm-eval:<task>/<metric>` for each benchmark metric."""
        row = {"model": self.model, "general_loss": self.general_loss, "perplexity": self.perplexity}
        for t in self.tasks.values():
            row[f"{t.task}/exact_match"] = t.exact_match
            row[f"{t.task}/answer_loss"] = t.answer_loss
        for task, metrics in self.benchmarks.items():
            for metric, value in metrics.items():
                row[f"{BENCHMARK_PREFIX}{task}/{metric}"] = value
        return pd.DataFrame([row])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Scorecard":
        tasks = {k: TaskScore(**v) for k, v in d.get("tasks", {}).items()}
        benchmarks = {t: {m: float(v) for m, v in ms.items()} for t, ms in (d.get("benchmarks") or {}).items()}
        return cls(d["model"], d["general_loss"], d["perplexity"], d["general_tokens"], tasks, benchmarks)


def perplexity_change(delta_loss: float) -> float:
    """A change of mean token loss Δ (nats) as the relative change of perplexity it means: exp(Δ) − 1
    (docs/methods.md#perplexity-change); +0.049 nats → +0.050 (perplexity 5.0 % higher). NaN stays NaN."""
    if delta_loss != delta_loss:
        return float("nan")
    return math.expm1(delta_loss) if delta_loss < 700 else math.inf     # exp overflows a float past ~709


def perplexity_text(delta_loss: float) -> str:
    """A change of held-out loss Δ (nats) as the relative change of perplexity, exp(Δ) − 1
    (`perplexity_change`): "perplexity +5.0 %" (one decimal; "perplexity n/a" for NaN)."""
    change = perplexity_change(float(delta_loss))
    if change != change:
        return "perplexity n/a"
    return f"perplexity {100 * change:+.1f} %"


def forgetting_text(delta_loss: float, digits: int = 3) -> str:
    """A forgetting figure with its size: "+0.049 nats (perplexity +5.0 %)". Every page, chart and table that
    shows a Δ of the general loss shows it this way (tables: a `perplexity change` column beside it,
    `forgetlab.plots.perplexity_columns`)."""
    if delta_loss != delta_loss:
        return "n/a"
    return f"{delta_loss:+.{digits}f} nats ({perplexity_text(delta_loss)})"


def scorecards_frame(cards: Sequence[Scorecard]) -> pd.DataFrame:
    """Several scorecards as one table, a row per model."""
    return pd.concat([c.to_frame() for c in cards], ignore_index=True) if cards else pd.DataFrame()


def scorecards_takeaway(cards: Sequence[Scorecard]) -> list[str]:
    """What a set of scorecards says, in two sentences (the Models page's Evaluate and `forgetlab eval`): which
    model forgets most — its general loss above the base's, nats (`forgetting_text`) — and which least; then the
    largest skill gain over the base on any task, in exact match, or where no model gains exact match, in answer
    loss (nats). Nothing without the base's card and another."""
    base = next((c for c in cards if c.model == "base"), None)
    others = [c for c in cards if c is not base and c.model != "base"]
    lost = {c.model: c.forgetting(base) for c in others} if base is not None else {}
    lost = {m: v for m, v in lost.items() if v == v}
    if not lost:
        return []
    most, least = max(lost, key=lost.get), min(lost, key=lost.get)
    first = f"{most} forgets most: its general loss is {forgetting_text(lost[most])} above the base's"
    first += f"; {least} forgets least, {forgetting_text(lost[least])}." if least != most else "."
    pairs = [(c, t) for c in others for t in c.tasks if t in base.tasks]
    if not pairs:
        return [first]
    em = max(pairs, key=lambda p: p[0].tasks[p[1]].exact_match - base.tasks[p[1]].exact_match)
    c, t = em
    if c.tasks[t].exact_match > base.tasks[t].exact_match:
        return [first, f"The largest skill gain is {c.model}'s on {t}: exact match {base.tasks[t].exact_match:.2f} "
                       f"→ {c.tasks[t].exact_match:.2f}."]
    c, t = min(pairs, key=lambda p: p[0].tasks[p[1]].answer_loss - base.tasks[p[1]].answer_loss)
    return [first, f"No model gains exact match over the base; the largest drop of answer loss is {c.model}'s on "
                   f"{t}: {base.tasks[t].answer_loss:.3f} → {c.tasks[t].answer_loss:.3f} nats."]


def _device_of(model) -> torch.device:
    # a model dispatched by accelerate may hold offloaded parameters on "meta": its hooks move the inputs
    return next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))


@torch.no_grad()
def token_losses(model, examples: Sequence[EncodedExample], batch_size: int = 16, pad_id: int = 0,
                 progress: Progress = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per example: (loss of every labelled token, whether its argmax was right), in input order.

    Token t is predicted from positions < t (shifted causal-LM loss). Examples are batched by length so that
    padding stays small; padding never changes a result because the attention mask hides it.
    """
    device = _device_of(model)
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].input_ids))
    out: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(examples)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = collate([examples[i] for i in idx], pad_id)
        logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                       use_cache=False).logits[:, :-1]   # no KV cache: one pass, nothing to reuse
        labels = batch["labels"][:, 1:].to(device)
        keep = labels != IGNORE
        for row, i in enumerate(idx):    # one sequence's logits in float32 at a time: memory of one row, not B
            scores = logits[row].float()
            losses = F.cross_entropy(scores, labels[row].clamp_min(0), reduction="none")
            right = scores.argmax(-1) == labels[row]
            out[i] = (losses[keep[row]].cpu(), right[keep[row]].cpu())
        del logits
        report(progress, min(len(order), start + batch_size) / len(order), "forward passes")
    return out  # type: ignore[return-value]


GENERAL_LOSS_MODES = ("blocks", "documents")
GENERAL_LOSS_HELP = (
    "General loss = mean next-token cross-entropy over held-out text. 'blocks' (default): documents are "
    "tokenized without BOS, joined with EOS between them and cut into blocks of 128 tokens (the last short "
    "block kept), every predicted token pooled; 'documents': each document is its own sequence (truncated "
    "to the block size), so no token is predicted across a document boundary."
)


def general_loss(model, tokenizer, texts: Sequence[str], *, block_size: int = 128, max_blocks: int | None = None,
                 batch_size: int = 16, mode: str = "blocks", progress: Progress = None) -> tuple[float, int]:
    """Mean token loss on general text (all predicted tokens pooled) and the number of tokens
    (GENERAL_LOSS_HELP: packed `blocks`, or one sequence per document with `mode="documents"`)."""
    if mode not in GENERAL_LOSS_MODES:
        raise ParameterError(f"Unknown general-loss mode {mode!r}; choose one of {', '.join(GENERAL_LOSS_MODES)}.")
    encode = encode_documents if mode == "documents" else encode_text
    blocks = encode(tokenizer, texts, block_size, max_blocks)   # only as much text as max_blocks needs
    per = token_losses(model, blocks, batch_size, tokenizer.pad_token_id or 0, progress)
    total = torch.cat([p[0] for p in per])
    return float(total.mean()), int(total.numel())


def task_score(model, tokenizer, task: str, pairs: Sequence[TaskPair], *, template: str | None = None,
               max_length: int = 256, batch_size: int = 16, progress: Progress = None) -> TaskScore:
    """Teacher-forced exact match and mean answer-token loss on a task's pairs."""
    if not pairs:
        raise ProbeDataError(f"Task {task!r} has no evaluation pairs.")
    examples = encode_pairs(tokenizer, pairs, max_length, template)
    per = token_losses(model, examples, batch_size, tokenizer.pad_token_id or 0, progress)
    exact = sum(bool(r.all()) for _, r in per) / len(per)
    loss = float(torch.cat([l for l, _ in per]).mean())
    return TaskScore(task, exact, loss, len(per))


def check_limits(**limits: int | None) -> None:
    """ParameterError unless every given limit (batch size, block size, max_general, max_task, …) is None or a
    whole number ≥ 1."""
    for name, value in limits.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ParameterError(f"{name} must be a whole number of at least 1 (or None for no limit); got "
                                 f"{value!r}.")


def evaluate(model, tokenizer, probes: Probes, *, name: str = "model", split: str = "eval",
             batch_size: int = 16, block_size: int = 128, max_general: int | None = None,
             max_task: int | None = None, tasks: Sequence[str] | None = None,
             benchmarks=None, benchmark_manager=None, general_mode: str = "blocks",
             progress: Progress = None) -> Scorecard:
    """Scorecard of a model: generality on `probes.general`, speciality on each task's `split` pairs, and —
    when `benchmarks` (a forgetlab.core.benchmarks.BenchmarkSpec) is given — its lm-eval tasks' metrics
    (`benchmark_manager` reuses lm-eval's task index between models)."""
    check_limits(batch_size=batch_size, block_size=block_size, max_general=max_general, max_task=max_task)
    was_training = model.training
    model.eval()
    names = list(tasks) if tasks is not None else list(probes.tasks)
    if names:
        check_template(tokenizer, probes.template)   # before the general loss, not after it
    bench_tasks = benchmarks.all_tasks if benchmarks is not None else []
    steps = 1 + len(names) + (1 if bench_tasks else 0)
    if probes.general:
        loss, n_tok = general_loss(model, tokenizer, probes.general, block_size=block_size, max_blocks=max_general,
                                   batch_size=batch_size, mode=general_mode, progress=scaled(progress, 0, 1 / steps))
    else:
        loss, n_tok = float("nan"), 0
    scores = {}
    for k, t in enumerate(names):
        pairs = getattr(probes.task(t), split)
        if max_task is not None:
            pairs = pairs[:max_task]
        scores[t] = task_score(model, tokenizer, t, pairs, template=probes.template, batch_size=batch_size,
                               progress=scaled(progress, (k + 1) / steps, (k + 2) / steps))
    bench: dict[str, dict[str, float]] = {}
    if bench_tasks:
        bench = evaluate_benchmarks(model, tokenizer, bench_tasks, include=benchmarks.include,
                                    limit=benchmarks.limit, manager=benchmark_manager,
                                    progress=scaled(progress, (steps - 1) / steps, 1.0))
    if was_training:
        model.train()
    report(progress, 1.0, f"evaluated {name}")
    return Scorecard(name, loss, math.exp(loss) if loss == loss else float("nan"), n_tok, scores, bench)


def largest_eval_batch(tokenizer, probes: Probes, *, tasks: Sequence[str] | None = None, split: str = "eval",
                       batch_size: int = 16, block_size: int = 128, max_general: int | None = None,
                       max_task: int | None = None, general_mode: str = "blocks") -> tuple[int, int]:
    """(rows, tokens per row) of the largest batch `evaluate` with these arguments feeds the model, batched as
    `token_losses` batches (by length): what its logits' size depends on. Tokenizes, runs no model."""
    groups = []
    if probes.general:
        encode = encode_documents if general_mode == "documents" else encode_text
        groups.append(encode(tokenizer, probes.general, block_size, max_general))
    for t in (list(tasks) if tasks is not None else list(probes.tasks)):
        pairs = getattr(probes.task(t), split)
        groups.append(encode_pairs(tokenizer, pairs[:max_task] if max_task is not None else pairs, 256,
                                   probes.template))
    best = (0, 0)
    for examples in groups:
        lengths = sorted(len(e.input_ids) for e in examples)
        for start in range(0, len(lengths), batch_size):
            rows = lengths[start:start + batch_size]
            if len(rows) * rows[-1] > best[0] * best[1]:
                best = (len(rows), rows[-1])
    return best
