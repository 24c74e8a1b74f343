"""Training and scoring steps shared by the zoo presets, on top of `forgetlab.train.trainer.train`.

- `pretrain`: causal-LM training on general text (labels = input ids, blocks from `encode_text`).
- `finetune`: supervised fine-tuning on task pairs (labels −100 on prompt tokens, from `encode_pairs`).
- `score`: the model's `Scorecard` (held-out general loss, exact match and answer loss per task).
"""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.core.data import Probes, TaskPair, encode_pairs, encode_text
from forgetlab.core.evaluate import Scorecard, evaluate
from forgetlab.core.progress import Progress
from forgetlab.train.trainer import TrainResult, train
from forgetlab.zoo.presets import EvalSpec, TrainSpec


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def pretrain(model: torch.nn.Module, tokenizer, texts: Sequence[str], run: TrainSpec, *, seed: int,
             progress: Progress = None, eval_every: int | None = None, eval_fn=None) -> TrainResult:
    """Pretrain `model` in place on `texts` cut into blocks of `run.max_length` tokens (AdamW, cosine decay);
    `eval_fn(model, step)` at step 0, every `eval_every` steps and at the end (it must not change the model)."""
    blocks = encode_text(tokenizer, texts, block_size=run.max_length)
    return train(model, blocks, steps=run.steps, batch_size=run.batch_size, lr=run.lr, optimizer="adamw",
                 weight_decay=run.weight_decay, warmup=run.warmup, seed=seed, pad_id=_pad_id(tokenizer),
                 eval_every=eval_every, eval_fn=eval_fn, record_distance=False, progress=progress)


def finetune(model: torch.nn.Module, tokenizer, pairs: Sequence[TaskPair], run: TrainSpec, *, seed: int,
             template: str | None = None, progress: Progress = None) -> TrainResult:
    """Fine-tune `model` in place on task pairs, loss on answer tokens + EOS only (AdamW, cosine decay)."""
    examples = encode_pairs(tokenizer, pairs, max_length=run.max_length, template=template)
    return train(model, examples, steps=run.steps, batch_size=run.batch_size, lr=run.lr, optimizer="adamw",
                 weight_decay=run.weight_decay, warmup=run.warmup, seed=seed, pad_id=_pad_id(tokenizer),
                 progress=progress)


def score(model: torch.nn.Module, tokenizer, probes: Probes, how: EvalSpec, *, name: str,
          progress: Progress = None) -> Scorecard:
    """Scorecard of `model` on the zoo's held-out Wikipedia blocks and every task's eval split."""
    return evaluate(model, tokenizer, probes, name=name, split="eval", batch_size=how.batch_size,
                    block_size=how.block_size, max_general=how.max_general, max_task=how.max_task,
                    progress=progress)


def train_summary(result: TrainResult) -> dict:
    """What the manifest keeps of a training run: steps, first/last loss, seconds, settings."""
    losses = result.losses
    tail = losses[-max(1, len(losses) // 10):] if losses else []
    return {
        "steps": result.completed_steps,
        "first_loss": losses[0] if losses else None,
        "final_loss": result.final_loss if losses else None,
        "final_loss_mean_last_10pct": sum(tail) / len(tail) if tail else None,
        "seconds": round(result.seconds, 3),
        "settings": result.settings,
    }
