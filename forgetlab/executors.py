"""Where many independent points run: in this process (`local`, the default) or on Ray actors (`ray`).

A job with many independent points (the models of a sweep, the candidates of a merge search, the runs of a
fine-tune comparison) is given to an executor as two things:

- a *factory*: a picklable callable that builds a worker's resident state once — e.g. a sweep's working copy
  of the base with θ0 and θ1 opened lazily (`forgetlab.analysis.sweeps.WorkingCopy`) — and returns a callable
  ``state(item, progress) -> value``;
- the *items*: one small picklable description per point (e.g. the point function θ0 + f(τ)).

`LocalExecutor` builds the state in process and runs the items in order (today's behaviour). `RayExecutor`
starts N Ray actors (one CPU each, or G GPUs each when the cluster has GPUs); each builds the state once on its
own device and then runs the items it is given. The driver hands an item to every idle worker, gathers the
results in the items' order, reports progress per finished point, and stops cleanly on Ctrl-C, on a
`cancel()` that returns True, or when the progress callback raises (the app's cancel button): the actors are
killed and, when the executor started the Ray instance itself, Ray is shut down. A point whose worker dies
(the process is killed, runs out of memory) is retried once on another worker (the dead actor is restarted by
Ray for later points); if it fails again it is reported as failed (`Outcome.error`) and the other points are
kept. An exception raised by the point itself (bad input) is raised in the driver as in a local run.

Every outcome names the worker that computed it: ``{"host": ..., "pid": ...}``.

Ray is imported only when a `RayExecutor` starts. It connects to an existing cluster (`address="auto"`, a GCS
address ``host:port`` or a Ray client address ``ray://host:port``; the cluster's nodes need forgetlab and the
models' paths) or starts a local instance on this machine without the dashboard. Note: on Linux Ray's own
servers (GCS, raylet) listen on all interfaces of the node and advertise its routable address whatever
`_node_ip_address` says (Ray maps 127.0.0.1 to it); this Ray version protects them with a token
(~/.ray/auth_token). forgetlab itself contacts nothing beyond the cluster it is given.
"""
from __future__ import annotations

import os
import socket
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from forgetlab.core.errors import ForgetlabError, MissingDependencyError, ParameterError
from forgetlab.core.pool import ModelPool
from forgetlab.core.progress import Progress, report, scaled

EXECUTORS = ("local", "ray")

Cancel = Optional[Callable[[], bool]]
OnResult = Optional[Callable[["Outcome"], None]]


class ExecutorError(ForgetlabError):
    """The executor cannot run: Ray missing, no cluster at the address, no room for a worker."""


class Cancelled(ForgetlabError):
    """The run was cancelled (Ctrl-C or a cancel callback); workers were stopped and nothing was kept."""


class ResourceShortageWarning(UserWarning):
    """More workers were asked for than the cluster has room for; fewer are used."""


def worker_id() -> dict[str, Any]:
    """This process as a worker: ``{"host": hostname, "pid": process id}``."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def worker_label(worker: Optional[dict[str, Any]]) -> str:
    """A worker as people write it: ``"host:pid"`` (``""`` when unknown), e.g. ``worker_label(worker_id())``."""
    if not worker:
        return ""
    return f"{worker.get('host')}:{worker.get('pid')}"


@dataclass
class Outcome:
    """The result of one item: its value (None when it failed), the worker, time and attempts it took."""

    index: int
    value: Any = None
    worker: Optional[dict[str, Any]] = None
    seconds: float = 0.0
    attempts: int = 1
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when the point was computed (no error)."""
        return self.error is None


# ------------------------------------------------------------------------------------------------- local


class Workers:
    """A set of workers holding one factory's state; `map` runs items on them. Use as a context manager."""

    executor: "Executor"

    def map(self, items: Sequence[Any], *, on_result: OnResult = None, progress: Progress = None,
            cancel: Cancel = None) -> list[Outcome]:
        raise NotImplementedError

    def close(self) -> None:
        """Stop the workers (idempotent)."""

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Executor:
    """Base: `describe()` for the record, `workers(factory)` for a resident worker set, `map` for one batch."""

    name = "base"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def describe(self) -> dict[str, Any]:
        """What ran the points (saved with results): name, driver, and notes such as fewer workers than asked."""
        return {"name": self.name, "driver": worker_id(), "notes": list(self.notes)}

    def workers(self, factory: Callable[[], Any], *, progress: Progress = None, cancel: Cancel = None) -> Workers:
        raise NotImplementedError

    def map(self, factory: Callable[[], Any], items: Sequence[Any], *, on_result: OnResult = None,
            progress: Progress = None, cancel: Cancel = None) -> list[Outcome]:
        """Build the workers' state from `factory`, run every item, stop the workers; outcomes in item order."""
        with self.workers(factory, progress=scaled(progress, 0.0, 0.05), cancel=cancel) as w:
            return w.map(items, on_result=on_result, progress=scaled(progress, 0.05, 1.0), cancel=cancel)


class _LocalWorkers(Workers):
    def __init__(self, executor: "LocalExecutor", factory: Callable[[], Any]):
        self.executor = executor
        self.state = factory()

    def map(self, items, *, on_result=None, progress=None, cancel=None):
        n = len(items)
        out = []
        who = worker_id()
        for i, item in enumerate(items):
            if cancel is not None and cancel():
                raise Cancelled("Cancelled; no result was kept.")
            t0 = time.perf_counter()
            value = self.state(item, scaled(progress, i / n, (i + 1) / n))
            outcome = Outcome(i, value, dict(who), time.perf_counter() - t0)
            out.append(outcome)
            if on_result is not None:
                on_result(outcome)
            report(progress, (i + 1) / n, f"{i + 1}/{n} points")
        return out

    def close(self) -> None:
        self.state = None


class LocalExecutor(Executor):
    """Run the points one after another in this process (one resident state)."""

    name = "local"

    def workers(self, factory, *, progress=None, cancel=None) -> Workers:
        report(progress, 0.0, "loading the worker state in process")
        return _LocalWorkers(self, factory)


# --------------------------------------------------------------------------------------------------- Ray


def import_ray():
    """The `ray` module, or MissingDependencyError naming the pip command."""
    try:
        import ray  # noqa: PLC0415 - lazy on purpose
    except ImportError:
        raise MissingDependencyError("The ray executor needs Ray: pip install ray (or choose --executor local)."
                                     ) from None
    return ray


class _Host:
    """The Ray actor: builds the factory's state once, then runs items (the plain class is wrapped lazily)."""

    def __init__(self, factory: Callable[[], Any]):
        self.state = factory()
        self.who = worker_id()

    def ping(self) -> dict[str, Any]:
        return self.who

    def run(self, item: Any) -> tuple[Any, dict[str, Any], float]:
        t0 = time.perf_counter()
        value = self.state(item, None)
        return value, self.who, time.perf_counter() - t0


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast (ExecutorError) when nothing listens at a ``host:port`` or ``ray://host:port`` address."""
    if address == "auto":
        return
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise ExecutorError(f"Ray address {address!r} is not host:port, ray://host:port or auto.")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise ExecutorError(f"No Ray cluster answers at {address} ({exc.strerror or exc}). Start one there "
                            "(ray start --head), give the right --ray-address, or leave it out to start a local "
                            "Ray instance.") from None


def _actor_died_types(ray) -> tuple[type, ...]:
    ex = ray.exceptions
    return tuple(t for t in (getattr(ex, "RayActorError", None), getattr(ex, "ActorDiedError", None),
                             getattr(ex, "ActorUnavailableError", None), getattr(ex, "WorkerCrashedError", None),
                             getattr(ex, "NodeDiedError", None)) if t is not None)


def _unwrap(ray, exc: BaseException) -> BaseException:
    """The exception raised inside a Ray task (a RayTaskError's cause), else `exc`."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return exc


class _RayWorkers(Workers):
    def __init__(self, executor: "RayExecutor", factory, progress: Progress, cancel: Cancel):
        self.executor = executor
        self.ray = ray = executor._start()
        self.actors: list[Any] = []
        self.deaths: list[int] = []
        try:
            n, gpus = executor._fit(ray)
            actor_cls = ray.remote(_Host)
            opts = dict(num_cpus=executor.cpus_per_worker, num_gpus=gpus, max_restarts=executor.max_restarts,
                        max_task_retries=0)
            self.actors = [actor_cls.options(**opts).remote(factory) for _ in range(n)]
            self.deaths = [0] * n
            report(progress, 0.0, f"starting {n} Ray worker(s)")
            pings = {a.ping.remote(): k for k, a in enumerate(self.actors)}
            self.who: list[Optional[dict]] = [None] * n
            while pings:
                self._check_cancel(cancel)
                ready, _ = ray.wait(list(pings), num_returns=1, timeout=executor.poll)
                for ref in ready:
                    k = pings.pop(ref)
                    try:
                        self.who[k] = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - the worker could not build its state
                        raise self._as_error(exc, "A Ray worker could not load its state") from None
                    report(progress, (n - len(pings)) / n, f"{n - len(pings)}/{n} Ray workers ready")
        except BaseException:
            self.close()
            raise

    def _check_cancel(self, cancel: Cancel) -> None:
        if cancel is not None and cancel():
            raise Cancelled("Cancelled; the Ray workers were stopped and no result was kept.")

    def _as_error(self, exc: BaseException, what: str) -> BaseException:
        cause = _unwrap(self.ray, exc)
        if isinstance(cause, ForgetlabError):
            return cause
        return ExecutorError(f"{what}: {type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}")

    def map(self, items, *, on_result=None, progress=None, cancel=None):
        ray, ex = self.ray, self.executor
        died = _actor_died_types(ray)
        n = len(items)
        outcomes: list[Optional[Outcome]] = [None] * n
        attempts = [0] * n
        avoid: dict[int, int] = {}                       # item → the actor it died on
        pending = deque(range(n))
        live = [k for k in range(len(self.actors)) if self.deaths[k] <= ex.max_restarts]
        idle = deque(live)
        inflight: dict[Any, tuple[int, int, float]] = {}
        reviving: dict[Any, int] = {}                   # ping → an actor that Ray is restarting
        done = 0
        last_beat = time.monotonic()
        item_refs = [ray.put(it) for it in items] if n else []
        while pending or inflight:
            self._check_cancel(cancel)
            # hand items to idle workers (a retried item prefers a worker other than the one it died on)
            skipped: list[int] = []
            while pending and idle:
                i = pending.popleft()
                choices = [k for k in idle if k != avoid.get(i)]
                if not choices and (len(live) > 1):
                    skipped.append(i)                    # wait for another worker
                    continue
                k = choices[0] if choices else idle[0]
                idle.remove(k)
                attempts[i] += 1
                inflight[self.actors[k].run.remote(item_refs[i])] = (i, k, time.perf_counter())
            pending.extendleft(reversed(skipped))
            if not inflight and not reviving:
                if pending:                               # no live worker left
                    for i in pending:
                        outcomes[i] = Outcome(i, None, None, 0.0, attempts[i],
                                              "no live Ray worker was left to compute this point")
                    pending.clear()
                break
            ready, _ = ray.wait([*inflight, *reviving], num_returns=1, timeout=ex.poll)
            if not ready:
                if time.monotonic() - last_beat > 2.0:   # lets a raising progress callback cancel the run
                    report(progress, done / max(1, n), f"{done}/{n} points; {len(inflight)} running")
                    last_beat = time.monotonic()
                continue
            for ref in ready:
                if ref in reviving:                       # a restarted worker answers again (or is gone)
                    k = reviving.pop(ref)
                    try:
                        ray.get(ref)
                        idle.append(k)
                    except died as exc:
                        if "restarting" in str(exc) or "temporarily unavailable" in str(exc):
                            time.sleep(ex.poll)
                            reviving[self.actors[k].ping.remote()] = k
                        elif k in live:
                            live.remove(k)
                    continue
                i, k, t0 = inflight.pop(ref)
                try:
                    value, who, secs = ray.get(ref)
                except died as exc:
                    self.deaths[k] += 1
                    if self.deaths[k] <= ex.max_restarts:   # Ray restarts it (its state is rebuilt)
                        reviving[self.actors[k].ping.remote()] = k
                    elif k in live:
                        live.remove(k)
                    if attempts[i] <= ex.retries and live:
                        avoid[i] = k
                        pending.appendleft(i)
                        note = f"point {i + 1}: its worker died; retrying on another worker"
                    else:
                        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                        outcomes[i] = Outcome(i, None, None, time.perf_counter() - t0, attempts[i],
                                              f"its Ray worker died {attempts[i]} time(s) ({reason[:200]})")
                        done += 1
                        note = f"point {i + 1} failed: its worker died {attempts[i]} time(s)"
                        if on_result is not None:
                            on_result(outcomes[i])
                    report(progress, done / max(1, n), note)
                    continue
                except Exception as exc:  # noqa: BLE001 - the point itself raised: as in a local run
                    raise self._as_error(exc, f"Point {i + 1} failed on a Ray worker") from None
                idle.append(k)
                outcomes[i] = Outcome(i, value, who, secs, attempts[i])
                done += 1
                if on_result is not None:
                    on_result(outcomes[i])
                report(progress, done / max(1, n), f"{done}/{n} points (worker {who['host']}:{who['pid']})")
                last_beat = time.monotonic()
        return [o for o in outcomes]  # type: ignore[misc]

    def close(self) -> None:
        ray = self.ray
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        self.executor._stop()


class RayExecutor(Executor):
    """Run points on Ray actors that keep the base and task vectors resident (see the module docstring).

    `address`: None starts a local Ray instance (`num_cpus` CPUs, default all of this machine's; no
    dashboard) unless Ray is already initialised in this process; "auto", "host:port" or
    "ray://host:port" connect to a running cluster. `workers`: how many actors (default: as many as fit);
    asking for more than fit is said (`notes`, a ResourceShortageWarning) and the ones that fit are used.
    `gpus_per_worker`: GPUs per actor (default 1 when the cluster has GPUs, else 0). A point whose worker dies
    is retried `retries` times on another worker; Ray restarts a dead actor `max_restarts` times.
    """

    name = "ray"

    def __init__(self, address: Optional[str] = None, workers: Optional[int] = None,
                 gpus_per_worker: Optional[float] = None, cpus_per_worker: float = 1.0,
                 num_cpus: Optional[int] = None, retries: int = 1, max_restarts: int = 2, poll: float = 0.25):
        super().__init__()
        if workers is not None and int(workers) < 1:
            raise ParameterError(f"workers must be at least 1; got {workers}.")
        if gpus_per_worker is not None and float(gpus_per_worker) < 0:
            raise ParameterError(f"gpus_per_worker must be ≥ 0; got {gpus_per_worker}.")
        if float(cpus_per_worker) <= 0:
            raise ParameterError(f"cpus_per_worker must be > 0; got {cpus_per_worker}.")
        self.address = address or None
        self.n_workers = int(workers) if workers is not None else None
        self.gpus_per_worker = gpus_per_worker
        self.cpus_per_worker = float(cpus_per_worker)
        self.num_cpus = num_cpus
        self.retries = int(retries)
        self.max_restarts = int(max_restarts)
        self.poll = float(poll)
        self._started = False
        self._used = 0
        self.used_workers: Optional[int] = None

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(address=self.address, workers=self.used_workers, asked_workers=self.n_workers,
                 gpus_per_worker=self.gpus_per_worker)
        return d

    def _start(self):
        """Import Ray and connect (or start a local instance); ExecutorError when that is impossible."""
        ray = import_ray()
        if ray.is_initialized():
            self._used += 1
            return ray
        common = dict(include_dashboard=False, logging_level="WARNING", log_to_driver=False,
                      configure_logging=True)
        if self.address:
            _check_reachable(self.address)
            try:
                ray.init(address=self.address, **common)
            except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError…
                raise ExecutorError(f"Could not connect to the Ray cluster at {self.address}: {exc}. Check the "
                                    "address (ray status on the head node shows it), or leave --ray-address out "
                                    "to start a local Ray instance.") from None
        else:
            num_cpus = self.num_cpus or os.cpu_count() or 1
            try:
                ray.init(num_cpus=int(num_cpus), **common)
            except Exception as exc:  # noqa: BLE001
                raise ExecutorError(f"Could not start a local Ray instance: {exc}") from None
        self._started = True
        self._used += 1
        return ray

    def _stop(self) -> None:
        self._used = max(0, self._used - 1)
        if self._started and self._used == 0:
            import ray  # noqa: PLC0415

            ray.shutdown()
            self._started = False

    def _fit(self, ray) -> tuple[int, float]:
        """How many actors to start and the GPUs each gets, given the cluster's resources."""
        total = ray.cluster_resources()
        cpus, gpus_total = float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0))
        gpw = self.gpus_per_worker if self.gpus_per_worker is not None else (1.0 if gpus_total >= 1 else 0.0)
        if gpw > 0 and gpus_total < gpw:
            raise ExecutorError(f"Each worker asks for {gpw:g} GPU(s) but the Ray cluster has {gpus_total:g}; "
                                "use --gpus-per-worker 0 to run on CPUs.")
        fit = int(cpus // self.cpus_per_worker)
        why = f"{cpus:g} CPUs at {self.cpus_per_worker:g} per worker"
        if gpw > 0 and int(gpus_total // gpw) < fit:
            fit = int(gpus_total // gpw)
            why = f"{gpus_total:g} GPUs at {gpw:g} per worker"
        if fit < 1:
            raise ExecutorError(f"The Ray cluster has no room for one worker ({why}).")
        n = self.n_workers or fit
        if n > fit:
            note = f"asked for {n} Ray workers but the cluster has room for {fit} ({why}); using {fit}"
            self.notes.append(note)
            warnings.warn(note, ResourceShortageWarning, stacklevel=3)
            n = fit
        self.used_workers = n
        return n, gpw

    def workers(self, factory, *, progress=None, cancel=None) -> Workers:
        return _RayWorkers(self, factory, progress, cancel)


def make_executor(name: str | Executor | None = "local", *, address: Optional[str] = None,
                  workers: Optional[int] = None, gpus_per_worker: Optional[float] = None,
                  num_cpus: Optional[int] = None) -> Executor:
    """An executor by name (`EXECUTORS`); an Executor instance is returned as is. Options other than the name
    only apply to `ray` (giving them with `local` is an error, so a mistyped flag is not silently ignored)."""
    if isinstance(name, Executor):
        return name
    name = name or "local"
    if name == "local":
        if address or workers or gpus_per_worker:
            raise ParameterError("--ray-address, --workers and --gpus-per-worker need --executor ray.")
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(address=address, workers=workers, gpus_per_worker=gpus_per_worker, num_cpus=num_cpus)
    raise ParameterError(f"Unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}.")


# --------------------------------------------------------------------------------------- portable pools


class PoolWorkerFactory:
    """Builds a worker's resident state around a model pool: the one picklable pool factory of every analysis
    that runs on workers (sweeps, searches, fine-tunes). Pickled for a Ray worker, the pool is replaced by
    `pool_spec(pool, members)` (plain data) and reopened there with `open_pool`; in this process the pool itself
    is used. `args` are kept for `build`. A subclass sets `members` (the pool members the worker needs: None for
    all, () for the base only), fields that must not travel in `local_only` (they are None on a worker), and
    builds its state in `build(pool)`."""

    members: Optional[Sequence[str]] = None
    local_only: tuple[str, ...] = ()

    def __init__(self, pool, *args):
        self.pool, self.args = pool, args

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if not isinstance(d["pool"], dict):
            d["pool"] = pool_spec(d["pool"], self.members)
        for name in self.local_only:
            d[name] = None
        return d

    def __call__(self):
        pool = open_pool(self.pool) if isinstance(self.pool, dict) else self.pool
        return self.build(pool)

    def build(self, pool):
        """The worker's state (a callable taking (item, progress)) around the opened `pool`."""
        raise NotImplementedError


def pool_spec(pool, models: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """What a worker needs to reopen `pool` (base, the named members, probe data), as plain picklable data."""
    names = list(models) if models is not None else list(pool.model_names)
    members = {}
    for n in names:
        e = pool.entries[n]
        members[n] = {"adapter": e.ref} if e.adapter else e.ref
    return {"base": pool.base_ref, "models": members, "probes": pool.probes, "name": pool.name,
            "source": str(pool.source) if getattr(pool, "source", None) else None}


def open_pool(spec: dict[str, Any]):
    """Reopen a pool from `pool_spec` on a worker (no NaN scan: the driver's pool did it)."""
    return ModelPool(spec["base"], spec["models"], spec["probes"], name=spec.get("name", "pool"),
                     source=spec.get("source"), scan_nonfinite=False)
