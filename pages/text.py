"""Text: where does the forgetting show? Every token of a text scored under a model and its reference."""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis.textdiff import ANALYSIS, TextDiffSettings
from forgetlab.core.memory import dtype_name
from forgetlab.merge.workflow import saved_merges
from forgetlab.plots.textdiff import class_bars, legend_html, lens_figure, position_figure, shade_scale, token_html
from forgetlab.ui.errors import show_errors
from forgetlab.ui.glossary import explain
from forgetlab.ui.settings import budget_caption, device_settings, eval_budget
from forgetlab.ui.page import start_page
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.tables import show_table
from forgetlab.ui.textview import OPEN_RUN_KEY, REQUEST_KEY
from forgetlab.ui.widgets import field_info, field_widget

MENU = ("Text", ":material/text_fields:", 50)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "Where does the forgetting show? Every token of the held-out text (or your own) is scored "
                        "under the model and under its reference: red tokens are the ones the model got worse at "
                        "predicting. Hover a token for both models' top guesses.",
                        how="rise = log p_reference(token) − log p_model(token): the nats the model lost on that "
                            "token (positive: forgotten). KL(p_reference ‖ p_model) compares the whole next-token "
                            "distributions. On the held-out split the mean rise is the scorecards' general-loss "
                            "rise. Details: docs/textdiff.md.",
                        needs="pool")

panel = AnalysisPanel(ANALYSIS, page="text", button="Score the text", label=lambda s: f"Text diff of {s.model}")
MEASURE_LABELS = {"rise": "rise (nats lost)", "kl": "KL(reference ‖ model)"}

request = st.session_state.pop(REQUEST_KEY, None)      # from the Forgetting or Merge page: open and run it
if request:
    st.session_state["text_model"] = request["model"]
    st.session_state["text_use_alpha"] = request.get("alpha") is not None
    if request.get("alpha") is not None:
        st.session_state["text_alpha"] = float(request["alpha"])
    st.session_state["text_against"] = request.get("against", "base")
    st.session_state["text_source"] = "held-out split"
    st.session_state[panel.result_key] = None
opened = st.session_state.pop(OPEN_RUN_KEY, None)      # from the Runs page: a saved run to show
if opened:
    with show_errors():
        st.session_state[panel.result_key] = ANALYSIS.load(opened)

merges = []
with show_errors():
    merges = [m.name for m in saved_merges()]
choices = [*pool.model_names, *[m for m in merges if m not in pool.model_names]]
if not choices:
    st.info("The pool has no fine-tuned model and the workspace no merge to compare with the base. Add one to the "
            "pool file, or make one on the Fine-tune or Merge page.")
    st.stop()
if st.session_state.get("text_model") not in choices:
    st.session_state.pop("text_model", None)

device, dtype = device_settings()
left, right = st.columns([1, 2])
with left:
    model = field_widget(TextDiffSettings, "model", key="text_model", options=choices, label="model",
                         help="A fine-tuned model of the pool or a merge of the workspace.")
    swept = model in pool.model_names
    use_alpha = st.checkbox("a WiSE-FT point θ0 + α(θ1 − θ0) of it", False, key="text_use_alpha", disabled=not swept)
    alpha = st.slider("α", 0.0, 1.0, 0.5, 0.05, key="text_alpha", disabled=not (swept and use_alpha),
                      help=field_info(TextDiffSettings, "alpha").spec.help)
    alpha = float(alpha) if swept and use_alpha else None
    others = ["base", *[c for c in [*pool.model_names, *merges] if c != model]]
    if st.session_state.get("text_against") not in others:
        st.session_state["text_against"] = "base"
    against = field_widget(TextDiffSettings, "against", key="text_against", options=others,
                           label="against (the reference)")
    source = st.radio("text", ["held-out split", "my own text"], key="text_source", horizontal=True,
                      help="held-out: the scorecard's blocks, so the mean rise is the general-loss rise. Own text: "
                           "one document per line.")
    lines, max_general = None, None
    if source == "my own text":
        typed = st.text_area("text (one document per line)", "The river flows through the old town.\n",
                             key="text_lines", height=140)
        lines = tuple(typed.splitlines())
    else:
        max_general = eval_budget().max_general    # the app's one budget: the rise is the scorecards' rise
        budget_caption(note=": its held-out blocks are the text scored here")
    settings = TextDiffSettings(model=model, against=against, alpha=alpha, lines=lines, max_general=max_general,
                                device=device, dtype=dtype_name(dtype))
    start = panel.controls(pool, settings, press=bool(request))


def show(r) -> None:
    """The text shaded token by token, the contexts, the rise per class, the logit lens, the rise along the
    sequences, the tokens with the largest rise, and the tables to download."""
    s = r.summary()
    st.caption(f"**{r.model}** against **{r.against}** on {'the held-out split' if r.source == 'heldout' else r.source}"
               f" · {s['tokens']} tokens in {len(r.docs)} sequences, {r.seconds:.1f} s · loss {s['loss_base']:.4f} →"
               f" {s['loss_model']:.4f}: mean rise {s['mean_rise']:+.4f} nats, mean KL {s['mean_kl']:.4f} nats")
    for note in r.notes:
        st.warning(note)
    measure = st.radio("shade by", list(MEASURE_LABELS), format_func=MEASURE_LABELS.get, key="text_measure",
                       horizontal=True, help=explain("rise", "kl"))
    totals = r.scored().groupby("doc")[measure].sum()
    order = list(totals.sort_values(ascending=False).index) or [0]
    doc = st.selectbox("sequence (largest total first)", order, key=f"text_doc_{measure}",
                       format_func=lambda d: f"{r.docs[d]} · total {measure} {totals.get(d, 0.0):+.3f}")
    scale = shade_scale(r, measure)
    st.html(token_html(r, int(doc), measure, scale))
    st.html(legend_html(measure, scale))


def show_more(r) -> None:
    """Below both columns, by the measure the text is shaded by: where the loss went (contexts, classes, lens,
    positions, tokens) and the downloads."""
    measure = st.session_state.get("text_measure", "rise")
    st.subheader("Where the loss went")
    c1, c2 = st.columns(2)
    with c1:
        st.markdown(f"**Contexts with the largest {MEASURE_LABELS[measure]}** (8 tokens, the token in [brackets])")
        contexts = r.top_contexts(measure, 20)
        show_table(contexts[["where", "position", "context", "token_class", "rise", "kl", "top1_base", "top1_model"]],
                   key="text_contexts")
    with c2:
        bar = st.radio("per class", ["mean_rise", "total_rise", "share_of_rise", "mean_kl"], key="text_class_measure",
                       horizontal=True, format_func=lambda m: m.replace("_", " "), help=explain("token_class"))
        st.plotly_chart(class_bars(r, bar), key="text_classes")
    c3, c4 = st.columns(2)
    c3.plotly_chart(lens_figure(r), key="text_lens")
    c4.plotly_chart(position_figure(r), key="text_positions")
    st.markdown(f"**Tokens with the largest total {measure}** (seen at least twice)")
    show_table(r.top_tokens(measure, 20), key="text_tokens")
    d1, d2, d3, d4 = st.columns(4)
    stem = r.model.replace("@", "-").replace("=", "")
    d1.download_button("Tokens (CSV)", lambda: r.to_frame().to_csv(index=False), file_name=f"textdiff-{stem}.csv",
                       mime="text/csv", key="text_csv_tokens", on_click="ignore")
    d2.download_button("Contexts (CSV)", contexts.to_csv(index=False), file_name=f"textdiff-{stem}-contexts.csv",
                       mime="text/csv", key="text_csv_contexts", on_click="ignore")
    d3.download_button("Classes (CSV)", r.by_class().to_csv(index=False), file_name=f"textdiff-{stem}-classes.csv",
                       mime="text/csv", key="text_csv_classes", on_click="ignore")
    d4.download_button("Logit lens (CSV)", r.lens_frame().to_csv(index=False), file_name=f"textdiff-{stem}-lens.csv",
                       mime="text/csv", key="text_csv_lens", on_click="ignore")


with right:
    result = panel.results(pool, settings, start=start, show=show,
                           empty="Score a text (left) to see where the model lost probability, token by token.")
if result is not None:
    show_more(result)
