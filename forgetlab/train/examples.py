"""The training data of a what-if fine-tune: a task's `train` pairs from the pool, encoded for training (the
loss on the answer tokens and EOS only). Read by the runs (`forgetlab.train.runs`) and by their memory
estimate (`forgetlab.train.memory`, which needs the longest sequence)."""
from __future__ import annotations

from typing import Optional

from forgetlab.core.data import encode_pairs
from forgetlab.core.errors import TrainingError


def training_examples(pool, task: str, *, max_length: int = 256, max_train: Optional[int] = None):
    """The task's `train` pairs encoded for fine-tuning (loss on answer tokens and EOS only)."""
    pool.check_tasks([task])
    pairs = list(pool.probes.task(task).train or [])
    if max_train is not None:
        pairs = pairs[: int(max_train)]
    if not pairs:
        raise TrainingError(f"Task {task!r} has no training data: add a `train:` file for it under "
                            "`probes: tasks:` in the pool file.")
    return encode_pairs(pool.tokenizer, pairs, max_length, pool.probes.template)
