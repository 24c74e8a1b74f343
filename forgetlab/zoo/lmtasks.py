"""Local lm-evaluation-harness tasks made from a zoo's own data, so the demo exercises the benchmark bridge
offline (forgetlab.core.benchmarks).

Each task is a multiple-choice task (lm-eval's `output_type: multiple_choice`, metrics `acc` and `acc_norm`)
written as a task YAML plus a JSONL file under `data/lm_tasks/`:

- `zoo_wiki_cloze` (generality): a held-out Wikipedia sentence without its last word; the choices are that
  word and three last words of other held-out sentences. Fine-tuning that damages general language shows as
  a drop in accuracy, as on LAMBADA-style cloze benchmarks.
- `zoo_<task>` (speciality, one per synthetic task): an eval-split prompt; the choices are its answer and three
  wrong answers of the task: first the ones its prompt spells out (the code task's `max('hat', 'owl')` offers
  `hat` beside `owl`, so copying a word of the prompt is no longer enough), then answers of other eval prompts.
  The prompt and answer are joined exactly as forgetlab's exact match joins them (no separator;
  `target_delimiter: ""`).

Accuracy here (lm-eval's `acc`) is multiple-choice log-likelihood accuracy: the share of items where the model
gives the right choice a higher log-likelihood than every wrong one (chance 1/4; `acc_norm` per character). It
asks the model to recognise the answer, not to write it and stop, so it is not exact match: a base that learned
the sums from its pretraining text, but not the task's prompt format, scores accuracy with no exact match.

Distractors and the position of the right choice come from a fixed seed, so the files are deterministic.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from forgetlab.core.data import TaskPair

FOLDER = "lm_tasks"
GENERAL_TASK = "zoo_wiki_cloze"
N_CHOICES = 4
MAX_ITEMS = 200
_WORD = re.compile(r"^[A-Za-z][a-z]{2,}$")
_TOKEN = re.compile(r"[A-Za-z0-9]+")      # the words (and numbers) a prompt writes


def task_name(task: str) -> str:
    """The lm-eval task name of a zoo task."""
    return f"zoo_{task}"


def cloze_items(paragraphs: Sequence[str], n: int = MAX_ITEMS, seed: int = 0) -> list[dict]:
    """Cloze items from held-out paragraphs: {context, choices, label} with the sentence's last word right."""
    sentences = []
    for para in paragraphs:
        for sent in re.split(r"(?<=[.!?])\s+", para.strip()):
            words = sent.rstrip(".!?").split()
            if len(words) >= 8 and _WORD.match(words[-1]):
                sentences.append((" ".join(words[:-1]), words[-1]))
    rng = random.Random(seed)
    rng.shuffle(sentences)
    endings = sorted({w for _, w in sentences})
    items = []
    for context, word in sentences[:n]:
        pool = [w for w in endings if w != word]
        if len(pool) < N_CHOICES - 1:
            break
        choices = [word, *rng.sample(pool, N_CHOICES - 1)]
        rng.shuffle(choices)
        items.append({"context": context, "choices": [f" {c}" for c in choices], "label": choices.index(word)})
    return items


def prompt_distractors(pair: TaskPair, answers: Sequence[str]) -> list[str]:
    """The wrong answers that `pair`'s own prompt spells out: other answers of the task written in the prompt as
    a word (`>>> max('hat', 'owl')` → `hat` when the answer is `owl`), in the order the prompt writes them."""
    others = set(answers) - {pair.answer}
    out: list[str] = []
    for word in _TOKEN.findall(pair.prompt):
        if word in others and word not in out:
            out.append(word)
    return out


def choice_items(pairs: Sequence[TaskPair], n: int = MAX_ITEMS, seed: int = 0) -> list[dict]:
    """Multiple-choice items from prompt/answer pairs: the right answer among wrong answers of the same task —
    first those the prompt itself spells out (`prompt_distractors`), then answers of other prompts drawn at
    random. Without the first, a task whose answer is copied from its prompt (the code task's `max('hat',
    'owl')` → `owl`) is solved by copying: every model picks the one choice written in the prompt, and the
    benchmark gives every model the same accuracy."""
    answers = sorted({p.answer for p in pairs})
    rng = random.Random(seed)
    items = []
    for pair in list(pairs)[:n]:
        near = prompt_distractors(pair, answers)[:N_CHOICES - 1]
        pool = [a for a in answers if a != pair.answer and a not in near]
        if len(near) + len(pool) < N_CHOICES - 1:
            break
        choices = [pair.answer, *near, *rng.sample(pool, N_CHOICES - 1 - len(near))]
        rng.shuffle(choices)
        items.append({"context": pair.prompt, "choices": choices, "label": choices.index(pair.answer)})
    return items


def _task_yaml(name: str, data_file: Path, delimiter: str) -> str:
    config = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{context}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{label}}",
        "target_delimiter": delimiter,
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0, "made_by": "forgetlab zoo"},
    }
    return yaml.safe_dump(config, sort_keys=False)


def write_lm_tasks(folder: Path, final_folder: Path, heldout: Sequence[str],
                   tasks: Mapping[str, Sequence[TaskPair]], seed: int = 0) -> dict[str, list[str]]:
    """Write the zoo's lm-eval tasks into `folder` (YAML + JSONL each), the YAMLs pointing at their data under
    `final_folder` (where `folder` will be once the atomic write is renamed into place). Returns the pool's
    `benchmarks` names: {"general": [...], "tasks": {task: [...]}}."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {"general": [], "tasks": {}}

    def write(name: str, items: list[dict], delimiter: str) -> bool:
        if not items:
            return False
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for item in items:
                fh.write(json.dumps(item) + "\n")
        (folder / f"{name}.yaml").write_text(_task_yaml(name, final_folder / f"{name}.jsonl", delimiter),
                                             encoding="utf-8")
        return True

    if write(GENERAL_TASK, cloze_items(heldout, seed=seed), ""):
        made["general"].append(GENERAL_TASK)
    for task, pairs in tasks.items():
        if write(task_name(task), choice_items(pairs, seed=seed), ""):
            made["tasks"][task] = [task_name(task)]
    return made
