"""What the base model answers while it pre-trains: a few eval prompts per task, decoded greedily every
`every(steps)` steps, so that a visitor watches the tasks' content arrive during the longest step of the build
(the app's build panel, `forgetlab zoo build`'s log, the manifest's `steps.base.snapshots`).

Each prompt is asked twice: in the task's own format (`Compute: 47+8=`), which the base never sees and which
its fine-tune teaches, and in the form the pre-training text states the task's facts in (`Compute: 47+8 =`,
`forgetlab.zoo.tasks.skill_sentence`). The base learns the content, so it answers the second; not the format,
so it fails the first — the lesson each fine-tune then adds, at a cost on general text.

The decoding runs in eval mode without gradients and draws no random numbers (greedy), so a watched
pre-training gives the same weights as an unwatched one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import pandas as pd
import torch

from forgetlab.core.data import TaskPair, format_prompt
from forgetlab.core.evaluate import general_loss
from forgetlab.zoo.manifest import manifest_beside
from forgetlab.zoo.tasks import skill_sentence

SNAPSHOTS = 14          # snapshots per pre-training, besides the one before the first step
PER_TASK = 8            # watched eval prompts per task
MAX_NEW_TOKENS = 16
GENERAL_BLOCKS = 8      # held-out blocks behind each snapshot's general loss


@dataclass(frozen=True)
class ProbeAnswer:
    """One task's prompt, its right answer and what the model wrote after it (greedy, up to EOS); the same
    fact's prompt in the pre-training text's form and what the model wrote after that."""

    task: str
    prompt: str
    answer: str
    said: str
    form_prompt: str = ""
    form_said: str = ""

    @property
    def correct(self) -> bool:
        """Whether the model wrote exactly the answer and then stopped: the task's exact match, compared as text."""
        return self.said == self.answer

    @property
    def knows(self) -> bool:
        """Whether, asked in the pre-training text's form, the model's first line is the answer."""
        return bool(self.form_prompt) and self.form_said.split("\n")[0].strip() == self.answer


@dataclass(frozen=True)
class PretrainingSnapshot:
    """The model at one step of its pre-training: its loss on held-out general text (a few blocks) and its
    answer to each watched prompt."""

    step: int
    steps: int
    loss: float
    answers: tuple[ProbeAnswer, ...]

    def to_dict(self) -> dict:
        """A JSON-ready dict (what the manifest keeps)."""
        return {"step": self.step, "steps": self.steps, "loss": self.loss,
                "answers": [asdict(a) for a in self.answers]}

    @classmethod
    def from_dict(cls, data: dict) -> "PretrainingSnapshot":
        """The snapshot `to_dict` wrote."""
        return cls(int(data["step"]), int(data["steps"]), float(data["loss"]),
                   tuple(ProbeAnswer(**a) for a in data.get("answers", ())))

    def to_frame(self) -> pd.DataFrame:
        """One row per watched prompt: task, prompt, answer, said, correct, form_prompt, form_said, knows."""
        return pd.DataFrame([{**asdict(a), "correct": a.correct, "knows": a.knows} for a in self.answers],
                            columns=["task", "prompt", "answer", "said", "correct", "form_prompt", "form_said",
                                     "knows"])

    @property
    def correct(self) -> int:
        """How many watched prompts the model answers exactly in the task's format."""
        return sum(a.correct for a in self.answers)

    @property
    def known(self) -> int:
        """How many watched facts the model answers in the pre-training text's form."""
        return sum(a.knows for a in self.answers)

    def line(self) -> str:
        """One log line: step, held-out loss, and how many watched facts the model knows and answers."""
        return (f"base at step {self.step}/{self.steps} · held-out loss {self.loss:.3f} · knows {self.known} of "
                f"{len(self.answers)} watched facts in the pre-training text's form, answers {self.correct} in "
                "the tasks' format")


def every(steps: int) -> int:
    """The interval between snapshots: `SNAPSHOTS` of them over a pre-training of `steps` steps."""
    return max(1, int(steps) // SNAPSHOTS)


def form_prompt(task: str, pair: TaskPair, form: str) -> str:
    """The prompt of `pair`'s fact in the pre-training text's `form`: its skill sentence without the answer at
    its end ("" when the sentence does not end with the answer)."""
    sentence = skill_sentence(task, pair, form)
    return sentence[:-len(pair.answer)].rstrip(" ") if pair.answer and sentence.endswith(pair.answer) else ""


def watched_pairs(tasks: dict[str, Sequence[TaskPair]], forms: dict[str, str] | None = None,
                  per_task: int = PER_TASK) -> list[tuple[str, TaskPair, str]]:
    """(task, pair, prompt in the pre-training form) for the first `per_task` eval pairs of each task: facts
    the pre-training text never holds. Without `forms` (or for a task not in it) the form prompt is ""."""
    forms = forms or {}
    return [(task, p, form_prompt(task, p, forms[task]) if task in forms else "")
            for task, pairs in tasks.items() for p in list(pairs)[:per_task]]


@torch.no_grad()
def greedy_answer(model, tokenizer, prompt: str, *, template: str | None = None,
                  max_new_tokens: int = MAX_NEW_TOKENS, stop: str | None = None) -> str:
    """The model's greedy continuation of `prompt` (BOS first, as in evaluation), up to EOS, `max_new_tokens`
    tokens or (with `stop`) the first token whose text holds `stop`, decoded without special tokens."""
    text = format_prompt(tokenizer, prompt, template)
    ids = tokenizer(text, return_tensors="pt")["input_ids"].to(next(model.parameters()).device)
    eos = tokenizer.eos_token_id
    out: list[int] = []
    for _ in range(int(max_new_tokens)):
        logits = model(input_ids=ids, use_cache=False).logits[0, -1]
        nxt = int(torch.argmax(logits))
        if nxt == eos:
            break
        out.append(nxt)
        if stop is not None and stop in tokenizer.decode([nxt]):
            break
        ids = torch.cat([ids, ids.new_tensor([[nxt]])], dim=1)
    return tokenizer.decode(out, skip_special_tokens=True)


def snapshot_recorder(tokenizer, pairs: Sequence[tuple[str, TaskPair, str]], general: Sequence[str], steps: int, *,
                      template: str | None = None, block_size: int = 128, blocks: int = GENERAL_BLOCKS,
                      on_snapshot: Callable[[PretrainingSnapshot], None] | None = None):
    """(`eval_fn(model, step)` for `forgetlab.train.trainer.train`, the list it fills). Each call measures the
    held-out general loss on the first `blocks` blocks of `general` and answers each watched prompt, keeps the
    snapshot and hands it to `on_snapshot`."""
    kept: list[PretrainingSnapshot] = []

    def room(answer: str) -> int:
        """Enough new tokens to write the answer, its EOS and a little more (exact match needs no more)."""
        return len(tokenizer(answer, add_special_tokens=False)["input_ids"]) + 4

    def record(model, step: int) -> dict:
        was = model.training
        model.eval()
        loss, _ = general_loss(model, tokenizer, general, block_size=block_size, max_blocks=blocks)
        answers = tuple(
            ProbeAnswer(task, p.prompt, p.answer,
                        greedy_answer(model, tokenizer, p.prompt, template=template, max_new_tokens=room(p.answer)),
                        form, greedy_answer(model, tokenizer, form, stop="\n") if form else "")
            for task, p, form in pairs)
        model.train(was)
        snap = PretrainingSnapshot(int(step), int(steps), loss, answers)
        kept.append(snap)
        if on_snapshot is not None:
            on_snapshot(snap)
        return {}

    return record, kept


def stored_snapshots(pool_or_path) -> list[PretrainingSnapshot]:
    """The snapshots of the base's pre-training that a zoo build stored in its manifest (`steps.base.snapshots`);
    [] for a pool that is not a pico zoo, or one built before they were recorded."""
    base = ((manifest_beside(pool_or_path) or {}).get("steps") or {}).get("base") or {}
    try:
        return [PretrainingSnapshot.from_dict(s) for s in base.get("snapshots") or []]
    except (KeyError, TypeError, ValueError):
        return []
