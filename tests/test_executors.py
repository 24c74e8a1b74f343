"""Executors (forgetlab.executors): local vs Ray sweeps agree, points run in other processes, a killed worker's
point is retried then reported failed, missing Ray / no cluster / too many workers give clear messages.

Ray runs locally on 2 CPUs (one instance for the module, shut down after). Tests that must see Ray *not*
running come first in the file.
"""
from __future__ import annotations

import os
import socket
import sys
import warnings

import pytest

from forgetlab.analysis.sweeps import alpha_curve, load_sweep
from forgetlab.core.errors import MissingDependencyError
from forgetlab.executors import ExecutorError, LocalExecutor, RayExecutor, ResourceShortageWarning, make_executor

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _echo_factory():
    """A factory whose state returns (item, pid) — no model, so actors start fast."""
    def build():
        def state(item, progress):
            return item, os.getpid()
        return state
    return build


def test_no_ray_installed_is_a_clear_error(monkeypatch):
    assert not ray.is_initialized()
    monkeypatch.setitem(sys.modules, "ray", None)          # `import ray` now raises ImportError
    with pytest.raises(MissingDependencyError, match="pip install ray"):
        make_executor("ray", workers=2).map(_echo_factory(), [1, 2])


def test_no_cluster_at_the_address_starts_nothing():
    assert not ray.is_initialized()
    for address in (f"127.0.0.1:{_free_port()}", f"ray://127.0.0.1:{_free_port()}"):
        with pytest.raises(ExecutorError, match="No Ray cluster answers"):
            RayExecutor(address=address).map(_echo_factory(), [1])
        assert not ray.is_initialized()
    with pytest.raises(ExecutorError, match="not host:port"):
        RayExecutor(address="nonsense").map(_echo_factory(), [1])


def test_local_executor_flags_need_ray():
    with pytest.raises(Exception, match="need --executor ray"):
        make_executor("local", workers=2)
    assert isinstance(make_executor(None), LocalExecutor)


@pytest.fixture(scope="module")
def ray_cpus2():
    """A local Ray instance with 2 CPUs for this module (RayExecutor reuses it and leaves it running)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def test_local_and_ray_alpha_sweeps_agree(ray_cpus2, pool, tiny_llama, tmp_path, monkeypatch, capsys):
    """`forgetlab sweep alpha --executor ray --workers 2` (in process, on the module's Ray instance) against the
    local library sweep: every point equal to 1e-6, computed by the two workers, saved with their pids."""
    from forgetlab.cli import main

    kw = dict(alphas=[0.0, 0.3, 0.7, 1.0], device="cpu", max_general=3, max_task=4)
    local = alpha_curve(pool, "ft0", **kw)
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    code = main(["sweep", "alpha", str(tiny_llama.pool_yaml), "--model", "ft0", "--alphas", "0,0.3,0.7,1",
                 "--max-general", "3", "--max-task", "4", "--device", "cpu", "--executor", "ray", "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "executor ray: 2 worker process(es)" in out
    remote = load_sweep(next((tmp_path / "runs").iterdir()))
    assert [p.x for p in remote.points] == kw["alphas"]                          # gathered in order
    for a, b in zip(local.points, remote.points):
        assert (a.series, a.x, a.settings) == (b.series, b.x, b.settings)
        assert b.general_loss == pytest.approx(a.general_loss, abs=1e-6)
        assert b.distance == pytest.approx(a.distance, abs=1e-6)
        for t in a.scorecard.tasks:
            assert b.scorecard.tasks[t].exact_match == a.scorecard.tasks[t].exact_match
            assert b.scorecard.tasks[t].answer_loss == pytest.approx(a.scorecard.tasks[t].answer_loss, abs=1e-6)
        assert a.pareto == b.pareto
    me = os.getpid()
    assert {p.worker["pid"] for p in local.points} == {me} and {p.executor for p in local.points} == {"local"}
    pids = {p.worker["pid"] for p in remote.points}
    assert me not in pids and len(pids) == 2                     # both workers, neither is the driver
    assert {p.executor for p in remote.points} == {"ray"}
    assert remote.executor["name"] == "ray" and remote.executor["workers"] == 2
    assert remote.executor["driver"]["pid"] == me and not remote.failed
    assert ray.is_initialized()                                  # not started by the executor: left running


def test_killed_worker_point_is_retried_then_failed(ray_cpus2, tmp_path):
    marks = str(tmp_path)

    def build():
        def state(item, progress):
            mark = os.path.join(marks, f"{item}.died")
            if item == "die-once" and not os.path.exists(mark):
                with open(mark, "w") as fh:
                    fh.write(str(os.getpid()))
                os._exit(1)                                      # the worker process dies mid-point
            if item == "die-always":
                os._exit(1)
            return item, os.getpid()
        return state

    ex = RayExecutor(workers=5)                                  # more than the 2 CPUs: says so, uses 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = ex.map(build, ["a", "die-once", "b", "die-always", "c"])
    assert any(issubclass(w.category, ResourceShortageWarning) for w in caught)
    assert ex.used_workers == 2 and "room for 2" in ex.notes[0]
    assert [o.index for o in outs] == [0, 1, 2, 3, 4]
    assert [o.value[0] for o in outs if o.ok] == ["a", "die-once", "b", "c"]
    died_on = int((tmp_path / "die-once.died").read_text())
    assert outs[1].attempts == 2 and outs[1].worker["pid"] != died_on      # retried on another process
    assert not outs[3].ok and outs[3].attempts == 2 and "died" in outs[3].error
    assert all(o.worker["pid"] != os.getpid() for o in outs if o.ok)


def _recipe(tiny_llama):
    return {"method": "task_arithmetic", "base": str(tiny_llama.base),
            "models": [{"model": str(tiny_llama.finetuned["ft0"]), "weight": 1.0},
                       {"model": str(tiny_llama.finetuned["ft1"]), "weight": 0.5}], "params": {"lam": 1.0}}


def test_merge_search_points_are_real_merges(pool, tiny_llama):
    from forgetlab.analysis.search import search
    from forgetlab.core.evaluate import evaluate
    from forgetlab.merge import merge_state_dicts

    res = search(_recipe(tiny_llama), pool, budget=4, popsize=3, measure="answer_loss", max_general=2, max_task=4,
                 device="cpu", max_forgetting=1.0)
    assert [p.index for p in res.points] == [0, 1, 2, 3] and res.points[0].values == [1.0, 0.5]   # start first
    assert res.models == ["ft0", "ft1"]
    # re-evaluate one CMA-ES candidate by hand: merge in memory, evaluate on the probe split
    p = res.points[2]
    base = pool.checkpoint("base").state_dict()
    fts = [pool.checkpoint(m).state_dict() for m in ("ft0", "ft1")]
    model = pool.load("base", device="cpu")
    merged = merge_state_dicts("task_arithmetic", base, fts, weights=p.values, lam=1.0)
    import copy
    m2 = copy.deepcopy(model)
    m2.load_state_dict(merged, strict=False)
    card = evaluate(m2, pool.tokenizer, pool.probes, split="probe", max_general=2, max_task=4)
    assert p.general_loss == pytest.approx(card.general_loss, abs=1e-6)
    assert p.forgetting == pytest.approx(card.general_loss - res.base_general_loss, abs=1e-9)
    # constrained with a loose bound: the best is the lowest answer loss among the points
    assert res.best == min(res.points, key=lambda q: q.speciality).index
    best = res.best_point
    assert [m["weight"] for m in res.best_recipe["models"]] == [round(v, 6) for v in best.values]
    assert any(q.pareto for q in res.points) and res.points[res.best].pareto


def test_merge_search_local_and_ray_agree(ray_cpus2, pool, tiny_llama):
    from forgetlab.analysis.search import search

    kw = dict(budget=4, popsize=3, max_general=2, max_task=4, device="cpu", hma_blocks=2, seed=3)
    local = search(_recipe(tiny_llama), pool, **kw)
    remote = search(_recipe(tiny_llama), pool, executor=RayExecutor(workers=1), **kw)   # one actor: one import
    assert len(local.points) == len(remote.points) == 4
    for a, b in zip(local.points, remote.points):
        assert a.values == b.values and a.alphas == b.alphas and len(a.alphas) == 2
        assert b.general_loss == pytest.approx(a.general_loss, abs=1e-6)
        assert b.answer_loss == pytest.approx(a.answer_loss, abs=1e-6)
        assert b.speciality == a.speciality
        assert b.worker["pid"] != os.getpid() and b.executor == "ray"
    assert local.best == remote.best and local.best_recipe == remote.best_recipe


def test_cancel_stops_the_workers(ray_cpus2):
    from forgetlab.executors import Cancelled

    def build():
        def state(item, progress):
            import time as _t
            _t.sleep(0.3)
            return os.getpid()
        return state

    seen = []
    with pytest.raises(Cancelled):
        RayExecutor(workers=2).map(build, list(range(40)), on_result=lambda o: seen.append(o.value),
                                   cancel=lambda: len(seen) >= 2)
    assert 2 <= len(seen) < 40
    import time
    deadline = time.monotonic() + 20
    alive = set(seen)
    while alive and time.monotonic() < deadline:            # the killed actors' processes exit
        for pid in list(alive):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                alive.discard(pid)
        time.sleep(0.2)
    assert not alive


def test_sweep_keeps_and_saves_points_when_a_point_kills_its_workers(ray_cpus2, pool, tmp_path):
    """A point whose worker dies on every attempt is reported in `failed`; the other points are kept and saved."""
    from forgetlab.analysis.sweeps import SweepSpec, run_specs, save_sweep, wise_ft_at

    driver = os.getpid()

    def deadly(name, w0, w1):
        if os.getpid() != driver:
            os._exit(1)
        return w1

    specs = [SweepSpec("wise-ft", 0.0, {"alpha": 0.0}, wise_ft_at(0.0)),
             SweepSpec("wise-ft", 0.5, {"alpha": 0.5}, deadly), SweepSpec("wise-ft", 1.0, {"alpha": 1.0}, wise_ft_at(1.0))]
    res = run_specs(pool, "ft0", "alpha", specs, task=None, recipe={}, device="cpu", batch_size=16, max_general=2,
                    max_task=2, tasks=None, on_point=None, progress=None, executor=RayExecutor(workers=2))
    assert [p.x for p in res.points] == [0.0, 1.0]
    assert len(res.failed) == 1 and res.failed[0]["x"] == 0.5 and res.failed[0]["attempts"] == 2
    saved = load_sweep(save_sweep(res, home_path=tmp_path))
    assert [p.x for p in saved.points] == [0.0, 1.0] and saved.failed[0]["settings"] == {"alpha": 0.5}


def test_pcb_lambda_search_local_and_ray_agree_and_the_cli_reports_its_workers(ray_cpus2, pool, tiny_llama,
                                                                              tmp_path, capsys, monkeypatch):
    """PCB's λ search (the Merge page's and `forgetlab pcb-search`'s) gives the same λ and losses in this process
    and on a Ray worker, and the CLI names the worker processes."""
    import yaml

    from forgetlab.analysis.lambda_search import pcb_lambda_search
    from forgetlab.cli import main
    from forgetlab.merge.workflow import pool_recipe

    recipe = pool_recipe(pool, "pcb", ["ft0", "ft1"], {"keep": 0.5, "lam": 1.0, "scope": "tensor"})
    local, where = pcb_lambda_search(pool, recipe, budget=4, max_task=32)
    remote, workers = pcb_lambda_search(pool, recipe, budget=4, max_task=32, executor=RayExecutor(workers=1))
    assert where == [{"host": socket.gethostname(), "pid": os.getpid()}]
    assert remote.lambdas == pytest.approx(local.lambdas, abs=1e-6)
    assert remote.loss == pytest.approx(local.loss, abs=1e-5) and remote.n_evals == local.n_evals
    assert workers and {w["pid"] for w in workers} != {os.getpid()}
    path = tmp_path / "pcb.yaml"
    path.write_text(recipe.to_yaml())
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))      # the command saves its run (issue 42)
    assert main(["pcb-search", str(path), "--pool", str(tiny_llama.pool_yaml), "--budget", "4", "--executor", "ray",
                 "--workers", "1", "--out", str(tmp_path / "found.yaml")]) == 0
    out = capsys.readouterr().out
    assert "executor ray: 1 worker process(es)" in out
    found = yaml.safe_load((tmp_path / "found.yaml").read_text())
    assert [m["lam"] for m in found["models"]] == pytest.approx(local.lambdas, abs=1e-5)


def test_worker_label_and_the_tables_worker_column():
    """A worker is written host:pid, in the CLI's lines and in the app's tables (one `worker` column in the
    place of the saved `worker_host` and `worker_pid`; a row without a worker shows an empty cell)."""
    import pandas as pd

    from forgetlab.executors import worker_id, worker_label
    from forgetlab.plots import worker_column

    assert worker_label(worker_id()) == f"{socket.gethostname()}:{os.getpid()}"
    assert worker_label({}) == worker_label(None) == ""
    saved = pd.DataFrame({"x": [0.0, 1.0], "worker_host": ["a", None], "worker_pid": [12.0, None], "y": [1, 2]})
    shown = worker_column(saved)
    assert list(shown.columns) == ["x", "worker", "y"] and list(shown["worker"]) == ["a:12", ""]
    assert list(saved.columns) == ["x", "worker_host", "worker_pid", "y"]             # the input is untouched
    plain = pd.DataFrame({"x": [1]})
    assert worker_column(plain) is plain


def test_sequence_chains_run_side_by_side_on_ray_with_the_local_numbers(ray_cpus2, pool):
    """Each chain of a task sequence is one point: on Ray the chains come back in order, from worker processes, with
    the local run's scores."""
    from forgetlab.train.defaults import FinetuneDefaults
    from forgetlab.train.sequence import ChainOptions, run_sequence

    budget = FinetuneDefaults(steps=3, batch_size=4, lr=5e-3, warmup=0)
    options = ChainOptions(budgets={"math": budget, "copy": budget}, max_train=6, max_general=2, max_task=4)
    local = run_sequence(pool, ["math", "copy"], ["adamw", "sfa"], options=options)
    remote = run_sequence(pool, ["math", "copy"], ["adamw", "sfa"], options=options,
                          executor=RayExecutor(workers=2))
    assert remote.methods == ["adamw", "sfa"] and remote.recipe["executor"]["name"] == "ray"
    assert all(c.worker["pid"] != os.getpid() for c in remote.chains)
    for a, b in zip(local.chains, remote.chains):
        for s, t in zip(a.stages, b.stages):
            assert t.exact_match == s.exact_match
            assert t.answer_loss == pytest.approx(s.answer_loss, abs=1e-6)
            assert t.general_loss == pytest.approx(s.general_loss, abs=1e-6)
