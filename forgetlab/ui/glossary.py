"""The app's words, explained once: one line per term, used by the tooltips and captions of every page and by
the Glossary page (pages/glossary.py). The formulas themselves live in docs/methods.md (the `anchor` of each
term); this module holds only the plain-language line a stranger needs to read a chart.

Pure data and string helpers: it imports neither streamlit nor torch, so a page or a test can use it freely.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """One glossary entry: how the app writes it, what it means in one line, where its formula is."""

    name: str
    meaning: str
    anchor: str = ""          # docs/methods.md#<anchor>; empty for words that have no formula


# key → Term. The keys are what code passes to `explain`; `name` is how the app writes the term.
TERMS: dict[str, Term] = {
    "tau": Term("τ (task vector)", "What fine-tuning changed: the fine-tuned weights minus the base's, "
                "τ = θ1 − θ0. Merges and sweeps add scaled, pruned or combined task vectors back to the base.",
                "notation"),
    "distance": Term("D(θ, θ0)", "How far a model moved from its base: the size of each weight tensor's change "
                     "relative to that tensor (‖θ − θ0‖ / ‖θ0‖), averaged over tensors. 0.01 = weights moved "
                     "1 % on average.", "distance"),
    "speciality": Term("speciality", "How well a model does the task it was fine-tuned for: exact match (share "
                       "of answers right, ↑) or answer loss (↓) on the task's held-out pairs.", "speciality"),
    "generality": Term("generality", "How well a model still models ordinary text: its loss on held-out "
                       "Wikipedia-like text it never trained on (general loss, ↓).", "generality"),
    "general_loss": Term("general loss", "Mean next-token cross-entropy, in nats, on held-out general text "
                         "(↓ better); perplexity is its exponential.", "held-out-loss"),
    "forgetting": Term("forgetting", "How much worse a model got at general text than its base: general loss "
                       "minus the base's (positive = it forgot).", "forgetting"),
    "exact_match": Term("exact match", "Share of task pairs whose whole answer (and the stop token) the model "
                        "predicts token for token (↑ better).", "exact-match"),
    "answer_loss": Term("answer loss", "Mean cross-entropy of the correct answer's tokens (↓ better); moves "
                        "smoothly where exact match jumps in steps.", "answer-loss"),
    "pareto": Term("Pareto front", "The settings that no other setting beats on both speciality and "
                   "generality at once; every other point is worse on at least one without being better on "
                   "the other.", "pareto-front"),
    "wise_ft": Term("WiSE-FT", "Interpolate between base and fine-tune: θ0 + α·τ. α = 0 is the base, α = 1 the "
                    "fine-tune; in between trades speciality for generality.", "wise_ft"),
    "alpha": Term("α", "How much of the task vector is added back: 0 = the base, 1 = the whole fine-tune.",
                  "wise_ft"),
    "hma": Term("HMA", "Heterogeneous model averaging: WiSE-FT with its own α for each block of layers "
                "(early, middle, late).", "hma"),
    "fapm": Term("FAPM", "Forgetting-aware pruning: zero the task vector's entries that change the base the most "
                 "relative to its size, keep the rest.", "fapm"),
    "task_arithmetic": Term("task arithmetic", "Add the task vectors of several fine-tunes to the base, scaled "
                            "by λ: θ0 + λ·Σ τt.", "task_arithmetic"),
    "ties": Term("TIES", "Merge task vectors after keeping only each one's largest entries and, per weight, the "
                 "sign most of them agree on.", "ties"),
    "dare": Term("DARE", "Drop a random share of each task vector's entries and rescale the rest, then add them "
                 "up.", "dare"),
    "pcb": Term("PCB", "Parameter competition balancing: weight each task vector's entries by how much they "
                "matter to their own task and to the others, keep the top ones.", "pcb"),
    "nls": Term("NLS", "Non-linearity score: how far a submodule's output strays from a straight line as its "
                "weights move from base to fine-tune (0 = perfectly linear).", "nls"),
    "d_alpha": Term("d(α)", "Distance of a submodule's output at α from its fine-tuned output, relative to the "
                    "base's; a linear submodule follows 1 − α.", "distance-curve"),
    "residual": Term("Property 1 residual", "How far a submodule's output at α is from the straight line "
                     "between its base and fine-tuned outputs, relative to their distance (0 = on the line).",
                     "property-1"),
    "submodule": Term("submodule", "A part of the network scored on its own: a decoder layer, its attention, "
                      "its MLP or one attention head.", "submodule-levels"),
    "adamw": Term("AdamW", "The standard optimizer: every weight moves at every step."),
    "mofo": Term("MoFO", "Momentum-filtered optimizer: at each step only the share `fraction` of each tensor's "
                 "entries with the largest momentum move, so the model stays closer to its start.", "mofo"),
    "sfa": Term("SFA", "Soup to go: during fine-tuning, every share p of the steps, average the weights with "
                "the starting weights (β = weight of the start).", "sfa"),
    "l2": Term("L2-to-init", "Fine-tune with a penalty (λ/2)·‖θ − θ0‖² that pulls every weight back towards "
               "its starting value, harder the further it moved.", "l2-to-init"),
    "l1": Term("L1-to-init", "Fine-tune with a penalty λ·‖θ − θ0‖₁: the same pull λ on every moved weight, "
               "however far it moved.", "l1-to-init"),
    "tsne": Term("t-SNE", "A 2-D map that keeps points that are close in the features close on the page; "
                 "distances between far clusters are only indicative.", "tsne-features"),
    "lora": Term("LoRA adapter", "A fine-tune stored as a small low-rank update of the base's weights "
                 "(ΔW = scale·B·A) instead of a full copy.", "lora-task-vectors"),
}

# what a page's control covers, in the order the tooltip lists the terms
GROUPS: dict[str, tuple[str, ...]] = {
    "sweeps": ("wise_ft", "fapm", "dare", "ties", "hma"),
    "tradeoff": ("speciality", "generality", "pareto"),
    "finetune": ("adamw", "mofo", "sfa", "l2", "l1", "distance"),
    "merge": ("task_arithmetic", "ties", "dare", "pcb", "wise_ft", "hma", "fapm"),
    "linearity": ("nls", "d_alpha", "residual", "distance"),
}


def term(key: str) -> Term:
    """The glossary entry of `key` (a KeyError names the known keys: a typo in a page must fail its test)."""
    try:
        return TERMS[key]
    except KeyError:
        raise KeyError(f"no glossary term {key!r}; known: {', '.join(sorted(TERMS))}") from None


def explain(*keys: str) -> str:
    """One line per term, "**name**: meaning", for a widget's `help=` or a caption (Markdown)."""
    return "  \n".join(f"**{term(k).name}**: {term(k).meaning}" for k in keys)


def explain_group(group: str) -> str:
    """`explain` over the terms of one of GROUPS (e.g. "sweeps": WiSE-FT, FAPM, DARE, TIES, HMA)."""
    return explain(*GROUPS[group])


def glossary_rows(query: str = "") -> list[dict[str, str]]:
    """The glossary as rows {term, meaning, formula}, sorted by term (case-insensitive), keeping those whose
    term or meaning contains `query` (case-insensitive; empty keeps all)."""
    q = query.strip().lower()
    rows = [{"term": t.name, "meaning": t.meaning,
             "formula": f"docs/methods.md#{t.anchor}" if t.anchor else ""}
            for t in TERMS.values() if not q or q in t.name.lower() or q in t.meaning.lower()]
    return sorted(rows, key=lambda r: r["term"].lower().lstrip("τ(").strip())
