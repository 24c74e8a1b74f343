"""The zoo's `data/` folder: the Wikipedia parts and the task splits as files that a pool reads.

Layout: `general_train.txt` and `general_heldout.txt` (paragraphs separated by blank lines, the format of
`forgetlab.core.data.read_general_text`) and `<task>_{train,probe,eval}.jsonl` (`{"prompt", "answer"}` per line,
`forgetlab.core.data.read_task_pairs`), and `lm_tasks/`: local lm-eval tasks made from the held-out text and the eval
pairs (forgetlab.zoo.lmtasks). The folder is written atomically.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forgetlab.core.data import Probes, TaskData, read_general_text, read_task_pairs, write_task_pairs
from forgetlab.core.errors import ParameterError
from forgetlab.core.outputs import atomic_output_dir
from forgetlab.core.progress import Progress, report
from forgetlab.zoo.corpus import WikiSplit, load_wiki_split
from forgetlab.zoo.lmtasks import FOLDER, GENERAL_TASK, task_name, write_lm_tasks
from forgetlab.zoo.presets import ZooSpec
from forgetlab.zoo.tasks import TaskSplits, make_task

SPLITS = ("train", "probe", "eval")
GENERAL_TRAIN = "general_train.txt"
GENERAL_HELDOUT = "general_heldout.txt"


def task_file(task: str, split: str) -> str:
    """File name of a task split inside `data/`."""
    return f"{task}_{split}.jsonl"


@dataclass
class ZooData:
    """What a build trains and scores on: Wikipedia parts and the task splits."""

    wiki: WikiSplit
    tasks: dict[str, TaskSplits]

    def summary(self) -> dict:
        """Counts for the manifest: articles/paragraphs/characters per Wikipedia part, pairs per task split."""
        return {
            "wiki": self.wiki.to_frame().to_dict(orient="records"),
            "heldout_articles": self.wiki.heldout_titles,
            "tasks": {n: {s: len(getattr(t, s)) for s in SPLITS} for n, t in self.tasks.items()},
        }


def make_data(spec: ZooSpec, progress: Progress = None) -> ZooData:
    """Generate the data of a zoo spec: the Wikipedia split and every task (deterministic)."""
    d = spec.data
    report(progress, 0.0, "reading Wikipedia")
    wiki = load_wiki_split(heldout_fraction=d.heldout_fraction, seed=d.wiki_seed,
                           max_train_chars=d.wiki_train_chars, max_heldout_chars=d.wiki_heldout_chars)
    report(progress, 0.8, "generating tasks")
    tasks = {t: make_task(t, n_train=d.n_train, n_probe=d.n_probe, n_eval=d.n_eval, code_level=d.code_level)
             for t in spec.tasks}
    report(progress, 1.0, "data ready")
    return ZooData(wiki=wiki, tasks=tasks)


def write_data(data: ZooData, out_dir: Path, overwrite: bool = False) -> Path:
    """Write `data` as the zoo's `data/` folder (atomically); returns the folder."""
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        (tmp / GENERAL_TRAIN).write_text("\n\n".join(data.wiki.train) + "\n", encoding="utf-8")
        (tmp / GENERAL_HELDOUT).write_text("\n\n".join(data.wiki.heldout) + "\n", encoding="utf-8")
        for name, splits in data.tasks.items():
            for split in SPLITS:
                write_task_pairs(tmp / task_file(name, split), getattr(splits, split))
        write_lm_tasks(tmp / FOLDER, Path(out_dir).resolve() / FOLDER, data.wiki.heldout,
                       {name: splits.eval for name, splits in data.tasks.items()})
    return Path(out_dir)


def lm_benchmarks(data_dir: Path, tasks: tuple[str, ...], data_dir_name: str = "data") -> dict | None:
    """The pool's `probes.benchmarks` for the local lm-eval tasks found in `data_dir/lm_tasks` (None if none)."""
    folder = Path(data_dir) / FOLDER
    names = {p.stem for p in folder.glob("*.yaml")} if folder.is_dir() else set()
    if not names:
        return None
    return {"general": [GENERAL_TASK] if GENERAL_TASK in names else [],
            "tasks": {t: [task_name(t)] for t in tasks if task_name(t) in names},
            "include": f"{data_dir_name}/{FOLDER}", "limit": 100}


def read_data(data_dir: Path, tasks: tuple[str, ...]) -> tuple[list[str], Probes]:
    """The pretraining text and the `Probes` (held-out text, every task split) from a written `data/`."""
    probes = Probes(general=read_general_text(data_dir / GENERAL_HELDOUT))
    probes.general_train = read_general_text(data_dir / GENERAL_TRAIN)
    for t in tasks:
        probes.tasks[t] = TaskData(t, *(read_task_pairs(data_dir / task_file(t, s)) for s in SPLITS))
    return probes.general_train, probes


def learned_order(scorecards: dict, tasks: tuple[str, ...]) -> list[str]:
    """The tasks ordered by how well their full fine-tune learned them (own-task exact match, then the drop of
    answer loss below the base's), best first; tasks without a scorecard keep their place at the end.

    The pool file lists tasks and models in this order, so every page's default (the first model, the first
    task) is a model that learned its task."""
    cards = scorecards or {}
    base_tasks = (cards.get("base") or {}).get("tasks") or {}

    def key(task: str):
        own = ((cards.get(task) or {}).get("tasks") or {}).get(task)
        if not own:
            return (1, 0.0, 0.0)
        drop = (base_tasks.get(task) or {}).get("answer_loss", 0.0) - own["answer_loss"]
        return (0, -own["exact_match"], -drop)

    return sorted(tasks, key=lambda t: (key(t), tasks.index(t)))


def pool_spec(spec: ZooSpec, data_dir_name: str = "data", benchmarks: dict | None = None,
              order: list[str] | None = None) -> dict:
    """The pool.yaml mapping of a zoo: base, a model per task (and LoRA adapters), probe files, template, and
    (when given) the local lm-eval benchmarks (`lm_benchmarks`). `order` (e.g. `learned_order`) lists the
    tasks first-to-last; full fine-tunes come before the adapters."""
    tasks = list(order or spec.tasks)
    if sorted(tasks) != sorted(spec.tasks):
        raise ParameterError(f"The task order {order} must list the zoo's tasks {', '.join(spec.tasks)} once each.")
    models: dict[str, object] = {t: f"ft-{t}" for t in tasks}
    if spec.lora is not None:
        models.update({f"lora-{t}": {"adapter": f"lora-{t}"} for t in tasks})
    return {
        "name": spec.name,
        "base": "base",
        "models": models,
        "probes": {
            "general": f"{data_dir_name}/{GENERAL_HELDOUT}",
            "general_train": f"{data_dir_name}/{GENERAL_TRAIN}",
            "tasks": {t: {s: f"{data_dir_name}/{task_file(t, s)}" for s in SPLITS} for t in tasks},
            "template": spec.template,
            **({"benchmarks": benchmarks} if benchmarks else {}),
        },
    }
