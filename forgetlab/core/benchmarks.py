"""Benchmarks through lm-evaluation-harness, on a model already in memory (no copy written to disk).

`evaluate_benchmarks(model, tokenizer, ["arc_easy", "my_local_task"], include="lm_tasks/", limit=200)` wraps
the loaded transformers model in lm-eval's `HFLM(pretrained=<model>, tokenizer=<tokenizer>)` and runs
`lm_eval.simple_evaluate` task by task (so progress moves per task), returning `{task: {metric: value}}` with
the numbers `lm_eval` itself prints for the same model, tasks, limit and batch size.

Standard task names work where their datasets can be downloaded or are cached; local tasks (task YAMLs with
`dataset_path: json` and local `data_files`, in a folder named by `include`) work offline. lm-eval is imported
only here and only when a benchmark is asked for.

Metric names: lm-eval reports `"<metric>,<filter>"`; the filter "none" is dropped (`acc`, `acc_norm`), any
other stays (`exact_match,strict-match`). Standard errors are not reported.
"""
from __future__ import annotations

import difflib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
import torch
import yaml

from forgetlab.core.errors import ForgetlabError, MissingDependencyError, ParameterError, ProbeDataError
from forgetlab.core.memory import job_dtype
from forgetlab.core.progress import Progress, report, scaled

PIP = "pip install 'lm-eval[hf]'"


class BenchmarkError(ForgetlabError):
    """An lm-eval task cannot be run: unknown, malformed, its data missing or out of reach, a metric it lacks."""


@dataclass
class BenchmarkSpec:
    """Which lm-eval tasks judge a pool: for generality, per task, where local task YAMLs live, the limit."""

    general: list[str] = field(default_factory=list)
    tasks: dict[str, list[str]] = field(default_factory=dict)
    include: str | None = None
    limit: int | None = None

    @property
    def all_tasks(self) -> list[str]:
        """Every task named, once, in order."""
        seen: list[str] = []
        for name in [*self.general, *(t for ts in self.tasks.values() for t in ts)]:
            if name not in seen:
                seen.append(name)
        return seen

    def to_dict(self) -> dict[str, Any]:
        return {"general": list(self.general), "tasks": {k: list(v) for k, v in self.tasks.items()},
                "include": self.include, "limit": self.limit}

    @classmethod
    def from_pool_yaml(cls, d: Any, root: Path, source: str) -> "BenchmarkSpec":
        """Read `probes.benchmarks` of a pool file (paths relative to the pool file's folder)."""
        if not isinstance(d, Mapping):
            raise ProbeDataError(f"`probes.benchmarks` in {source} must be a mapping (general, tasks, include, "
                                 "limit).")
        unknown = set(d) - {"general", "tasks", "include", "limit"}
        if unknown:
            raise ProbeDataError(f"`probes.benchmarks` in {source} has unknown keys {sorted(unknown)}; use general, "
                                 "tasks, include and limit.")
        general = _names(d.get("general"), f"`probes.benchmarks.general` in {source}")
        tasks_d = d.get("tasks") or {}
        if not isinstance(tasks_d, Mapping):
            raise ProbeDataError(f"`probes.benchmarks.tasks` in {source} must map pool task names to lm-eval tasks.")
        tasks = {str(k): _names(v, f"`probes.benchmarks.tasks.{k}` in {source}") for k, v in tasks_d.items()}
        include = d.get("include")
        if include is not None:
            include = str((root / str(include)).resolve())
        return cls(general, tasks, include, check_limit(d.get("limit")))


def _names(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ProbeDataError(f"{where} must be a list of lm-eval task names.")
    return list(value)


def check_limit(limit: Any) -> int | None:
    """`limit` as a whole number ≥ 1 (examples per task), or None for every example."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ParameterError(f"The benchmark limit must be a whole number of examples ≥ 1 (or none for all); got "
                             f"{limit!r}.")
    return limit


def parse_tasks(text: str | Iterable[str]) -> list[str]:
    """'arc_easy, hellaswag' → ['arc_easy', 'hellaswag']."""
    items = text.replace(",", " ").split() if isinstance(text, str) else [str(t) for t in text]
    if not items:
        raise ParameterError("Name at least one lm-eval task (e.g. --lm-eval arc_easy).")
    return items


def _lm_eval():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise MissingDependencyError(f"Benchmarks need lm-evaluation-harness: {PIP}") from None
    return TaskManager


def check_include(include: str | Path | None) -> str | None:
    """The include folder as a string; BenchmarkError when it is missing or holds a task YAML that is not
    valid YAML (lm-eval would skip it silently, and the task would then look unknown)."""
    if include is None:
        return None
    folder = Path(include).expanduser()
    if not folder.is_dir():
        raise BenchmarkError(f"The lm-eval task folder {folder} does not exist; pass the folder holding your task "
                             "YAML files.")

    class _AnyTags(yaml.SafeLoader):
        pass

    _AnyTags.add_multi_constructor("", lambda loader, suffix, node: None)  # lm-eval's !function and the like
    for f in sorted(folder.rglob("*.yaml")):
        try:
            doc = yaml.load(f.read_text(encoding="utf-8"), Loader=_AnyTags)  # noqa: S506 (safe loader subclass)
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise BenchmarkError(f"The lm-eval task file {f} is not valid YAML ({str(exc).splitlines()[0]}); fix "
                                 "or remove it.") from None
        if not isinstance(doc, dict):
            raise BenchmarkError(f"The lm-eval task file {f} is not a task definition (a mapping with `task:`).")
    return str(folder)


def task_manager(include: str | Path | None = None, tasks: Sequence[str] | None = None):
    """lm-eval's TaskManager with the built-in tasks and those under `include`; when every one of `tasks` is a
    local task, only the include folder is indexed (lm-eval's ~15,000 built-in tasks take ~10 s to index)."""
    TaskManager = _lm_eval()
    include = check_include(include)
    if include and tasks:
        local = TaskManager(include_path=include, include_defaults=False)
        if set(tasks) <= set(local.all_tasks):
            return local
    return TaskManager(include_path=include)


def check_tasks(names: Sequence[str], manager) -> list[str]:
    """`names` if lm-eval knows each one; BenchmarkError listing close matches otherwise."""
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=5, cutoff=0.6)
            hint = f" Close matches: {', '.join(close)}." if close else ""
            raise BenchmarkError(f"lm-eval has no task {name!r}.{hint} Local tasks are found through an include "
                                 "folder (--lm-eval-include DIR, or `include:` under probes.benchmarks).")
    return list(names)


def checked_manager(spec: "BenchmarkSpec | None"):
    """The lm-eval TaskManager for a BenchmarkSpec's tasks, each checked (BenchmarkError naming close matches
    otherwise), or None when `spec` names no task. Call it before any work so that a bad task fails first."""
    if spec is None or not spec.all_tasks:
        return None
    manager = task_manager(spec.include, spec.all_tasks)
    check_tasks(spec.all_tasks, manager)
    return manager


def require_task(measure: str, spec: "BenchmarkSpec | None") -> None:
    """ParameterError when `measure` is a benchmark `TASK/METRIC` whose task `spec` does not run (a core
    function was given the measure without the benchmarks that produce it); built-in measures pass."""
    task = str(measure).partition("/")[0]
    if "/" in str(measure) and (spec is None or task not in spec.all_tasks):
        raise ParameterError(f"The measure {measure} is an lm-eval metric: pass benchmarks= naming its task "
                             f"{task!r} (CLI: the measure itself adds it).")


def reported_metrics(task: str, manager, include: str | None = None) -> list[str] | None:
    """The metric names lm-eval will report for `task` (as `evaluate_benchmarks` names them: `acc`,
    `exact_match,strict-match`), read from the task as lm-eval builds it (its metric list and filters), before
    any model runs; None for a group of tasks (its metrics are aggregates that only a run reveals)."""
    try:
        if hasattr(manager, "load"):                 # lm-eval ≥ 0.4.10: {"tasks": {leaf name: Task}, "groups": …}
            built = manager.load([task]).get("tasks", {})
        else:
            built = manager.load_task_or_group([task])
    except ForgetlabError:
        raise
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # the task's dataset is loaded here: missing files, no network, bad YAML
        raise _explain(task, exc, _is_local(task, manager, include)) from None
    obj = built.get(task) if isinstance(built, Mapping) else None
    if obj is None or not hasattr(obj, "aggregation"):
        return None
    filters = [getattr(f, "name", "none") for f in getattr(obj, "_filters", [])] or ["none"]
    return [m if f in ("", "none") else f"{m},{f}" for m in obj.aggregation() for f in filters]


def check_metrics(measures: Sequence[str], spec: BenchmarkSpec, manager=None) -> None:
    """Check every benchmark measure `TASK/METRIC` among `measures` before any work: TASK is one of `spec`'s
    tasks and known to lm-eval, and METRIC is one that the task reports (BenchmarkError listing them
    otherwise). Built-in measures (no '/') are skipped."""
    wanted = [m for m in measures if "/" in str(m)]
    if not wanted:
        return
    manager = manager or checked_manager(spec)
    for measure in wanted:
        task, metric = check_measure(measure, spec.all_tasks if spec is not None else [])
        metrics = reported_metrics(task, manager, spec.include)
        if metrics is not None and metric not in metrics:
            close = difflib.get_close_matches(metric, metrics, n=1, cutoff=0.5)
            hint = f" (did you mean {task}/{close[0]}?)" if close else ""
            raise BenchmarkError(f"lm-eval task {task!r} does not report a metric {metric!r}{hint}; it reports "
                                 f"{', '.join(metrics)}. Write the measure as {task}/<one of those>.")


def _offline() -> bool:
    return any(os.environ.get(v, "0") not in ("0", "", "false", "False")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _is_local(task: str, manager, include: str | None) -> bool:
    """True when the task's YAML lies in the include folder (its data is the user's files, not the hub's)."""
    if include is None:
        return False
    entry = getattr(manager, "task_index", {}).get(task)
    path = getattr(entry, "yaml_path", None)
    return bool(path) and Path(str(path)).resolve().is_relative_to(Path(include).resolve())


def _explain(task: str, exc: BaseException, local: bool) -> BenchmarkError:
    text = f"{type(exc).__name__}: {exc}"
    first = text.splitlines()[0][:300]
    lowered = text.lower()
    if local and (isinstance(exc, FileNotFoundError) or "unable to find" in lowered or "no such file" in lowered
                  or "doesn't exist" in lowered):
        return BenchmarkError(f"The data of the local lm-eval task {task!r} is missing ({first}); check the "
                              "`data_files` paths in its YAML.")
    networkish = any(k in lowered for k in ("offline", "connection", "couldn't reach", "network", "resolve",
                                            "timed out", "max retries", "huggingface.co"))
    if not local and (networkish or _offline()):
        return BenchmarkError(f"lm-eval task {task!r} needs its dataset from the Hugging Face hub, which cannot be "
                              f"reached here ({first[:200]}). Run it where the network is available (or with the "
                              "dataset cached), or use a local task: a task YAML with `dataset_path: json` and "
                              "`data_files` on disk, in a folder passed as --lm-eval-include.")
    return BenchmarkError(f"lm-eval could not run task {task!r}: {first}")


def metrics_of(task_results: Mapping[str, Any]) -> dict[str, float]:
    """lm-eval's result dict of one task → {metric: value} (stderr and alias dropped, filter 'none' dropped)."""
    out: dict[str, float] = {}
    for key, value in task_results.items():
        if key in ("alias", "sample_len", "sample_count") or "_stderr" in key or isinstance(value, bool) \
                or not isinstance(value, (int, float)):
            continue
        metric, _, flt = key.partition(",")
        out[metric if flt in ("", "none") else f"{metric},{flt}"] = float(value)
    return out


def evaluate_benchmarks(model, tokenizer, tasks: Sequence[str], *, include: str | Path | None = None,
                        limit: int | None = None, batch_size: int = 1, num_fewshot: int | None = None,
                        manager=None, progress: Progress = None) -> dict[str, dict[str, float]]:
    """Run lm-eval tasks on an in-memory model: `{task: {metric: value}}` (lm-eval's own numbers).

    The model is evaluated where it is (its device and dtype); `limit` caps the examples per task (lm-eval's
    --limit); `batch_size` as lm-eval's (1 by default, like the `lm_eval` command). `manager` reuses a
    TaskManager between calls (indexing the tasks takes seconds).
    """
    limit = check_limit(limit)
    include_dir = check_include(include)
    if batch_size < 1:
        raise ParameterError(f"batch_size must be at least 1; got {batch_size}.")
    names = parse_tasks(tasks)
    manager = manager or task_manager(include_dir, names)
    check_tasks(names, manager)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise BenchmarkError("The tokenizer has neither a pad nor an end-of-sequence token, which lm-eval needs "
                                 "for batching; add a pad token to the tokenizer (tokenizer.pad_token = …).")
        tokenizer.pad_token = tokenizer.eos_token
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(device))
    results: dict[str, dict[str, float]] = {}
    try:
        for i, name in enumerate(names):
            report(progress, i / len(names), f"lm-eval {name}")
            try:
                out = lm_eval.simple_evaluate(model=lm, tasks=[name], limit=limit, num_fewshot=num_fewshot,
                                              task_manager=manager, log_samples=False, bootstrap_iters=0,
                                              verbosity="ERROR")
            except ForgetlabError:
                raise
            except (KeyboardInterrupt, MemoryError):
                raise
            except Exception as exc:  # lm-eval and datasets raise many kinds; each becomes a message
                raise _explain(name, exc, _is_local(name, manager, include_dir)) from None
            if not out or name not in out.get("results", {}):
                raise BenchmarkError(f"lm-eval returned no result for task {name!r}.")
            results[name] = metrics_of(out["results"][name])
            report(progress, (i + 1) / len(names), f"lm-eval {name} done")
    finally:
        if was_training:
            model.train()
    return results


def pick(benchmarks: Mapping[str, Mapping[str, float]], measure: str) -> float:
    """The value of `TASK/METRIC` (e.g. `arc_easy/acc`) in a scorecard's benchmarks; BenchmarkError naming what
    exists when the task or metric is not there."""
    task, sep, metric = measure.partition("/")
    if not sep or not task or not metric:
        raise ParameterError(f"A benchmark measure is written TASK/METRIC (e.g. arc_easy/acc); got {measure!r}.")
    if task not in benchmarks:
        raise BenchmarkError(f"No benchmark result for task {task!r}; evaluated: {', '.join(benchmarks) or 'none'}.")
    if metric not in benchmarks[task]:
        raise BenchmarkError(f"Task {task!r} has no metric {metric!r}; it reports: "
                             f"{', '.join(benchmarks[task])}.")
    return float(benchmarks[task][metric])


def check_measure(measure: str, tasks: Sequence[str]) -> tuple[str, str]:
    """Split `TASK/METRIC` and check that TASK is among `tasks` (before any work is done)."""
    task, sep, metric = str(measure).partition("/")
    if not sep or not task or not metric:
        raise ParameterError(f"A benchmark measure is written TASK/METRIC (e.g. arc_easy/acc); got {measure!r}.")
    if task not in tasks:
        raise ParameterError(f"The measure {measure!r} names task {task!r}, which is not evaluated; evaluate it "
                             f"(--lm-eval {task}) or choose one of: {', '.join(tasks) or 'none'}.")
    return task, metric


@dataclass
class BenchmarkTable:
    """lm-eval results of several models of a pool: `results[model][task][metric]`, with what was run
    (tasks, include folder, limit) and how long it took. `to_frame()` is the table model × `task/metric`."""

    results: dict[str, dict[str, dict[str, float]]]
    tasks: list[str]
    include: str | None = None
    limit: int | None = None
    seconds: float = 0.0

    @property
    def models(self) -> list[str]:
        return list(self.results)

    def measures(self) -> list[str]:
        """Every `TASK/METRIC` that some model has, in task order then metric order."""
        out: list[str] = []
        for task in self.tasks:
            for card in self.results.values():
                for metric in card.get(task, {}):
                    if f"{task}/{metric}" not in out:
                        out.append(f"{task}/{metric}")
        return out

    def uniform_tasks(self) -> list[str]:
        """The tasks that cannot tell the models apart: with two models or more, every metric of the task has one
        value for every model (e.g. an accuracy of 0.85 for all)."""
        if len(self.results) < 2:
            return []
        out = []
        for task in self.tasks:
            cards = [card.get(task) for card in self.results.values()]
            if all(cards) and all(c == cards[0] for c in cards[1:]):
                out.append(task)
        return out

    def to_frame(self):
        """One row per model; a column `model`, then one column per `TASK/METRIC` (empty where missing)."""
        cols = self.measures()
        rows = [{"model": m, **{c: card.get(c.partition("/")[0], {}).get(c.partition("/")[2]) for c in cols}}
                for m, card in self.results.items()]
        return pd.DataFrame(rows, columns=["model", *cols])

    def to_dict(self) -> dict[str, Any]:
        return {"results": self.results, "tasks": list(self.tasks), "include": self.include, "limit": self.limit,
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BenchmarkTable":
        results = {str(m): {str(t): {str(k): float(v) for k, v in ms.items()} for t, ms in card.items()}
                   for m, card in (d.get("results") or {}).items()}
        return cls(results, [str(t) for t in d.get("tasks") or []], d.get("include"), d.get("limit"),
                   float(d.get("seconds") or 0.0))


def benchmark_pool(pool, models: Sequence[str], spec: BenchmarkSpec, *, limit: int | None = None,
                   device: str | None = None, dtype: Any = None, batch_size: int = 1, threads: int | None = None,
                   progress: Progress = None) -> BenchmarkTable:
    """Run `spec`'s lm-eval tasks on each of `models` of `pool` ("base" or a pool model name), in memory:
    a BenchmarkTable. `limit` overrides `spec.limit`. Every task is checked (and the limit) before the first
    model is loaded; a ForgetlabError says what is wrong.

    Models are loaded one at a time in `dtype` (a torch dtype or its name; None: bfloat16 on CUDA, float32 else,
    `forgetlab.core.memory.job_dtype`) and unloaded after their tasks, except those the pool held loaded before
    the call (`ModelPool.borrow`): the peak is one model, not all of them.

    `threads` sets torch's intra-op threads for the run (restored afterwards; process-wide). lm-eval scores one
    short request at a time: on the busy two-core machine the pico zoo's four tasks at limit 20 took 8.2 s per
    model with 1 thread, 38 s with torch's default 2 (11.6 s with 2 threads and batch size 16)."""
    dt = job_dtype(dtype, device)
    names = list(models)
    if not names:
        raise ParameterError("Choose at least one model to run the benchmarks on.")
    tasks = spec.all_tasks
    if not tasks:
        raise BenchmarkError("The pool names no lm-eval benchmarks; add `benchmarks:` under `probes:` in its "
                             "pool.yaml (general: [TASK, …], tasks: {POOL_TASK: [TASK, …]}, include: DIR).")
    limit = check_limit(limit if limit is not None else spec.limit)
    include = check_include(spec.include)
    report(progress, 0.0, "indexing the lm-eval tasks")
    manager = task_manager(include, tasks)
    check_tasks(tasks, manager)
    start = time.perf_counter()
    results: dict[str, dict[str, dict[str, float]]] = {}
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(max(1, int(threads)))
    try:
        for i, name in enumerate(names):
            part = scaled(progress, i / len(names), (i + 1) / len(names))
            report(part, 0.0, f"{name}: loading")
            sub = (lambda f, m="", name=name, part=part: report(part, f, f"{name}: {m}")) if part else None
            with pool.borrow(name, device=device, dtype=dt) as model:
                results[name] = evaluate_benchmarks(model, pool.tokenizer, tasks, include=include, limit=limit,
                                                    batch_size=batch_size, manager=manager, progress=sub)
    finally:
        torch.set_num_threads(previous)
    return BenchmarkTable(results, list(tasks), include, limit, time.perf_counter() - start)
