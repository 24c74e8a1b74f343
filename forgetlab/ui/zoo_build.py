"""The demo zoo built in the background while the app is already up.

On a fresh workspace there is no pool at all: the app starts the pico default build at once (one build per
workspace, shared by every browser session, `forgetlab.ui.jobs.REGISTRY`) and resumes an interrupted one. The
build writes pool.yaml after every finished model (`forgetlab.zoo.build`), so the sidebar offers the zoo as soon
as its base exists and each fine-tune joins it the moment it is saved. Every page shows a banner with the
build's stage, progress and an estimate of the time left, and reruns the app when a new model is ready (a few
times per build); the banner's poll stops when the build ends, so an idle server stays idle. Until the base is
saved (the longest step), the banner shows the base learning (`forgetlab.zoo.watch`): its held-out loss and
what it answers to a few held-out prompts of each task, in the task's format and in the pre-training text's.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from forgetlab.plots.zoo import pretraining_figure
from forgetlab.ui.errors import render_error
from forgetlab.ui.jobs import REGISTRY, Job, job_key
from forgetlab.zoo import build
from forgetlab.zoo.build import zoo_root
from forgetlab.zoo.manifest import done_steps, read_manifest

PRESET, SIZE = "pico", "default"
POLL_SECONDS = 2.0
READY_KEY = "zoo_build_ready_models"
LEARNING_KEY = "zoo_build_learning_version"   # the snapshot count the page last drew


def build_key(home: Path) -> str:
    """The job key of the demo zoo build of workspace `home`."""
    return job_key("zoo-build", str(home), PRESET, SIZE)


def zoo_state(home: Path) -> tuple[Path, dict | None]:
    """(the pico zoo's folder in `home`, its manifest or None)."""
    root = zoo_root(PRESET, SIZE, home)
    return root, read_manifest(root) if root.is_dir() else None


def auto_build_enabled() -> bool:
    """False when FORGETLAB_AUTO_ZOO=0 (the app then only offers the build as a button)."""
    return os.environ.get("FORGETLAB_AUTO_ZOO", "1").strip() not in ("0", "false", "no")


def needs_build(home: Path, has_pool: bool) -> bool:
    """Whether the app should build the demo zoo now: no pool anywhere (and no FORGETLAB_POOL), or the
    workspace's pico zoo was started and not finished (an interrupted build resumes)."""
    if os.environ.get("FORGETLAB_POOL") or not auto_build_enabled():
        return False
    root, manifest = zoo_state(home)
    if manifest is not None and not manifest.get("complete"):
        return True
    return not has_pool and manifest is None


def start_build(home: Path) -> Job:
    """Start (or attach to) the background build of the pico default zoo in `home`."""
    def work(progress):
        snapshots: list = []

        def on_snapshot(snapshot) -> None:
            snapshots.append(snapshot)
            progress.publish(list(snapshots))

        return build(preset=PRESET, size=SIZE, home=home, progress=progress, on_snapshot=on_snapshot)

    job, _ = REGISTRY.start(build_key(home), work, label="Building the demo zoo", restart=False)
    return job


def ready_models(home: Path) -> list[str]:
    """The models of the zoo's manifest whose step is done, in build order (base first)."""
    _, manifest = zoo_state(home)
    done = done_steps(manifest) if manifest else set()
    order = (manifest or {}).get("steps") or {}
    return [n for n in order if n in done and n != "data"]


def eta_text(job: Job) -> str:
    """"about N min left", from the time spent so far and the fraction done (blank early on)."""
    spent = time.time() - job.started
    if job.fraction < 0.03 or spent < 10:
        return ""
    left = spent * (1.0 - job.fraction) / job.fraction
    return f" · about {max(1, round(left / 60))} min left" if left >= 60 else f" · about {int(left)} s left"


def describe(message: str) -> str:
    """The build's progress message in words a visitor understands."""
    step, _, rest = message.partition(":")
    names = {"data": "preparing the data", "base": "pre-training the base model",
             "claims": "measuring what the zoo shows"}
    if step.startswith("ft-"):
        what = f"fine-tuning on {step[3:]}"
    elif step.startswith("lora-"):
        what = f"training the {step[5:]} LoRA adapter"
    else:
        what = names.get(step, step)
    return f"{what} ({rest.strip()})" if rest.strip() else what


def render_build_banner(home: Path, has_pool: bool) -> None:
    """Start the demo zoo build when the workspace needs one, and show its progress on every page."""
    job = REGISTRY.get(build_key(home))
    if (job is None or not job.running) and needs_build(home, has_pool):
        if job is not None and job.status != "done":
            if job.error is not None:  # a failed build is shown, not restarted in a loop
                render_error(job.error, job.traceback)
                return
        job = start_build(home)
    if job is None or not job.running:
        return
    st.session_state.setdefault(READY_KEY, ready_models(home))

    @st.fragment(run_every=POLL_SECONDS)
    def _banner() -> None:
        if not job.running:
            st.rerun(scope="app")
        ready = ready_models(home)
        if ready != st.session_state.get(READY_KEY):
            st.session_state[READY_KEY] = ready
            st.rerun(scope="app")
        if not ready and job.version != st.session_state.get(LEARNING_KEY):
            # a new snapshot of the base: redraw the page once (the panel is drawn outside this poll, so its
            # table and chart are sent once per snapshot, not every 2 s: redrawing them every 10 s in a
            # fragment of their own made the pre-training 10 % slower in the walk)
            st.rerun(scope="app")
        with st.container(border=True):
            st.markdown(f"**Building the demo zoo** — {describe(job.message)}{eta_text(job)}")
            st.progress(job.fraction)
            st.caption("Ready: " + (", ".join(ready) if ready else "nothing yet") + ". Each model joins the "
                       "pool in the sidebar as soon as it is saved; the pages work on the models that are ready.")

    st.session_state[LEARNING_KEY] = job.version     # before the poll's first run, which compares with it
    _banner()
    if job.partial and not st.session_state.get(READY_KEY):
        with st.container(border=True):
            render_pretraining(job.partial, job.version)


FIGURE_KEY = "zoo_build_pretraining_figure"


def render_pretraining(snapshots: list, version: int, *, live: bool = True) -> None:
    """The base while it pre-trains (`live`), or after: what it answers to one held-out prompt per task, asked
    in the task's format and in the pre-training text's form, and its held-out loss with the counts of watched
    facts it knows and answers, over the steps so far (the figure is rebuilt only when `version` changes)."""
    last = snapshots[-1]
    counts = (f"**{last.known} of {len(last.answers)}** watched facts in the form the pre-training text states "
              f"them, and answers **{last.correct}** in the tasks' own format")
    if live:
        st.markdown(f"**Meanwhile, the base model is learning** — step {last.step} of {last.steps}. It knows "
                    f"{counts}.")
    else:
        st.markdown(f"At the end of its pre-training (step {last.step}) the base knew {counts}.")
    frame = last.to_frame().drop_duplicates("task")
    # st.table, not st.dataframe: the model outputs wrap, so no column is cut off at the right edge
    st.table(pd.DataFrame({
        "task": frame["task"],
        "prompt → right answer": (frame["prompt"].str.strip() + " → " + frame["answer"]).map(_literal),
        "in the task's format, the base writes": frame["said"].map(_shown) + frame["correct"].map(_mark),
        "as the pre-training text puts it": frame["form_prompt"].str.strip().map(_literal),
        "then the base writes": frame["form_said"].str.split("\n").str[0].map(_shown) + frame["knows"].map(_mark),
    }), hide_index=True)
    left, right = st.columns([2, 3], vertical_alignment="center")
    left.caption("Prompts from each task's evaluation split, which the pre-training text never holds. That text "
                 "states the tasks' facts in its own form, never in the task's format, so the base learns the "
                 "content but not the format; each fine-tune then teaches its task's format, and the pages "
                 "measure what that lesson costs on general text.")
    with right:
        if not live:
            st.plotly_chart(pretraining_figure(snapshots), key="zoo_pretraining_record_fig")
            return
        cached = st.session_state.get(FIGURE_KEY)
        if cached is None or cached[0] != version:
            cached = (version, pretraining_figure(snapshots))
            st.session_state[FIGURE_KEY] = cached
        st.plotly_chart(cached[1], key="zoo_build_pretraining_fig")


def _mark(right: bool) -> str:
    return "  ✓" if right else "  ✗"


def _shown(text: str) -> str:
    """A model's output for a table cell: quoted, with newlines made visible, "(nothing)" when empty."""
    return _literal(repr(text)) if text.strip() else "(nothing)"


_MARKDOWN = re.compile(r"([\\`*_\[\]<>#|~])")


def _literal(text: str) -> str:
    """`text` with Markdown's marks escaped: st.table renders its cells as Markdown, which made a code prompt's
    `>>>` three nested quotes."""
    return _MARKDOWN.sub(r"\\\1", text)
