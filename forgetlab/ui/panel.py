"""One panel draws any analysis (forgetlab.analysis.base.Analysis) in the app: the memory line and the main
button under the page's settings, then the run with its progress and Cancel, the result, its saving to the
workspace's runs/, and the saved runs of the analysis to reopen.

A page builds its settings from its widgets (forgetlab.ui.widgets draws them from the settings' declarations) and
calls the panel twice — `controls` under the widgets, `results` where the result goes:

    panel = AnalysisPanel(ANALYSES.get("linearity"), page="linearity", button="Compute scores")
    with left:
        settings = …                              # the page's widgets
        start = panel.controls(pool, settings)
    with right:
        result = panel.results(pool, settings, start=start, show=draw)   # draw(result) adds the page's own charts

The job runs once per (pool, workspace, settings) in the background (forgetlab.ui.jobs.run_once): a second
click attaches to it, a page switch or reload finds it again, Cancel stops it at its next progress report.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Optional

import streamlit as st

from forgetlab.analysis.base import Analysis, pool_source
from forgetlab.core.errors import ForgetlabError
from forgetlab.core.workspace import SavedRun
from forgetlab.ui.errors import show_errors
from forgetlab.ui.executor import session_executor
from forgetlab.ui.jobs import job_key, run_once
from forgetlab.ui.memory import show_estimate
from forgetlab.ui.page import show_takeaway
from forgetlab.ui.settings import workspace_home
from forgetlab.ui.tables import show_table


@st.cache_resource
def _results() -> dict:
    """Finished results by job key, shared by every browser session of this server process."""
    return {}


class AnalysisPanel:
    """The app's one way of running an analysis (module docstring). `page` names the page's state and job slot;
    `button` is the main button's label; `label(settings)` says what a running job computes; `executor(settings)`
    picks where a job runs (default: the session's executor, `forgetlab.ui.executor.session_executor`)."""

    def __init__(self, analysis: Analysis, *, page: str, button: str,
                 label: Optional[Callable[[Any], str]] = None, executor: Optional[Callable[[Any], Any]] = None):
        self.analysis, self.page, self.button = analysis, page, button
        self.label = label or (lambda settings: analysis.title[:1].upper() + analysis.title[1:])
        self.executor = executor or (lambda settings: session_executor())

    @property
    def result_key(self) -> str:
        return f"{self.page}_result"

    def key(self, pool, settings: Any) -> str:
        """The job key: everything the result depends on."""
        return job_key(self.page, pool.key, str(workspace_home()), asdict(settings))

    def controls(self, pool, settings: Any, *, disabled: bool = False, press: bool = False,
                 help: Optional[str] = None) -> bool:
        """The memory line and the main button (disabled when the estimate does not fit; `help` its tooltip);
        True when pressed — or with `press` (another page asked for the run) when the estimate fits — and the
        settings pass the analysis' checks (a refusal is shown, and nothing starts)."""
        fits = True
        try:
            estimate = self.analysis.estimate(pool, settings)
        except ForgetlabError:
            estimate = None           # the run's own checks will say what is wrong
        if estimate is not None:
            fits = show_estimate(estimate)
        pressed = st.button(self.button, type="primary", key=f"{self.page}_run", disabled=disabled or not fits,
                            help=help)
        pressed = pressed or (press and fits and not disabled)
        if not pressed:
            return False
        with show_errors():
            self.analysis.check(settings, pool)
            return True
        return False

    def _work(self, pool, settings: Any, key: str, on_point: Optional[Callable] = None):
        analysis, executor, cache = self.analysis, self.executor(settings), _results()

        def work(progress):
            """The result, kept for this process and saved under the workspace's runs/ as the CLI saves it."""
            result = analysis.run(pool, settings, progress, executor)
            cache[key] = result
            return result, analysis.save(result, pool=pool)

        return work

    def results(self, pool, settings: Any, *, start: bool, show: Optional[Callable[[Any], None]] = None,
                show_partial: Optional[Callable[[Any], None]] = None, empty: str = "",
                **saved_filters: Any) -> Any:
        """Run (when `start`) or find the job of these settings, then draw its takeaway (the analysis' sentences
        with their numbers, `forgetlab.ui.page.show_takeaway`) and its result with `show` (default: the
        analysis' figures and table): the result of these settings, else this session's last one (said so),
        else a saved run picked from the workspace's runs/ (`saved_filters` narrow the list, e.g. model=…).
        Returns the result drawn, or None."""
        key = self.key(pool, settings)

        def keep(done) -> None:
            st.session_state[self.result_key] = done[0]
            st.toast(f"Saved under {done[1]}")

        run_once(key, self._work(pool, settings, key), start=start, label=self.label(settings), slot=self.page,
                 on_done=keep, show_partial=show_partial)
        result = _results().get(key)
        if result is None and st.session_state.get(self.result_key) is not None:
            result = st.session_state[self.result_key]
            st.info(f"These settings are not computed yet; below is the last result computed on this page. Press "
                    f"**{self.button}** for the settings on the left.")
        if result is None:
            result = self.reopen(pool, **saved_filters)
        if result is None:
            st.info(empty or f"Choose the settings and press **{self.button}**.")
            return None
        show_takeaway(self.analysis.takeaway(result), key=f"{self.page}_takeaway")
        (show or self.show_default)(result)
        return result

    def reopen(self, pool, **filters: Any) -> Any:
        """A saved run of the analysis on this pool, picked in a select box (newest first), loaded; or None."""
        runs: list[SavedRun] = self.analysis.list(pool=pool_source(pool), **filters)
        if not runs:
            return None
        labels = {r.id: f"{r.id} · " + " · ".join(f"{k} {v}" for k, v in list(r.recipe.items())[:4]
                                                 if k not in ("pool", "kind", "created", "versions")
                                                 and not isinstance(v, (dict, list)))
                  for r in runs}
        chosen = st.selectbox(f"Saved {self.analysis.title} to reopen", list(labels), format_func=labels.get,
                              key=f"{self.page}_saved")
        with show_errors():
            return self.analysis.load(next(r.path for r in runs if r.id == chosen))
        return None

    def show_default(self, result: Any) -> None:
        """The analysis' figures, its table and the table as CSV."""
        for i, fig in enumerate(self.analysis.figures(result)):
            st.plotly_chart(fig, key=f"{self.page}_figure_{i}")
        frame = self.analysis.frame(result)
        show_table(frame, key=f"{self.page}_table")
        st.download_button("Download table (CSV)", frame.to_csv(index=False), mime="text/csv",
                           file_name=f"{self.analysis.name}.csv", key=f"{self.page}_csv", on_click="ignore")
