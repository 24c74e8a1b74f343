"""Task vectors: where in the network did fine-tuning move each model, and how alike are the moves?"""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis.taskvec import ANALYSIS, TaskvecSettings
from forgetlab.ui.page import start_page
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.widgets import field_widget

MENU = ("Task vectors", ":material/insights:", 15)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "Where in the network did fine-tuning change each model most, and did different fine-tunes "
                        "change the weights in similar directions?",
                        how="Task vector τ = θt − θ0. Per layer and module: ‖τ‖ / ‖θ0‖, the size of the change "
                            "relative to the base's weights. Between models: cos(τi, τj) = ⟨τi, τj⟩ / (‖τi‖·‖τj‖); "
                            "1 = the same direction, 0 = unrelated. Formula: docs/methods.md#taskvec-stats.",
                        needs="finetuned", purpose="task vectors")

panel = AnalysisPanel(ANALYSIS, page="taskvec", button="Measure the task vectors")
left, right = st.columns([1, 3])
with left:
    models = field_widget(TaskvecSettings, "models", key="taskvec_models", options=pool.model_names,
                          default=pool.model_names)
    cosines = field_widget(TaskvecSettings, "cosines", key="taskvec_cosines", label="compare them (cosines)")
    settings = TaskvecSettings(models=models or None, cosines=cosines)
    start = panel.controls(pool, settings)
with right:
    panel.results(pool, settings, start=start)
