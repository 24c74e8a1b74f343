"""The app shell and the Streamlit adapters in forgetlab.ui (AppTest, no browser)."""
from __future__ import annotations

from pathlib import Path

import threading
import time

from streamlit.testing.v1 import AppTest

from forgetlab.ui.jobs import CANCELLED, DONE, FAILED, JobRegistry, job_key

# ---------------------------------------------------------------- job registry (pure python)


def _gated(gate: threading.Event, value):
    def fn(progress):
        progress(0.5, "half")
        assert gate.wait(10)
        progress(1.0, "end")
        return value
    return fn


def test_second_start_attaches_to_the_running_job():
    reg, gate, calls = JobRegistry(), threading.Event(), []

    def fn(progress):
        calls.append(1)
        return _gated(gate, 42)(progress)

    job1, started1 = reg.start("k", fn)
    job2, started2 = reg.start("k", fn)
    assert started1 and not started2 and job2 is job1
    gate.set()
    assert job1.wait(10)
    assert (job1.status, job1.result, job1.fraction, len(calls)) == (DONE, 42, 1.0, 1)
    job3, started3 = reg.start("k", fn)          # finished: a new click reruns it
    assert started3 and job3 is not job1
    job3.wait(10)
    assert len(calls) == 2


def test_many_threads_clicking_at_once_start_one_copy():
    reg, gate, calls = JobRegistry(), threading.Event(), []

    def fn(progress):
        calls.append(1)
        gate.wait(10)
        return "x"

    barrier = threading.Barrier(8)
    results = []

    def click():
        barrier.wait()
        results.append(reg.start("same-output", fn))

    threads = [threading.Thread(target=click) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gate.set()
    assert sum(started for _, started in results) == 1
    assert len({id(job) for job, _ in results}) == 1
    results[0][0].wait(10)
    assert len(calls) == 1


def test_cancel_stops_at_next_progress_and_failure_is_kept():
    reg, gate = JobRegistry(), threading.Event()
    job, _ = reg.start("c", _gated(gate, 1))
    while job.fraction < 0.5:
        time.sleep(0.01)
    job.cancel()
    gate.set()
    job.wait(10)
    assert job.status == CANCELLED and job.result is None

    def boom(progress):
        raise ValueError("bad")

    bad, _ = reg.start("b", boom)
    bad.wait(10)
    assert bad.status == FAILED and isinstance(bad.error, ValueError) and "ValueError: bad" in bad.traceback


def test_registry_prunes_old_finished_jobs_but_keeps_running_ones():
    reg, gate = JobRegistry(keep_finished=2), threading.Event()
    running, _ = reg.start("run", _gated(gate, 0))
    for i in range(5):
        j, _ = reg.start(f"f{i}", lambda p, i=i: i)
        j.wait(10)
    reg.start("last", lambda p: 0)[0].wait(10)
    keys = {j.key for j in reg.jobs()}
    assert "run" in keys and len(keys) <= 4
    gate.set()
    running.wait(10)


def test_job_key_is_stable_and_depends_on_every_part():
    a = job_key("merge", "/out", {"alpha": 0.5, "b": [1, 2]})
    assert a == job_key("merge", "/out", {"b": [1, 2], "alpha": 0.5})
    assert a != job_key("merge", "/out", {"alpha": 0.6, "b": [1, 2]})
    assert a.startswith("merge-")

# ---------------------------------------------------------------- adapters inside a Streamlit script


def _errors_script():
    import streamlit as st

    from forgetlab.core.errors import ParameterError
    from forgetlab.ui.errors import show_errors

    with show_errors():
        raise ParameterError("alpha must lie in [0, 1]; got 2. Pass a value between 0 and 1.")
    with show_errors():
        raise ValueError("kaput")
    with show_errors():
        st.stop() if st.session_state.get("stop") else None
    st.write("still alive")


def test_show_errors_keeps_the_page_alive():
    at = AppTest.from_function(_errors_script).run(timeout=30)
    assert not at.exception
    errors = [e.value for e in at.error]
    assert errors[0] == "alpha must lie in [0, 1]; got 2. Pass a value between 0 and 1."
    assert errors[1].startswith("Unexpected error: ValueError: kaput") and "still usable" in errors[1]
    assert at.expander[0].label == "Traceback" and "kaput" in at.expander[0].code[0].value
    assert at.markdown[-1].value == "still alive"
    at.session_state["stop"] = True       # st.stop() must pass through show_errors, not be shown as error
    at.run(timeout=30)
    assert not at.exception and len(at.error) == 2 and not any(m.value == "still alive" for m in at.markdown)


def _progress_script():
    import streamlit as st

    from forgetlab.ui.errors import show_errors

    from forgetlab.ui.progress import progress_bar

    seen = []
    with progress_bar("Scoring") as progress:
        for i in range(5):
            progress(i / 4, f"step {i}")
            seen.append(i)
    st.write(f"steps {len(seen)}")
    with show_errors():
        with progress_bar("Failing") as progress:
            progress(0.2, "")
            raise RuntimeError("no")


def test_progress_bar_completes_and_marks_failures():
    at = AppTest.from_function(_progress_script).run(timeout=30)
    assert not at.exception
    assert at.markdown[0].value == "steps 5"
    statuses = [b for b in at.main.children.values() if type(b).__name__ == "Status"]
    assert [(s.label, s.icon) for s in statuses] == [("Scoring: done", ":material/check:"),
                                                     ("Failing: failed", ":material/error:")]
    assert "Unexpected error: RuntimeError: no" in at.error[0].value


def _device_script():
    import streamlit as st

    from forgetlab.ui.settings import device_settings, render_device_settings

    with st.sidebar:
        render_device_settings()
    device, dtype = device_settings()
    st.write(f"{device} {dtype}")


def test_device_settings_default_to_cpu_and_follow_the_sidebar():
    import torch

    at = AppTest.from_function(_device_script).run(timeout=30)
    assert not at.exception
    assert at.sidebar.selectbox(key="app_device").options == (["cpu", "cuda"] if torch.cuda.is_available()
                                                              else ["cpu"])
    at.sidebar.selectbox(key="app_dtype").set_value("bfloat16").run(timeout=30)
    assert at.markdown[0].value.endswith("torch.bfloat16")


def test_dtype_defaults_to_float32_on_cpu_and_bfloat16_on_cuda(monkeypatch):
    from forgetlab.ui import settings

    at = AppTest.from_function(_device_script).run(timeout=30)
    assert at.sidebar.selectbox(key="app_dtype").value == "float32"
    assert at.markdown[0].value == "cpu torch.float32"

    # a visible GPU: the sidebar starts on cuda with bfloat16, and switching device resets the dtype to its default
    monkeypatch.setattr(settings, "available_devices", lambda: ["cpu", "cuda"])
    at = AppTest.from_function(_device_script).run(timeout=30)
    assert not at.exception
    assert at.sidebar.selectbox(key="app_device").value == "cuda"
    assert at.sidebar.selectbox(key="app_dtype").value == "bfloat16"
    assert at.markdown[0].value == "cuda torch.bfloat16"
    assert "reductions" in at.sidebar.selectbox(key="app_dtype").help
    at.sidebar.selectbox(key="app_device").set_value("cpu").run(timeout=30)
    assert at.sidebar.selectbox(key="app_dtype").value == "float32"
    at.sidebar.selectbox(key="app_dtype").set_value("float16").run(timeout=30)
    assert at.markdown[0].value == "cpu torch.float16"
    at.sidebar.selectbox(key="app_device").set_value("cuda").run(timeout=30)
    assert at.markdown[0].value == "cuda torch.bfloat16"


def test_default_dtype_matches_job_dtype():
    import torch

    from forgetlab.core.memory import job_dtype
    from forgetlab.ui.settings import default_dtype

    for device in ("cpu", "cuda"):
        assert getattr(torch, default_dtype(device)) == job_dtype(None, device)


def _job_script():
    import threading

    import streamlit as st

    from forgetlab.ui.jobs import run_once

    gate = st.session_state.setdefault("gate", threading.Event())

    def work(progress):
        progress(0.3, "working")
        gate.wait(10)
        return 7

    clicked = st.button("Go")
    result = run_once(st.session_state.get("key", "job-test"), work, start=clicked, label="Test job")
    if result is not None:
        st.write(f"result {result}")


def test_run_once_shows_progress_then_result_and_ignores_a_second_click():
    from forgetlab.ui.jobs import REGISTRY

    key = f"job-test-{time.time()}"
    at = AppTest.from_function(_job_script)
    at.session_state["key"] = key
    at.run(timeout=30)
    assert REGISTRY.get(key) is None and not at.markdown
    at.button[0].click().run(timeout=30)
    job = REGISTRY.get(key)
    assert job is not None and job.running
    at.button[0].click().run(timeout=30)          # second click while running: attaches
    assert REGISTRY.get(key) is job
    assert any("already running" in i.value for i in at.info)
    at.session_state["gate"].set()
    job.wait(10)
    at.run(timeout=30)
    assert not at.exception
    assert [m.value for m in at.markdown] == ["result 7"]

def _slot_script():
    import threading

    import streamlit as st

    from forgetlab.ui.jobs import job_key, run_once

    gate = st.session_state.setdefault("gate", threading.Event())
    delivered = st.session_state.setdefault("delivered", [])

    def work(progress):
        progress.publish("half way")
        assert gate.wait(10)
        return 7

    clicked = st.button("Go")
    key = job_key(st.session_state["slot"], st.session_state.get("setting", 1))
    result = run_once(key, work, start=clicked, label="Slot job", slot=st.session_state["slot"],
                      on_done=delivered.append, show_partial=lambda partial: st.write(f"partial: {partial}"))
    if result is not None:
        st.write(f"result {result}")


def test_run_once_follows_the_slot_job_shows_partial_and_hands_the_result_over_once():
    from tests.jobs_helper import finish_jobs, running_jobs

    slot = f"slot{int(time.time() * 1000)}"
    at = AppTest.from_function(_slot_script)
    at.session_state["slot"] = slot
    at.run(timeout=30)
    at.button[0].click().run(timeout=30)
    (job,) = running_jobs(slot)
    for _ in range(100):
        if job.partial is not None:
            break
        time.sleep(0.05)
    at.session_state["setting"] = 2                  # the widgets no longer give the job's key
    at.run(timeout=30)
    assert len(at.get("progress")) == 1 and "partial: half way" in [m.value for m in at.markdown]
    at.session_state["gate"].set()
    finish_jobs(at, slot)
    assert not at.exception and [m.value for m in at.markdown] == ["result 7"]
    at.run(timeout=30)
    assert at.session_state["delivered"] == [7]      # on_done once per job and session, not per rerun


# ---------------------------------------------------------------- navigation order


def test_pages_are_listed_in_the_fixed_order_when_they_exist(tmp_path):
    """Each page declares its menu entry (MENU = title, icon, order); the menu lists the declared pages in order,
    and a file without a declaration is not a page of the menu."""
    from forgetlab.ui.navigation import existing_pages

    listed = [p.stem for p in existing_pages(Path(__file__).resolve().parents[1] / "pages")]
    core = ["models", "linearity", "forgetting", "attribution", "text", "features", "merge", "finetune", "runs",
            "glossary"]
    assert [s for s in listed if s in core] == core and listed[0] == "models" and listed[-2:] == ["runs", "glossary"]
    for stem, order in [("runs", 90), ("merge", 70), ("models", 10)]:
        (tmp_path / f"{stem}.py").write_text(f'"""A page."""\nMENU = ("{stem.title()}", ":material/hub:", {order})\n')
    (tmp_path / "notes.py").write_text("x = 1\n")
    assert [p.stem for p in existing_pages(tmp_path)] == ["models", "merge", "runs"]
    assert existing_pages(tmp_path)[0].title == "Models"

# ---------------------------------------------------------------- the pool adapter


def _pool_script():
    import streamlit as st

    from forgetlab.ui.pool import get_pool

    pool = get_pool()
    if pool is not None:
        st.write(f"models {','.join(pool.model_names)}")
        st.session_state.setdefault("pool_ids", []).append(id(pool))
    st.write("end of page")


def _copy_pool(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst / "pool.yaml"


def test_get_pool_is_cached_and_reloads_when_the_file_changes(tiny_llama, tmp_path):
    import os

    pool_yaml = _copy_pool(tiny_llama.root, tmp_path / "pool")
    at = AppTest.from_function(_pool_script)
    at.session_state["forgetlab_pool_path"] = str(pool_yaml)
    at.run(timeout=60)
    assert not at.exception and not at.error
    assert at.markdown[0].value == "models ft0,ft1"
    at.run(timeout=60)
    ids = at.session_state["pool_ids"]
    assert ids[0] == ids[1]                                  # a rerun never rebuilds the pool
    text = pool_yaml.read_text().replace("  ft1: ft1\n", "")
    pool_yaml.write_text(text)
    st_ = pool_yaml.stat()
    os.utime(pool_yaml, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
    at.run(timeout=60)
    assert at.markdown[0].value == "models ft0"               # the edited file was read again
    assert at.session_state["pool_ids"][-1] != ids[0]


def test_malformed_pool_file_is_a_message_and_the_page_goes_on(tmp_path):
    bad = tmp_path / "pool.yaml"
    bad.write_text("base: [unclosed\n  models: {")
    at = AppTest.from_function(_pool_script)
    at.session_state["forgetlab_pool_path"] = str(bad)
    at.run(timeout=60)
    assert not at.exception
    assert len(at.error) == 1 and str(bad) in at.error[0].value and "YAML" in at.error[0].value
    assert at.markdown[-1].value == "end of page"
    bad.write_text("models: {}\n")                            # valid YAML, no base
    at.run(timeout=60)
    assert "base" in at.error[0].value and at.markdown[-1].value == "end of page"
    at.session_state["forgetlab_pool_path"] = str(tmp_path / "nope.yaml")
    at.run(timeout=60)
    assert "does not exist" in at.error[0].value


def test_model_deleted_from_disk_while_held_is_reported(tiny_llama, tmp_path):
    import shutil

    pool_yaml = _copy_pool(tiny_llama.root, tmp_path / "pool")
    at = AppTest.from_function(_pool_script)
    at.session_state["forgetlab_pool_path"] = str(pool_yaml)
    at.run(timeout=60)
    assert at.markdown[0].value == "models ft0,ft1"
    shutil.rmtree(tmp_path / "pool" / "ft1")
    at.run(timeout=60)
    assert not at.exception
    assert len(at.error) == 1 and "ft1" in at.error[0].value and "removed from disk" in at.error[0].value
    assert at.markdown[-1].value == "end of page"
    at.run(timeout=60)                                        # the stale pool was dropped: the file is re-read
    assert not at.exception and "ft1" in at.error[0].value
    assert (tmp_path / "pool" / "pool.yaml").exists() and (tmp_path / "pool" / "ft0").exists()


def test_no_pool_chosen_is_an_info_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    monkeypatch.delenv("FORGETLAB_POOL", raising=False)
    at = AppTest.from_function(_pool_script).run(timeout=60)
    assert not at.exception and not at.error
    assert "No model pool" in at.info[0].value

# ---------------------------------------------------------------- jobs across sessions


def _merge_like_script():
    import threading
    import time

    import streamlit as st

    from forgetlab.ui.jobs import job_key, run_once
    from forgetlab.ui.jobs import REGISTRY

    out = st.session_state["out"]
    gate = REGISTRY.__dict__.setdefault("_test_gates", {}).setdefault(out, threading.Event())

    def merge(progress):
        from pathlib import Path

        progress(0.1, "tensors")
        assert gate.wait(20)
        Path(out).mkdir()                     # a second copy would fail here: the output exists
        (Path(out) / "model.safetensors").write_text("x")
        return out

    clicked = st.button("Run merge")
    result = run_once(job_key("merge", out), merge, start=clicked, label="Merge")
    if result:
        st.success(f"saved {result}")
    st.write(f"t={time.time()}")


def test_two_sessions_same_merge_same_output_run_once_and_reload_reattaches(tmp_path):
    from forgetlab.ui.jobs import REGISTRY, job_key

    out = str(tmp_path / "merged")
    a, b = AppTest.from_function(_merge_like_script), AppTest.from_function(_merge_like_script)
    for at in (a, b):
        at.session_state["out"] = out
        at.run(timeout=30)
    a.button[0].click().run(timeout=30)
    job = REGISTRY.get(job_key("merge", out))
    assert job is not None and job.running
    b.button[0].click().run(timeout=30)                      # the other session clicks too
    assert REGISTRY.get(job_key("merge", out)) is job
    assert "already running" in b.info[0].value
    reloaded = AppTest.from_function(_merge_like_script)     # a page reload = a fresh session
    reloaded.session_state["out"] = out
    reloaded.run(timeout=30)
    assert not reloaded.exception and len(reloaded.get("progress")) == 1
    REGISTRY._test_gates[out].set()
    assert job.wait(20) and job.status == "done", job.traceback
    for at in (a, b, reloaded):
        at.run(timeout=30)
        assert not at.exception and not at.error
        assert at.success[0].value == f"saved {out}"
    assert sorted(p.name for p in (tmp_path / "merged").iterdir()) == ["model.safetensors"]

# ---------------------------------------------------------------- app.py: sidebar and first run

APP = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "app.py")


def _app(home, monkeypatch) -> AppTest:
    """app.py in a copy of the app tree holding only the Runs page (the area pages have their own tests)."""
    import shutil
    from pathlib import Path

    monkeypatch.setenv("FORGETLAB_HOME", str(home))
    monkeypatch.delenv("FORGETLAB_POOL", raising=False)
    tree = Path(home) / ".app"
    (tree / "pages").mkdir(parents=True)
    shutil.copy(APP, tree / "app.py")
    shutil.copy(Path(APP).parent / "pages" / "runs.py", tree / "pages" / "runs.py")
    _serve_as_after_navigation(monkeypatch)
    return AppTest.from_file(str(tree / "app.py"), default_timeout=60)


def _serve_as_after_navigation(monkeypatch) -> None:
    """Run every AppTest script through app.py, as a server does once app.py's st.navigation has run.

    AppTest forgets that before each run (it resets PagesManager.uses_pages_directory, which is then True
    because pages/ exists), so from the second run on it executed the page file alone (Streamlit's pre-
    st.navigation way); require_app() then reran through app.py, and the rerun dropped any button click.
    """
    from streamlit.runtime.pages_manager import PagesManager

    original = PagesManager.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    monkeypatch.setattr(PagesManager, "__init__", init)


def test_app_with_an_empty_workspace_offers_the_demo_zoo(tmp_path, monkeypatch):
    at = _app(tmp_path, monkeypatch).run()
    assert not at.exception and not at.error
    assert at.sidebar.text_input(key="app_workspace").value == str(tmp_path)
    assert at.sidebar.selectbox(key="app_pool_choice").options == ["Your own pool.yaml…"]
    assert at.subheader[0].value == "Welcome to forgetlab"
    assert at.title[0].value == "Runs"                        # the page still renders below the offer


def test_app_sidebar_picks_zoo_presets_and_own_pool_files(tiny_llama, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(tiny_llama.root, tmp_path / "zoo" / "pico")
    own = _copy_pool(tiny_llama.root, tmp_path / "mine")
    at = _app(tmp_path, monkeypatch).run()
    assert not at.exception and not at.error
    choice = at.sidebar.selectbox(key="app_pool_choice")
    assert choice.options == ["pico", "Your own pool.yaml…"] and choice.value == "pico"
    assert at.session_state["forgetlab_pool_path"] == str(tmp_path / "zoo" / "pico" / "pool.yaml")
    assert not any(s.value == "Welcome to forgetlab" for s in at.subheader)
    choice.set_value("Your own pool.yaml…").run()
    assert at.session_state["forgetlab_pool_path"] == ""     # explicit "no pool" until a path is given
    assert at.subheader[0].value == "Welcome to forgetlab"
    at.sidebar.text_input(key="app_pool_own").input(str(own)).run()
    assert at.session_state["forgetlab_pool_path"] == str(own)
    assert not at.exception and not any(s.value == "Welcome to forgetlab" for s in at.subheader)
    assert [s.options for s in at.sidebar.selectbox if s.key == "app_device"] == [
        ["cpu", "cuda"] if __import__("torch").cuda.is_available() else ["cpu"]]


def test_first_run_builds_the_zoo_in_the_background_and_opens_it(tiny_llama, tmp_path, monkeypatch):
    import shutil
    import threading

    from forgetlab.ui import sidebar
    from forgetlab.ui.jobs import REGISTRY

    gate, calls = threading.Event(), []

    def fake_build(preset="pico", size="default", home=None, force=False, progress=None):
        calls.append((preset, size, str(home)))
        progress(0.2, "pretraining")
        assert gate.wait(20)
        root = shutil.copytree(tiny_llama.root, tmp_path / "zoo" / f"{preset}-{size}")
        return type("ZooBuild", (), {"pool_yaml": root / "pool.yaml", "root": root})()

    monkeypatch.setattr(sidebar, "build", fake_build)    # where the sidebar's button calls it
    at = _app(tmp_path, monkeypatch).run()
    assert at.selectbox(key="app_zoo_size").value == "default"
    at.selectbox(key="app_zoo_size").set_value("tiny")
    at.button(key="app_zoo_build").click().run()
    assert len(at.get("progress")) == 1 and not at.exception
    for _ in range(100):                                     # the job thread first picks its torch threads
        if calls:
            break
        time.sleep(0.1)
    at.button(key="app_zoo_build").click().run()            # impatient second click: still one build
    assert len(calls) == 1 and "already running" in at.info[0].value
    gate.set()
    for _ in range(50):
        if not any(j.running for j in REGISTRY.jobs() if j.key.startswith("zoo-build")):
            break
        time.sleep(0.1)
    at.run()
    assert not at.exception and not at.error
    assert calls == [("pico", "tiny", str(tmp_path))]
    assert at.session_state["forgetlab_pool_path"] == str(tmp_path / "zoo" / "pico-tiny" / "pool.yaml")
    at.run()
    assert at.sidebar.selectbox(key="app_pool_choice").value == "pico-tiny"
    assert not any(s.value == "Welcome to forgetlab" for s in at.subheader)


def test_empty_workspace_builds_the_demo_zoo_by_itself(tiny_llama, tmp_path, monkeypatch):
    """No pool anywhere: the app starts the pico default build at once (no click), shows its stage on the page,
    a second browser session attaches to the same build, and the zoo opens when its pool.yaml appears."""
    import shutil
    import threading

    from forgetlab.ui import zoo_build
    from forgetlab.ui.jobs import REGISTRY

    import json
    from pathlib import Path

    monkeypatch.setenv("FORGETLAB_AUTO_ZOO", "1")
    gate, reported, calls = threading.Event(), threading.Event(), []

    from forgetlab.zoo.watch import PretrainingSnapshot, ProbeAnswer

    def fake_build(preset="pico", size="default", home=None, force=False, progress=None, on_snapshot=None):
        calls.append((preset, size, str(home)))
        progress(0.3, "base: step 300/1000, loss 3.2")
        for step in (0, 300):
            on_snapshot(PretrainingSnapshot(step, 1000, 5.0 - step / 300, (
                ProbeAnswer("math", "Compute: 47+8=", "55", ", the", "Compute: 47+8 =", " 55" if step else " 4"),
                ProbeAnswer("code", ">>> max('a', 'b')\n", "b", "a", ">>> max('a', 'b')\n", "a\n>>>"))))
        reported.set()
        assert gate.wait(20)
        root = shutil.copytree(tiny_llama.root, Path(home) / "zoo" / "pico")
        steps = {n: {"done": True} for n in ("data", "base", "ft-math")}
        (root / "manifest.json").write_text(json.dumps({"steps": steps, "complete": True}))
        return type("ZooBuild", (), {"pool_yaml": root / "pool.yaml", "root": root})()

    monkeypatch.setattr(zoo_build, "build", fake_build)    # where the app calls it
    at = _app(tmp_path, monkeypatch).run()
    assert not at.exception and not at.error
    assert reported.wait(20)          # the build thread has reported its stage: the next rerun shows it
    at.run()
    shown = " ".join(m.value for m in at.markdown)
    assert "Building the demo zoo" in shown and "pre-training the base model (step 300/1000" in shown, shown
    assert len(at.get("progress")) >= 1
    # the base learning, while nothing is ready: the latest snapshot's answers and the curve so far
    assert "the base model is learning** — step 300 of 1000. It knows **1 of 2**" in shown, shown
    table = at.table[0].value
    assert list(table["task"]) == ["math", "code"]
    assert list(table["then the base writes"]) == ["' 55'  ✓", "'a'  ✗"]
    # st.table renders Markdown: a code prompt's `>>>` is escaped, or it would show as three nested quotes
    assert list(table["prompt → right answer"]) == ["Compute: 47+8= → 55", "\\>\\>\\> max('a', 'b') → b"]
    assert len(at.get("plotly_chart")) == 1
    assert "being built now" in " ".join(c.value for c in at.caption)
    second = _app(tmp_path / "other-tree", monkeypatch)     # another browser session, same workspace
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    second.run()
    assert calls == [("pico", "default", str(tmp_path))]    # attached, not a second build
    gate.set()
    for _ in range(100):
        if not any(j.running for j in REGISTRY.jobs() if j.key.startswith("zoo-build")):
            break
        time.sleep(0.1)
    at.run()
    assert not at.exception and not at.error
    assert at.session_state["forgetlab_pool_path"] == str(tmp_path / "zoo" / "pico" / "pool.yaml")
    assert not any(s.value == "Welcome to forgetlab" for s in at.subheader)
    assert not any("Building the demo zoo" in m.value for m in at.markdown)
    assert calls == [("pico", "default", str(tmp_path))]    # complete: never started again


def test_two_sessions_merging_into_the_same_output_one_wins_nothing_is_half_written(tiny_llama, tmp_path,
                                                                                   monkeypatch):
    """What the Merge page runs, from two sessions at once: one merge is saved whole, the other is refused."""
    import threading

    from forgetlab.core.errors import ForgetlabError
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.workflow import merge_into_workspace, pool_recipe

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    barrier, outcomes = threading.Barrier(2), []

    def session():
        recipe = pool_recipe(pool, "ties", ["ft0", "ft1"])
        barrier.wait()
        try:
            outcomes.append(merge_into_workspace(recipe, "same-output", pool=pool))
        except ForgetlabError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=session) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    saved = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(saved) == 1 and len(refused) == 1, outcomes
    assert "same-output" in str(refused[0])
    merges = tmp_path / "merges"
    assert [p.name for p in merges.iterdir()] == ["same-output"]   # no temporary folder left behind
    assert (merges / "same-output" / "recipe.yaml").exists()
    assert list((merges / "same-output").glob("*.safetensors"))


def test_changing_the_workspace_in_the_sidebar_lists_its_zoo(tiny_llama, tmp_path, monkeypatch):
    import os
    import shutil

    other = tmp_path / "other-home"
    shutil.copytree(tiny_llama.root, other / "zoo" / "pico")
    at = _app(tmp_path / "home", monkeypatch).run()
    assert at.sidebar.selectbox(key="app_pool_choice").options == ["Your own pool.yaml…"]
    at.sidebar.text_input(key="app_workspace").input(str(other)).run()
    assert not at.exception
    assert at.sidebar.selectbox(key="app_pool_choice").value == "pico"
    assert at.session_state["forgetlab_pool_path"] == str(other / "zoo" / "pico" / "pool.yaml")
    # the choice belongs to this browser session: the process and a second session keep the default
    assert os.environ["FORGETLAB_HOME"] == str(tmp_path / "home")
    second = AppTest.from_file(str(tmp_path / "home" / ".app" / "app.py"), default_timeout=60).run()
    assert second.sidebar.text_input(key="app_workspace").value == str(tmp_path / "home")
    assert second.sidebar.selectbox(key="app_pool_choice").options == ["Your own pool.yaml…"]
    at.run()                                          # and the first session keeps its own on every rerun
    assert at.sidebar.text_input(key="app_workspace").value == str(other)
    assert at.session_state["forgetlab_pool_path"] == str(other / "zoo" / "pico" / "pool.yaml")


def test_freeze_long_lived_freezes_after_new_imports_only(monkeypatch):
    import gc
    import sys

    import forgetlab.ui.heap as heap

    monkeypatch.setattr(heap, "_modules_at_freeze", 0)
    frozen_before = gc.get_freeze_count()
    try:
        assert heap.freeze_long_lived() is True                   # everything imported so far
        assert gc.get_freeze_count() > frozen_before
        assert heap.freeze_long_lived() is False                  # nothing new: a length check, no collection
        monkeypatch.setattr(heap, "_modules_at_freeze", len(sys.modules) - heap.MIN_NEW_MODULES)
        assert heap.freeze_long_lived() is True                   # ten new modules: frozen again
    finally:
        gc.unfreeze()
