"""Where forgetting shows in text: every token scored under two models (docs/textdiff.md).

For a model θ (a fine-tune, a WiSE-FT point θ0 + α(θ1 − θ0), a merge, any compatible folder) and a reference
(`against`, the base by default), every token of a text is scored under both. The text is either each line of
a file, tokenized as the tokenizer does by default (`tokenizer(line)["input_ids"]`), or the held-out general
text cut into exactly the blocks the scorecard's general loss scores (`forgetlab.core.evaluate.general_loss`),
so that the mean rise over them is the scorecard's general-loss rise. Row i of a sequence predicts token i
from tokens 0…i−1 (row 0 predicts nothing: its scores are empty). Per row:

- logp_base, logp_model: log p(token | prefix) under the reference and the model (natural log, nats);
- rise = logp_base − logp_model: nats the model lost on that token (positive: forgotten);
- kl = KL(p_base ‖ p_model) = Σ_v p_base(v)·(log p_base(v) − log p_model(v)) over the whole vocabulary;
- the top-3 next-token predictions of each model with their probabilities.

Summaries (`TextDiffResult`): the tokens and contexts (the 8 tokens up to and including the token) with the
largest rise and KL, the rise per token class (`token_class`), the rise along the sequence, and a logit lens:
the next-token loss when the residual stream after each layer is read through the final norm and the head, for
both models (layer 0: the embeddings; the last layer gives the models' own loss), read on the first `lens_blocks`
sequences (64 by default: the lens costs a pass through the head per layer and model).

Cost: one forward pass per model per batch of sequences, on the job's device. The logits of one sequence at a
time are formed from the final hidden states and the log-softmax, KL and top-k are computed over the vocabulary
in chunks (`VOCAB_CHUNK` columns), so the memory beyond the forward pass is one sequence's logits per model.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

from forgetlab.analysis.base import ANALYSES, Analysis, pool_source
from forgetlab.analysis.textdiff_inputs import (heldout_sequences, load_scored_model, read_text_lines,  # noqa: F401
                                                resolve_model, text_sequences)
from forgetlab.analysis.textdiff_memory import estimate_textdiff
from forgetlab.analysis.textdiff_results import (CLASSES, COLUMNS, KIND, TABLE_FILE, TextDiffResult,  # noqa: F401
                                                 from_saved, saved_results, takeaway)
from forgetlab.analysis.textdiff_scoring import (VOCAB_CHUNK, LogitReader, score_sequences, shown,  # noqa: F401
                                                 token_class, token_scores, token_table)
from forgetlab.core.errors import ParameterError, ProbeDataError, check_fraction
from forgetlab.core.evaluate import GENERAL_LOSS_MODES, check_limits
from forgetlab.core.memory import dtype_name, job_dtype, large_frees_to_os
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.core.settings import count_field, device_field, dtype_field, setting
from forgetlab.plots.textdiff import figures

SPLITS = ("heldout",)
LENS_BLOCKS = 64        # sequences the logit lens reads by default (it costs a head pass per layer and model)
# (the names above marked F401 are this module's public face: tests and scripts read the token scoring, the
# inputs and the result through forgetlab.analysis.textdiff)


# ------------------------------------------------------------------------------------------ the analysis


def _sources(text, lines, split) -> None:
    given = [x for x in (text, lines, split) if x is not None]
    if len(given) > 1:
        raise ParameterError("Give one text to score: a text file (--text), lines, or --split heldout, not several.")
    if split is not None and split not in SPLITS:
        raise ParameterError(f"Unknown split {split!r}; the split textdiff scores is: {', '.join(SPLITS)}.")


def check(pool, model: str, *, against: str = "base", alpha: Optional[float] = None, text=None,
          lines: Optional[Sequence[str]] = None, split: Optional[str] = None, max_general: Optional[int] = None,
          block_size: int = 128, general_mode: str = "blocks", batch_size: int = 16, home=None) -> None:
    """Every setting checked, nothing loaded: both models exist and fit the pool's base, α ∈ [0, 1], one text
    source, a readable non-empty text, held-out text in the pool when it is the source, sane counts."""
    check_limits(max_general=max_general, block_size=block_size, batch_size=batch_size)
    _sources(text, lines, split)
    resolve_model(pool, model, alpha=alpha, home=home)
    resolve_model(pool, against, home=home, role="--against")
    if text is not None:
        read_text_lines(text)
    elif lines is not None:
        if not any(str(line).strip() for line in lines):
            raise ProbeDataError("The text is empty: type or paste at least one line to score.")
    else:
        heldout_sequences(pool, max_general=1, block_size=block_size, general_mode=general_mode)


def textdiff(pool, model: str, *, against: str = "base", alpha: Optional[float] = None, text=None,
             lines: Optional[Sequence[str]] = None, split: Optional[str] = None, max_general: Optional[int] = None,
             block_size: int = 128, general_mode: str = "blocks", batch_size: int = 16, device: Optional[str] = None,
             dtype=None, lens: bool = True, lens_blocks: Optional[int] = LENS_BLOCKS, vocab_chunk: int = VOCAB_CHUNK,
             home=None, progress: Progress = None) -> TextDiffResult:
    """Score every token of a text under `model` (at WiSE-FT point `alpha` when given) and `against` (see the
    module docstring). The text: the lines of the file `text`, the strings `lines`, or (the default, `split`
    "heldout") the scorecard's held-out blocks (`max_general`, `block_size`, `general_mode` as in
    `forgetlab.core.evaluate.evaluate`). The logit lens reads the first `lens_blocks` sequences (None: all of
    them; it costs one pass through the head per layer and model); `lens=False` skips it. `dtype` (None: bfloat16
    on cuda, float32 elsewhere) is the precision both models are loaded and run in; the logits are taken to
    float32 before the log-softmax, KL, top-k and the lens's losses. Its peak: `textdiff_memory`."""
    check_limits(max_general=max_general, block_size=block_size, batch_size=batch_size, vocab_chunk=vocab_chunk,
                 lens_blocks=lens_blocks)
    _sources(text, lines, split)
    device = device or "cpu"            # as ModelPool.load: both sides on one device
    dt = job_dtype(dtype, device)
    start = time.perf_counter()
    mref = resolve_model(pool, model, alpha=alpha, home=home)
    aref = resolve_model(pool, against, home=home, role="--against")
    tok = pool.tokenizer
    seqs, notes, source = text_sequences(pool, text=text, lines=lines, max_general=max_general,
                                         block_size=block_size, general_mode=general_mode)
    report(progress, 0.0, f"loading {mref.label} and {aref.label}")
    base_model = load_scored_model(pool, aref, device, dt)
    report(progress, 0.05, f"loaded {aref.label}")
    tuned_model = load_scored_model(pool, mref, device, dt)
    readers = (LogitReader(base_model, lens), LogitReader(tuned_model, lens))
    if lens and not all(r.lens for r in readers):
        notes.append("no logit lens: this architecture has no final norm forgetlab knows how to read the residual "
                     "stream through")
    # on the CPU, the per-sequence logits (S·V·4: megabytes each) go back to the system when freed, instead of
    # piling up as glibc heap that the next ones fragment (docs/scaling.md, the textdiff row)
    with large_frees_to_os(device):
        acc = score_sequences(readers, seqs, batch_size, tok.pad_token_id or 0, vocab_chunk, scaled(progress, 0.1, 0.97),
                     lens_blocks)
    frame = token_table(acc, tok)
    lens_rows = []
    if acc.lens_base is not None and acc.lens_tokens:
        for d in range(len(acc.lens_base)):
            lb, lm = float(acc.lens_base[d]) / acc.lens_tokens, float(acc.lens_model[d]) / acc.lens_tokens
            lens_rows.append({"depth": d, "loss_base": lb, "loss_model": lm, "rise": lm - lb,
                              "tokens": acc.lens_tokens})
    recipe = {"analysis": KIND, "pool": pool_source(pool), "pool_name": getattr(pool, "name", None), "model": model,
              "against": against, "alpha": mref.alpha, "model_label": mref.label, "source": source,
              "max_general": max_general, "block_size": block_size, "general_mode": general_mode,
              "batch_size": batch_size, "lens": lens, "lens_blocks": lens_blocks, "dtype": dtype_name(dt)}
    result = TextDiffResult(model=mref.label, against=aref.label, source=source, tokens=frame,
                            docs=[s.name for s in seqs], lens=lens_rows, notes=notes,
                            seconds=time.perf_counter() - start, recipe=recipe)
    s = result.summary()
    report(progress, 1.0, f"{s['tokens']} tokens: mean rise {s['mean_rise']:.4f} nats, mean KL {s['mean_kl']:.4f}")
    return result


# ------------------------------------------------------------------------------------------ the verbs

SHOWN_CONTEXTS = ["where", "position", "context", "rise", "kl", "top1_base", "top1_model"]


@dataclass
class TextDiffSettings:
    """What a text diff scores: `model` (at WiSE-FT `alpha`) against `against`, on a text file, typed lines or
    the held-out split; `top`: the contexts the CLI shows per table."""

    model: Optional[str] = setting(None, help="a model of the pool, a merge under the workspace's merges/, or a "
                                              "model folder", required=True)
    alpha: Optional[float] = setting(None, help="score the WiSE-FT point θ0 + α(θ1 − θ0) of --model (a fine-tuned "
                                                "model of the pool)", label="α")
    against: str = setting("base", help="the reference: a model of the pool, a merge or a model folder")
    text: Optional[str] = setting(None, help="score each line of this UTF-8 file (a line longer than the context is "
                                             "split)", metavar="FILE", exclusive="source")
    split: Optional[str] = setting(None, help="score the pool's held-out general text in the scorecard's blocks (the "
                                              "default)", choices=SPLITS, exclusive="source")
    lines: Optional[tuple[str, ...]] = setting(None, help="lines of typed text to score", cli=False)
    max_general: Optional[int] = count_field(None, "at most this many general-text blocks")
    general_loss: str = setting("blocks", help="held-out blocks as the scorecard cuts them: blocks or documents",
                                choices=GENERAL_LOSS_MODES)
    block_size: int = count_field(128, "tokens per held-out block", cli=False)
    batch_size: int = count_field(16, "sequences per forward pass")
    device: Optional[str] = device_field()
    dtype: Optional[str] = dtype_field("both models and their forward passes")
    lens: bool = setting(True, help="skip the per-layer logit lens", flag="--no-lens")
    lens_blocks: int = setting(LENS_BLOCKS, help="read the logit lens on the first N sequences (it costs a pass "
                                                 "through the head per layer and model)")
    top: int = setting(10, help="contexts shown per table")


def _arguments(settings: TextDiffSettings) -> dict:
    """`textdiff`'s keyword arguments (besides the model) from the settings."""
    return dict(against=settings.against, alpha=settings.alpha, text=settings.text,
                lines=list(settings.lines) if settings.lines is not None else None, split=settings.split,
                max_general=settings.max_general, block_size=settings.block_size, general_mode=settings.general_loss,
                batch_size=settings.batch_size, device=settings.device, dtype=settings.dtype, lens=settings.lens,
                lens_blocks=settings.lens_blocks)


def check_settings(settings: TextDiffSettings, pool=None) -> None:
    """Refuse bad settings (with the pool: every check of `check`) without loading a model."""
    if settings.top < 1:
        raise ParameterError(f"--top must be at least 1; got {settings.top}.")
    check_limits(lens_blocks=settings.lens_blocks)
    values = _arguments(settings)
    _sources(values["text"], values["lines"], values["split"])
    if settings.alpha is not None:
        check_fraction("--alpha", settings.alpha)
    if pool is not None:
        for name in ("device", "dtype", "lens", "lens_blocks"):
            del values[name]
        check(pool, settings.model, **values)


def compute(pool, settings: TextDiffSettings, progress: Progress = None, executor=None) -> TextDiffResult:
    """`textdiff` with these settings."""
    return textdiff(pool, settings.model, progress=progress, **_arguments(settings))


def estimate(pool, settings: TextDiffSettings):
    """The run's peak (`estimate_textdiff`)."""
    return estimate_textdiff(pool, settings.model, **_arguments(settings))


def recipe(result: TextDiffResult) -> dict:
    """What a saved text diff records: the settings it ran with (its pool, both models, the text, the limits)."""
    out = dict(result.recipe)
    out.setdefault("model", result.model)
    return out


def cli_report(result: TextDiffResult, settings: TextDiffSettings) -> list:
    """The CLI's lines: what was scored, the losses and the mean rise and KL, the notes, the rise per token
    class, the logit lens, and the `settings.top` contexts with the largest rise and KL."""
    s = result.summary()
    lines: list = [f"textdiff of {result.model} against {result.against} on {result.source}: {s['tokens']} tokens "
                   f"in {len(result.docs)} sequences, {result.seconds:.1f} s",
                   f"loss {s['loss_base']:.4f} → {s['loss_model']:.4f}: mean rise {s['mean_rise']:.4f} nats, mean "
                   f"KL {s['mean_kl']:.4f} nats",
                   *[f"note: {note}" for note in result.notes], "rise per token class:", result.by_class()]
    if result.lens:
        lines += [f"logit lens (next-token loss read after each layer on {result.lens[0]['tokens']} tokens; depth 0 "
                  "= embeddings):", result.lens_frame()]
    for by in ("rise", "kl"):
        lines += [f"contexts with the largest {by}:", result.top_contexts(by, settings.top)[SHOWN_CONTEXTS]]
    return lines


ANALYSIS = ANALYSES.add(KIND, Analysis(
    KIND, "text diff", TextDiffSettings, compute, TextDiffResult,
    help="token-level view of forgetting: every token scored under two models",
    description="Score every token of a text under a model and a reference (the base by default): logp under "
                "both, rise = logp_base − logp_model (nats lost), KL(p_base ‖ p_model) over the vocabulary and both "
                "models' top-3 predictions. Prints the rise per token class, the logit lens per layer and the "
                "contexts with the largest rise and KL. With the held-out split (the default) the blocks are the "
                "scorecard's, so the mean rise is the scorecard's general-loss rise.",
    checks=check_settings, estimate_fn=estimate, figures_fn=figures, recipe=recipe, report=cli_report,
    report_settings=True, to_saved=saved_results, from_saved=from_saved, takeaway_fn=takeaway))
