"""Long jobs in background threads: one copy per key, progress kept, results survive page switches/reloads.

Design (chosen over st.fragment-only execution): a job runs in a daemon thread and is held in a
process-wide registry (`REGISTRY`, a module-level `JobRegistry`), keyed by a string that names everything
the result depends on (e.g. `job_key("merge", output_dir)`). Hence:

- a second click — in the same or another browser session — finds the running job and attaches to it
  instead of starting a second copy (the start is atomic under a lock);
- the user may switch pages while it runs; coming back (or reloading the page, which opens a new
  session) shows its progress and then its result, because the registry outlives sessions;
- a job is cancelled by a flag that its progress callback checks: the next `progress(...)` call raises
  `JobCancelled` inside the job, so the core's atomic outputs clean up after themselves.

The job function never touches streamlit: it is `fn(progress) -> result`. The `progress` it receives is
the Job itself (callable as `progress(fraction, message)`); a job that has something to show before it ends
(e.g. the points of a sweep so far) hands it to `progress.publish(value)`. `run_once()` draws the state with
an auto-refreshing `st.fragment(run_every=...)` (and the latest published value, through `show_partial`) and
returns the result once it is there.

Cost while a job runs: the job shares the machine with the server and the browser, so the page polls
gently — the progress bar every second, the partial result (a chart) in its own fragment every 3 s once
something was published (between two publications it re-sends the figure it built last time instead of
rebuilding it), and the Cancel button outside the polling fragment. Each poll is a Streamlit fragment rerun;
with the garbage collector kept off the long-lived heap (forgetlab.ui.heap) a poll every second costs ~1% of
a core (9% every 2 s without it). Redrawing a chart every half second held the GIL and kept the browser busy
re-laying out plotly, which slowed the job itself (bench/app_latency.py --jobs measures app vs CLI).
"""
from __future__ import annotations

import contextvars
import hashlib
import json
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import streamlit as st

from forgetlab.core.memory import recording
from forgetlab.core.threads import governed_threads
from forgetlab.core.threads import tick as tick_threads
from forgetlab.ui.errors import render_error

RUNNING, DONE, FAILED, CANCELLED = "running", "done", "failed", "cancelled"
REFRESH = 1.0            # seconds between progress redraws of a running job (each is a Streamlit fragment rerun)
PARTIAL_REFRESH = 3.0    # seconds between redraws of its partial result


class JobCancelled(Exception):
    """Raised inside a job's thread by its progress callback once the user asked to cancel it."""


@dataclass
class Job:
    """One background job: its state, latest progress, and result or error."""

    key: str
    label: str
    status: str = RUNNING
    fraction: float = 0.0
    message: str = ""
    result: Any = None
    partial: Any = None
    error: BaseException | None = None
    traceback: str = ""
    started: float = field(default_factory=time.time)
    finished: float | None = None
    version: int = 0                     # how many times `publish` was called
    peak: dict | None = None             # the measured peak of a finished job (core.memory.PeakMeter.to_dict)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    def progress(self, fraction: float, message: str = "") -> None:
        """The callback handed to the job function: records progress; raises JobCancelled when cancelled."""
        if self._cancel.is_set():
            raise JobCancelled(f"{self.label} was cancelled.")
        self.fraction = min(1.0, max(0.0, float(fraction)))
        self.message = message
        tick_threads()

    __call__ = progress

    def publish(self, partial: Any) -> None:
        """Keep `partial` (a snapshot of the result so far) for the page to draw while the job runs."""
        if self._cancel.is_set():
            raise JobCancelled(f"{self.label} was cancelled.")
        self.partial = partial
        self.version += 1

    def cancel(self) -> None:
        """Ask the job to stop at its next progress report."""
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job ends (or `timeout` seconds pass); True if it ended."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running


class JobRegistry:
    """Process-wide table of jobs by key; `start` is atomic, so one key never has two running copies."""

    def __init__(self, keep_finished: int = 64):
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self.keep_finished = keep_finished

    def get(self, key: str) -> Job | None:
        """The job stored under `key` (running or finished), or None."""
        with self._lock:
            return self._jobs.get(key)

    def start(self, key: str, fn: Callable[["Job"], Any], *, label: str = "",
              restart: bool = True) -> tuple[Job, bool]:
        """Start `fn(progress)` under `key` unless a job with that key is running; returns (job, started).

        A finished job under the same key is replaced when `restart` is true, else returned as it is.
        """
        with self._lock:
            old = self._jobs.get(key)
            if old is not None and (old.running or not restart):
                return old, False
            job = Job(key=key, label=label or key)
            # the job sees the starting session's context (its workspace: forgetlab.core.workspace.session_home)
            context = contextvars.copy_context()
            thread = threading.Thread(target=context.run, args=(self._run, job, fn),
                                      name=f"forgetlab-job-{key[:40]}", daemon=True)
            job._thread = thread
            self._jobs[key] = job
            self._prune()
        thread.start()
        return job, True

    def forget(self, key: str) -> None:
        """Drop a finished job (a running one is kept: cancel it first)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and not job.running:
                del self._jobs[key]

    def jobs(self) -> list[Job]:
        """All jobs, newest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.started, reverse=True)

    def _prune(self) -> None:
        finished = sorted((j for j in self._jobs.values() if not j.running), key=lambda j: j.started)
        for job in finished[: max(0, len(finished) - self.keep_finished)]:
            del self._jobs[job.key]

    @staticmethod
    def _run(job: Job, fn: Callable) -> None:
        try:
            # a run the job saves records its measured peak; torch threads follow the machine's load
            with recording() as meter, governed_threads(meter.device):
                result = fn(job)
            job.peak = meter.to_dict()
        except JobCancelled:
            job.status = CANCELLED
        except BaseException as exc:  # noqa: BLE001 - stored and shown on the page
            job.error, job.traceback, job.status = exc, traceback.format_exc(), FAILED
        else:
            job.result, job.fraction, job.status = result, 1.0, DONE
        finally:
            job.finished = time.time()


REGISTRY = JobRegistry()


def job_key(*parts: Any) -> str:
    """A stable key from the things a result depends on: readable prefix + hash of all parts (JSON)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    head = str(parts[0]) if parts else "job"
    return f"{head}-{hashlib.sha1(blob.encode()).hexdigest()[:16]}"


def _draw_running(job: Job) -> None:
    elapsed = time.time() - job.started
    text = f"{job.label} — {job.message}" if job.message else job.label
    st.progress(job.fraction, text=f"{text} ({elapsed:.0f} s)")


def _cancel_button(job: Job) -> None:
    """Drawn once with the page, not in the polling fragment (a widget there made every poll dearer)."""
    if st.button("Cancel", key=f"cancel-{job.key}"):
        job.cancel()
        st.toast(f"Cancelling {job.label}…")


SEEN_KEY = "forgetlab_jobs_seen"


def _token(job: Job) -> str:
    return f"{job.key}@{job.started}"


def _find(reg: JobRegistry, key: str, slot: str | None) -> tuple[Job | None, bool]:
    """(job, found through the slot): the job of `key`; else, for a slot, the job this session last started
    there, else a running job of that slot from another session (or from before a page reload)."""
    job = reg.get(key)
    if job is not None or not slot:
        return job, False
    last = reg.get(st.session_state.get(f"{slot}_job") or "")
    if last is None:
        last = next((j for j in reg.jobs() if j.running and j.key.startswith(f"{slot}-")), None)
    return last, last is not None


def run_once(key: str, fn: Callable[[Job], Any], *, start: bool, label: str = "", cancellable: bool = True,
             refresh: float = REFRESH, partial_refresh: float = PARTIAL_REFRESH, slot: str | None = None,
             on_done: Callable[[Any], None] | None = None,
             show_partial: Callable[[Any], None] | None = None, registry: JobRegistry | None = None) -> Any:
    """Run `fn(progress)` once per `key` in the background and draw its state; return its result when done.

    `start` is typically the value of an st.button: True starts the job unless one with this key is running
    (then it attaches, with an st.info saying so). While it runs, a fragment refreshes the progress bar every
    `refresh` seconds and reruns the page when the job ends; a second fragment draws `show_partial(job.partial)`
    every `partial_refresh` seconds once the job published something. Returns the result of a finished job
    (also after page switches and reloads), or None while running / after a failure (shown) / cancellation.

    `slot` (the page's name, the first part of its job keys) lets a page find its job again when its widgets
    no longer give the same key (a page switch or a reload resets them, or the user changed a setting): the
    job this session last started there is shown (its progress, then its result), or else a job of the
    slot that is running for another session. `on_done(result)` is called once per finished job and browser
    session, in the script thread: the place to keep the result in st.session_state or to say where it was
    saved.
    """
    reg = registry or REGISTRY
    via_slot = False
    if start:
        job, started = reg.start(key, fn, label=label)
        if not started:
            st.info(f"{job.label} is already running (started {time.time() - job.started:.0f} s ago, "
                    "perhaps from another tab); showing its progress instead of starting a second copy.")
        if slot:
            st.session_state[f"{slot}_job"] = key
    else:
        job, via_slot = _find(reg, key, slot)
    if job is None:
        return None
    if job.running:
        @st.fragment(run_every=refresh)
        def _poll() -> None:
            if job.running:
                _draw_running(job)
            else:  # ended since the page was drawn: redraw the page so it shows the result
                st.rerun(scope="app")

        _poll()
        if cancellable:
            _cancel_button(job)
        if show_partial is not None:
            @st.fragment(run_every=partial_refresh)
            def _partial() -> None:
                if job.running and job.partial is not None:
                    show_partial(job.partial)

            _partial()
        return None
    seen = st.session_state.setdefault(SEEN_KEY, set())
    first = _token(job) not in seen
    seen.add(_token(job))
    if job.status == DONE:
        if first and on_done is not None:
            on_done(job.result)
        return job.result
    if via_slot and not first:     # an old failure of other settings: said once, not on every rerun
        return None
    if job.status == CANCELLED:
        st.info(f"{job.label} was cancelled; nothing was saved. Start it again to rerun.")
        return None
    render_error(job.error, job.traceback)
    return None


_FIGURES: dict[tuple, tuple[Any, Any]] = {}
_FIGURES_LOCK = threading.Lock()


def partial_figure(partial: Any, build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`build(partial, *args, **kwargs)`, built once per published partial (and arguments): the partial fragment
    redraws every few seconds, and rebuilding the same figure each time would compete with the job."""
    key = (id(partial), build, args, tuple(sorted(kwargs.items())))
    with _FIGURES_LOCK:
        hit = _FIGURES.get(key)
        if hit is not None and hit[0] is partial:
            return hit[1]
    fig = build(partial, *args, **kwargs)
    with _FIGURES_LOCK:
        if len(_FIGURES) > 32:
            _FIGURES.clear()
        _FIGURES[key] = (partial, fig)      # the partial is kept so that its id is not reused meanwhile
    return fig
