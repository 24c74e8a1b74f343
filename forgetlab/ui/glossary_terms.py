"""The glossary's hand-written entries: the words of the pages that no registry declares, one line each, in the
sections the Glossary page shows. Merge methods, their parameters and the analyses (sweep kinds included) are not
written here: forgetlab.ui.glossary makes their entries from their own declarations (the METHODS and ANALYSES
registries). Pure data: imports nothing of forgetlab.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """One glossary entry: how the app writes it, what it means in one line, where its formula is
    (docs/methods.md#<anchor>; empty for words without one), the other ways the pages and the CLI write it
    (`aliases`: code names, symbols, column names; search finds them), and its section on the Glossary page."""

    name: str
    meaning: str
    anchor: str = ""
    aliases: tuple[str, ...] = ()
    section: str = ""
    source: str = ""          # the paper, for a method (from docs/methods.md's "Source:")


def _t(name: str, meaning: str, anchor: str = "", *aliases: str) -> Term:
    return Term(name, meaning, anchor, tuple(aliases))


# section → key → Term. The keys are what code passes to `forgetlab.ui.glossary.explain`.
SECTIONS: dict[str, dict[str, Term]] = {
    "Measures": {
        "speciality": _t("speciality", "How well a model does the task it was fine-tuned for: exact match (share of "
                         "answers right, ↑) or answer loss (↓) on the task's held-out pairs.", "speciality",
                         "speciality per task"),
        "generality": _t("generality", "How well a model still models ordinary text: its loss on held-out "
                         "Wikipedia-like text it never trained on (general loss, ↓), or a benchmark's accuracy.",
                         "generality", "general measure"),
        "general_loss": _t("general loss", "Mean next-token cross-entropy, in nats, on held-out general text "
                           "(↓ better); perplexity is its exponential.", "held-out-loss", "held-out loss",
                           "general_loss", "general held-out loss"),
        "loss": _t("loss", "How surprised a model is by the right next token: its cross-entropy in nats per token "
                   "(↓ better; 0 = always sure and right).", "held-out-loss", "cross-entropy", "next-token loss"),
        "nats": _t("nats", "The unit of a loss: natural-log units per token. +0.05 nats of loss is a perplexity "
                   "about 5 % higher.", "held-out-loss", "nat"),
        "perplexity": _t("perplexity", "exp(loss): about how many tokens the model hesitates between (↓ better). "
                         "On the Features page, t-SNE's perplexity is another thing: its neighbourhood size.",
                         "perplexity-change", "perplexity change"),
        "forgetting": _t("forgetting", "How much worse a model got at general text than its base: general loss "
                         "minus the base's, in nats (positive = it forgot).", "forgetting"),
        "exact_match": _t("exact match", "Share of task pairs whose whole answer (and the stop token) the model "
                          "predicts token for token (↑ better).", "exact-match", "exact_match"),
        "answer_loss": _t("answer loss", "Mean cross-entropy of the correct answer's tokens (↓ better); moves "
                          "smoothly where exact match jumps in steps.", "answer-loss", "answer_loss"),
        "retention": _t("own-task gain kept", "Of what a fine-tune gained on its own task over the base, the share a "
                        "merge keeps: 100 % = as good as that fine-tune, 0 = no better than the base.", "retention",
                        "retention", "own-task gain", "parent score"),
        "gain_kept": _t("gain kept", "Of what a fine-tune gained on its task over the base, the share a model "
                        "built from it keeps (FAPM's relative axes): 100 % = the fine-tune's level, 0 = the base's.",
                        "relative-shares", "fine-tune's gain"),
        "forgetting_recovered": _t("forgetting recovered", "Of what a fine-tune forgot, the share a model built from "
                                   "it wins back: 100 % = the base's generality, 0 = the fine-tune's.",
                                   "relative-shares", "base's generality"),
        "relative_axes": _t("relative axes", "A sweep drawn as the FAPM paper reports it: gain kept and forgetting "
                            "recovered (%) against the setting, the paper's operating point (ratio 0.9) marked.",
                            "relative-shares", "FAPM paper", "paper's operating point"),
        "pareto": _t("Pareto front", "The settings that no other setting beats on both speciality and generality "
                     "at once; every other point is worse on at least one without being better on the other.",
                     "pareto-front", "on the Pareto front", "pareto"),
        "tradeoff": _t("trade-off", "What a model or setting gains in speciality against what it costs in generality; "
                       "the Pareto front holds the best trade-offs.", "pareto-front", "tradeoff"),
        "benchmark": _t("benchmark accuracy", "A score from lm-evaluation-harness (lm-eval): the share of a "
                        "benchmark's questions answered right (acc; acc_norm corrects for answer length). Limit: "
                        "examples per task.", "", "benchmark", "benchmarks", "lm-eval", "lm-evaluation-harness",
                        "accuracy", "acc", "acc_norm", "limit"),
        "delta": _t("Δ (change)", "A difference: a model's value minus its reference's (the base's; the fine-tune's "
                    "for leave-one-out). Δ general loss > 0: more forgetting. −Δ: flipped so that up is better.", "",
                    "Δ", "d", "−Δ"),
        "distance": _t("D(θ, θ0)", "How far a model moved from its base: the size of each weight tensor's change "
                       "relative to that tensor (‖θ − θ0‖ / ‖θ0‖), averaged over tensors. 0.01 = weights moved 1 % "
                       "on average.", "distance", "distance", "distance from the base"),
        "moved": _t("moved share", "The share of a model's weights that changed by more than 2e-6 since the start of "
                    "the run (MoFO's count of the weights that really moved).", "moved-share", "moved",
                    "share of weights moved"),
        "std": _t("std", "Standard deviation: how much a value varies over the samples (shown as mean ± std).", "",
                  "±", "standard deviation"),
    },
    "Notation": {
        "tau": _t("τ (task vector)", "What fine-tuning changed: the fine-tuned weights minus the base's, τ = θ1 − θ0. "
                  "Merges and sweeps add scaled, pruned or combined task vectors back to the base; τk: its part k.",
                  "notation", "τ", "task vector", "tau", "τk", "τt", "θt − θ0", "θ1 − θ0"),
        "theta": _t("θ0, θ1, θt (weights)", "θ0: the base model's weights; θ1 or θt: a fine-tuned model's (of task "
                    "t); θ: any model's; W0: one tensor of the base.", "notation", "θ0", "θ1", "θt", "θ", "W0",
                    "weights", "weight"),
        "alpha": _t("α", "How much of a task vector is added back: 0 = the base, 1 = the whole fine-tune (WiSE-FT's "
                    "interpolation weight; a scale in other merges).", "wise_ft", "alpha", "α values", "α grid"),
        "beta": _t("β", "A second setting: in LiNeS, how much more of τ the last layer gets than the first (the sweep "
                   "uses α = 1 − β); in SFA, the weight of the starting weights in each average.", "lines", "beta"),
        "lam": _t("λ", "A scale on a merged task vector (θ0 + λ·…), or the strength of a penalty (L1/L2-to-init).",
                  "notation", "lam", "lambda"),
        "norm": _t("‖τ‖ (norm)", "The size of a task vector (or tensor): the square root of the sum of its squared "
                   "entries. ‖τ‖ / ‖θ0‖ (relative) compares it with the size of the base's weights.", "taskvec-stats",
                   "norm", "‖τ‖", "‖τ‖ / ‖θ0‖", "relative norm", "relative", "base norm", "tau norm", "|τ|/|W0|"),
        "f": _t("f(θ)", "A submodule's (or the model's) output computed with weights θ, on the same inputs.",
                "distance-curve", "f"),
        "cosine": _t("cosine similarity", "How much two task vectors point the same way: 1 = same direction, 0 = "
                     "unrelated, −1 = opposite.", "taskvec-stats", "cosine", "cosines"),
    },
    "Models and data": {
        "model": _t("model", "A set of weights that predicts the next token: the base, a fine-tune, or a merge.", ""),
        "base": _t("base model", "The model every fine-tune started from (θ0); forgetting is measured against it.",
                   "notation", "base", "the base model"),
        "finetuned": _t("fine-tuned model", "The base trained further on one task's pairs (a fine-tune); its weights "
                        "are θ0 + τ.", "notation", "fine-tune", "fine-tuned", "finetuned", "the fine-tuned model",
                        "fine-tuning"),
        "merge": _t("merge", "A model built from the base and several fine-tunes by a merge method, without "
                    "training; saved under merges/ in the workspace.", "", "merged model", "merges", "merged"),
        "parent": _t("parent", "A fine-tune a merge was built from.", "retention", "parents"),
        "pool": _t("model pool", "The models the app works on: one base, its fine-tunes and their probe data, listed "
                   "in a pool.yaml file.", "", "pool", "pool.yaml"),
        "task": _t("task", "What a fine-tune learned (the demo zoo: math, code-like and word-translation pairs), with "
                   "its prompt → answer pairs.", "speciality", "tasks"),
        "probe": _t("probe data", "The held-out pairs and texts the app measures models on; never trained on.",
                    "evaluation-budget", "probe", "probe samples", "samples", "samples per task", "pairs",
                    "eval pairs"),
        "heldout": _t("held-out text", "Ordinary text (the demo: Wikipedia) that no model trained on; the general "
                      "loss is measured on it.", "generality", "held-out split", "held-out", "general text",
                      "held-out blocks", "general blocks"),
        "budget": _t("evaluation budget", "How much probe data each evaluation reads: held-out blocks of general "
                     "text and pairs per task. Every page uses the same budget, so their numbers agree.",
                     "evaluation-budget", "budget", "pairs per task"),
        "scorecard": _t("scorecard", "A model's numbers at the budget: general loss, perplexity and, per task, exact "
                        "match and answer loss.", "", "scorecards"),
        "token": _t("token", "A piece of text the model reads and predicts (a word, part of a word, a digit or a "
                    "sign); losses are per token.", "", "tokens", "token id", "tokenizer"),
        "reference": _t("reference", "The model a text is compared against on the Text page (the base by default).",
                        "", "against"),
        "lora": _t("LoRA adapter", "A fine-tune stored as a small low-rank update of the base's weights "
                   "(ΔW = scale·B·A) instead of a full copy.", "lora-task-vectors", "LoRA", "adapter", "lora"),
        "recipe": _t("recipe", "What a merge or a run was made with (method, models, parameters, seed), saved as "
                     "YAML/JSON beside it so it can be made again.", "", "recipes"),
        "workspace": _t("workspace", "The folder where everything the app makes lands: zoo/, merges/ and runs/ "
                        "(FORGETLAB_HOME, default ~/.forgetlab).", "", "FORGETLAB_HOME"),
        "run": _t("run", "One saved result of an analysis, a sweep or a fine-tune, under runs/ in the workspace; "
                  "the Runs page reopens and compares them.", "", "runs", "saved run"),
        "zoo": _t("demo zoo", "The built-in example: a small base pre-trained offline and its fine-tunes on three "
                  "tasks (pico), or SmolLM2's (smol).", "", "zoo", "pico", "smol", "zoo size"),
        "pretraining": _t("pre-training", "How the base first learned text, before any fine-tune; the demo zoo "
                          "records it step by step, with the facts it came to know.", "", "pre-training step",
                          "facts", "watched facts"),
        "parameters": _t("parameters", "The number of weights of a model (or of a part of it).", "", "numel"),
        "dtype": _t("dtype", "The number format weights are held in: float32 (exact), bfloat16 or float16 (half the "
                    "memory, less precise).", "", "float32", "bfloat16", "float16", "output dtype"),
        "device": _t("device", "Where the computation runs: the CPU, or a GPU (cuda, mps).", "", "cpu", "cuda"),
        "executor": _t("executor", "What runs the points of a sweep or search: this process (local) or Ray workers "
                       "(Ray address); a worker is one such process.", "", "worker", "workers", "Ray",
                       "points run on"),
    },
    "Inside the network": {
        "layer": _t("layer", "One decoder block of the network (attention, then MLP); layer 0 reads the "
                    "embeddings.", "submodule-levels", "decoder layer", "layers"),
        "module": _t("module", "A part of a layer: its attention (attn), its MLP (mlp) or its norms.",
                     "submodule-levels", "modules"),
        "attention": _t("attention", "The part of a layer that mixes information between positions of the text "
                        "(attn).", "submodule-levels", "attn"),
        "head": _t("attention head", "One of the parallel parts of an attention module, each with its own "
                   "weights.", "submodule-levels", "head", "heads"),
        "mlp": _t("MLP", "The feed-forward part of a layer, applied to each position on its own.",
                  "submodule-levels", "mlp"),
        "expert": _t("expert", "In a mixture-of-experts model (Mixtral, Qwen2-MoE, OLMoE), one of the several MLPs "
                     "of a layer; a small router sends each token to a few of them. The expert level scores each "
                     "on the tokens the router sent it.", "architectures", "experts", "router",
                     "mixture of experts", "MoE"),
        "embeddings": _t("embeddings", "The table that turns each token into the vector layer 0 reads (embed); "
                         "lm_head turns the last vector back into next-token scores; norm rescales vectors.",
                         "submodule-levels", "embed", "embedding", "lm_head", "norm layer"),
        "submodule": _t("submodule", "A part of the network scored on its own: a decoder layer, its attention, its "
                        "MLP, one attention head or one expert.", "submodule-levels", "submodules", "part", "parts"),
        "level": _t("level", "The size of the parts scored: the whole model, layers, attn / mlp modules, heads or "
                    "experts (attn_mlp: attention + MLP; head_mlp: heads + MLP).", "submodule-levels", "levels", "attn_mlp",
                    "head_mlp"),
        "hidden": _t("hidden state", "The vector a layer passes to the next at one position; the last one feeds the "
                     "next-token prediction.", "tsne-features", "last hidden state"),
        "block": _t("block", "Two meanings: a stretch of held-out text of fixed length (held-out blocks), or a group "
                    "of consecutive layers that HMA gives one α (early, middle, late).", "hma", "blocks"),
        "alpha_tuple": _t("α tuple", "HMA's α of each block of layers, first to last, written 0.1, 0.2, 0.3; a grid "
                          "has one per line.", "hma", "tuple"),
        "depth": _t("depth", "How far into the network: 0 = the embeddings, then one step per layer.", "", "role"),
        "tensor": _t("tensor", "One weight matrix (or vector) of a model; most statistics are per tensor.", "",
                     "tensors", "entries", "matrix", "matrices", "weight matrix"),
    },
    "Fine-tuning": {
        "adamw": _t("AdamW", "The standard optimizer: every weight moves at every step.", "", "adamw"),
        "sgd": _t("SGD", "Plain stochastic gradient descent, without AdamW's running averages.", "", "sgd"),
        "mofo": _t("MoFO", "Momentum-filtered optimizer: at each step only the share `fraction` of each tensor's "
                   "entries with the largest momentum move, so the model stays closer to its start.", "mofo", "mofo",
                   "fraction"),
        "mofo_filter": _t("MoFO filter", "Which weights MoFO moves, the same number each step: the largest momentum "
                          "(MoFO's own), gradient (flt-g), Adam step m/√v (mv), g/√v (gv), or a new random choice "
                          "(random BCD).", "mofo-filters", "filter", "flt-g", "flt-mv",
                          "flt-gv", "momentum", "gradient", "mv", "gv", "random", "random BCD", "BCD",
                          "block coordinate descent"),
        "head_partitions": _t("MoFO partitions", "The groups MoFO picks its share of weights within: each weight "
                              "tensor (tensor), or each attention head's own rows and columns of the attention "
                              "weights (head; label -heads).", "head-partitions", "partition", "partitions",
                              "per-head partitions"),
        "lion": _t("Lion", "An optimizer that moves every weight by the same step size, in the direction of the "
                   "sign of its momentum; it keeps one running average instead of AdamW's two.", "lion", "lion"),
        "mofo_lion": _t("MoFO-Lion", "MoFO's filter on Lion: at each step only the share `fraction` of each tensor's "
                        "weights with the largest momentum take Lion's step.", "mofo-lion", "mofo-lion"),
        "max_length": _t("training sequence length", "How many tokens of each training pair a fine-tune keeps (its "
                         "answer and the end of its prompt).", "", "max length", "sequence length"),
        "sfa": _t("SFA", "Soup to go: during fine-tuning, every share p of the steps, average the weights with the "
                  "starting weights (β = weight of the start).", "sfa", "sfa", "SFA averaging", "p"),
        "l2": _t("L2-to-init", "Fine-tune with a penalty (λ/2)·‖θ − θ0‖² that pulls every weight back towards its "
                 "starting value (in a task sequence: the base's), harder the further it moved.", "l2-to-init", "l2",
                 "l2-init", "L2 to the base"),
        "l1": _t("L1-to-init", "Fine-tune with a penalty λ·‖θ − θ0‖₁: the same pull λ on every weight that moved from "
                 "its start (in a task sequence: the base), however far it moved.", "l1-to-init", "l1", "l1-init",
                 "L1 to the base"),
        "proximal": _t("proximal GD", "Proximal gradient descent: each stage of a task sequence trains with an L2 "
                       "penalty (λ/2)·‖θ − θprev‖² towards the previous stage's weights θprev, so it moves little "
                       "from where it started.", "sequence-methods", "proximal", "proximal gradient descent"),
        "ewc": _t("EWC", "Elastic weight consolidation: after each task of a sequence, every later stage pulls each "
                  "weight back towards its value then, harder where the task's Fisher information says it matters.",
                  "ewc", "ewc", "elastic weight consolidation"),
        "fisher_information": _t("Fisher information", "How much a task's answers depend on each weight: the mean "
                                 "squared gradient of their loss, per weight, over the task's train pairs (EWC's "
                                 "diagonal, empirical Fisher).", "ewc", "Fisher-weighted",
                                 "diagonal Fisher", "Fisher samples"),
        "hft": _t("HFT", "Half Fine-Tuning: each stage freezes a new random half of every layer's attention and MLP "
                  "matrices and trains the rest, so the frozen half keeps what the model knew.", "hft", "hft",
                  "half fine-tuning", "HFT frozen share"),
        "frozen": _t("frozen", "A frozen weight is left out of training: it keeps its value through the run (no "
                     "gradient, no optimizer state).", "hft", "freeze", "freezes", "frozen share"),
        "replay": _t("data replay", "Each stage of a task sequence mixes some of the earlier tasks' training pairs "
                     "(replay share × the stage's own pairs) into its own, with the same number of steps.",
                     "sequence-methods", "replay", "replay share", "replayed"),
        "combination": _t("MoFO + replay, MoFO + EWC", "MoFO combined with data replay or with EWC in every stage "
                          "(MoFO's \"orthogonal combination\"): the fixes act on different things, so they can "
                          "add up.", "sequence-methods", "mofo+replay", "mofo+ewc", "MoFO with data replay",
                          "MoFO with EWC"),
        "comparison": _t("comparison", "The Fine-tune page's default: one task, the same steps and seed, trained with "
                         "AdamW, MoFO, SFA, L2- and L1-to-init side by side.", "", "compare"),
        "optimizer": _t("optimizer", "The rule that turns gradients into weight updates (AdamW, MoFO, Lion, "
                        "MoFO-Lion, SGD).", "",
                        "optimizers"),
        "step": _t("training step", "One update of the weights from one batch of pairs.", "", "steps", "step",
                   "record every k steps"),
        "batch": _t("batch size", "How many pairs each training step learns from.", "", "batch"),
        "lr": _t("learning rate", "How large each training step's update is.", "", "lr"),
        "train_loss": _t("training loss", "The answer loss on the training batch at a step (↓ as it learns).", "",
                         "train loss", "final train loss", "final training loss"),
        "seed": _t("seed", "The number that fixes the random draws (data order, masks, t-SNE): same seed, same "
                   "result.", ""),
        "checkpointing": _t("gradient checkpointing", "Recompute activations during the backward pass instead of "
                            "keeping them: less memory, about a third slower.", ""),
        "start": _t("start from", "The model a fine-tune starts from (θo, usually the base); its distance and its "
                    "penalties are measured from it.", "distance", "θo", "start"),
    },
    "Merging and search": {
        "cma_es": _t("CMA-ES", "An evolution strategy that searches numbers (merge weights, λ per task) by trying "
                     "batches of candidates and moving towards the better ones.", "merge-search", "CMA-ES",
                     "cma"),
        "objective": _t("objective", "What a search maximises: speciality while forgetting stays under the bound "
                        "(constrained), or speciality minus a weighted forgetting (weighted).", "merge-search",
                        "constrained", "weighted"),
        "bound": _t("forgetting bound", "The most forgetting (nats of held-out loss) a constrained search accepts.",
                    "merge-search", "bound"),
        "evaluations": _t("evaluations", "How many merges a search builds and evaluates (its budget).",
                          "merge-search", "evaluation"),
        "best": _t("best point", "The search's point with the best objective that respects the bound.",
                   "merge-search", "best"),
        "sweep": _t("sweep", "A row of models between the base and a fine-tune (or along a fix's setting), each "
                    "evaluated: a forgetting curve with its Pareto front.", "sweeps", "sweeps", "forgetting curve"),
        "pruning": _t("pruning", "Zeroing part of a task vector's entries, keeping the rest, before adding it back; "
                      "the pruning ratio is the share zeroed.", "fapm", "pruned", "zeroed", "pruning ratio"),
        "series": _t("series", "One line of a chart: a method, a score or a run, over the swept setting.", "sweeps"),
        "setting": _t("setting", "The value a sweep varies along its x axis (α, ratio, density, β, keep); settings: "
                      "all the values of a point.", "sweeps", "settings", "x"),
    },
    "Task sequences": {
        "task_sequence": _t("task sequence", "Several tasks fine-tuned one after another in a given order, each "
                            "stage starting from the previous stage's weights; every task is scored after every "
                            "stage.", "sequence-methods", "sequence of tasks", "task sequences"),
        "order": _t("order", "The tasks of a sequence in the order they are trained: the first one first, from the "
                    "base.", "sequence-methods", "training order", "order of tasks"),
        "stage": _t("stage", "One step of a task sequence: fine-tuning on the next task of the order, from the "
                    "previous stage's weights, then scoring every task. Stage 0 is the base.", "sequence-methods",
                    "stages", "after training on", "previous stage"),
        "chain": _t("chain", "One method's run through the whole order, stage after stage; a merge chain instead "
                    "merges the pool's fine-tunes of the first t tasks, for t = 1…T.", "sequence-methods", "chains",
                    "merge chain", "merge chains", "fine-tuning chain"),
        "naive_sequential": _t("naive sequential fine-tuning", "Plain AdamW through the order, with nothing against "
                               "forgetting: each stage just fine-tunes the previous stage's model on the next task. "
                               "The baseline.", "sequence-methods", "sequential fine-tuning"),
        "score_matrix": _t("score matrix R", "R[i, j]: task j's score (exact match or answer loss) after stage i; a "
                           "row per stage (row 0: the base), a column per task. The heatmaps draw it.",
                           "sequence-metrics", "R", "R[i, j]", "matrix.csv", "score matrix"),
        "op": _t("OP", "Overall performance (TRACE): the mean score over all tasks after the last stage.",
                 "sequence-metrics", "op", "overall performance"),
        "bwt": _t("BWT", "Backward transfer: how much the earlier tasks changed from just after their own stage to "
                  "the end, averaged (exact match: negative = forgotten). TRACE divides by T tasks, GEM by T − 1.",
                  "sequence-metrics", "backward transfer", "bwt_trace", "bwt_gem", "TRACE", "GEM"),
        "fwt": _t("FWT", "Forward transfer: how much the earlier stages changed a task's score before its own stage, "
                  "against the base's score (mean over tasks 2…T).", "sequence-metrics", "forward transfer", "fwt"),
        "task_forgetting": _t("per-task forgetting", "A task's largest drop by the end of a sequence: its best score "
                              "after an earlier stage minus its score after the last (none for the last task).",
                              "sequence-metrics", "forgetting per task", "forgetting of a task"),
        "retained_gain": _t("retained gain", "Of what a task's own stage gained over the base, the share still there "
                            "after the last stage: 100 % = all kept, 0 = back to the base's score.",
                            "sequence-metrics", "share of the gain left", "retained"),
    },
    "Linearity": {
        "nls": _t("NLS", "Non-linearity score: how far a submodule's output strays from a straight line as its weights "
                  "move from base to fine-tune (0 = perfectly linear).", "nls", "non-linearity", "nls mean"),
        "d_alpha": _t("d(α)", "Distance of a submodule's output at α from its fine-tuned output, relative to the "
                      "base's; a linear submodule follows 1 − α (the ideal line).", "distance-curve",
                      "distance curve", "ideal 1 − α", "curve"),
        "residual": _t("Property 1 residual", "How far a submodule's output at α is from the straight line between "
                       "its base and fine-tuned outputs, relative to their distance (0 = on the line).", "property-1",
                       "residual"),
        "capture": _t("inputs captured from", "Whose forward pass gives each submodule its inputs, captured once: the "
                      "fine-tuned model's or the base's.", "submodule-levels", "capture"),
    },
    "Text": {
        "rise": _t("rise", "How many nats a model lost on one token against its reference: logp(reference) − "
                   "logp(model). Positive (red) = forgotten; its mean over held-out text is the forgetting.", "",
                   "rise (model − reference)", "mean rise", "total rise", "share of rise"),
        "kl": _t("KL", "KL divergence of the model's next-token distribution from the reference's, over the whole "
                 "vocabulary, in nats: how much the prediction changed, right or wrong.", "", "KL(reference ‖ model)",
                 "kl divergence"),
        "logp": _t("logp", "The log-probability a model gave the actual token (0 = certain; more negative = more "
                   "surprised).", "", "log-probability"),
        "lens": _t("logit lens", "Read the next-token loss after each layer, by sending that layer's output straight "
                   "to the output head: where in depth the forgetting appears.", "", "lens"),
        "token_class": _t("token class", "A token's kind: word, number, punctuation, whitespace or special (the "
                          "tokenizer's own markers, such as end of text).", "", "token classes", "class", "special",
                          "word", "number", "punctuation", "whitespace"),
        "top": _t("top guesses", "A model's three most likely next tokens (top1–top3) and their probabilities "
                  "(p1–p3).", "", "top1", "top2", "top3", "p1", "p2", "p3"),
        "context": _t("context", "The tokens around a scored token (the token in [brackets]).", ""),
        "position": _t("position", "Where a token sits in its sequence (0 = first).", "", "position in the sequence"),
        "sequence": _t("sequence", "One document (or block) of text scored token by token.", "", "doc", "document"),
    },
    "Attribution": {
        "only_this": _t("only this part", "θ0 + τk: the base with one part of the task vector added; its Δ is "
                        "against the base: what that part alone buys and costs.", "attribution", "only this",
                        "only_this"),
        "leave_one_out": _t("leave one out", "θ0 + τ − τk: the fine-tune without one part; its Δ is against the "
                            "fine-tune: what the fine-tune loses without it.", "attribution", "leave this part out",
                            "leave_one_out"),
        "additivity": _t("additivity", "Whether the parts' effects add up to the whole change: sum of parts ÷ whole "
                         "= 1 when they do.", "attribution", "sum of parts", "whole"),
        "tau_share": _t("τ share", "A part's share of the task vector's squared size; zero τ: the part did not "
                        "change at all.", "attribution", "tau share", "zero tau"),
    },
    "Features": {
        "tsne": _t("t-SNE", "A 2-D map that keeps points that are close in the features close on the page; "
                   "distances between far clusters are only indicative.", "tsne-features", "tsne", "openTSNE"),
        "pca": _t("PCA", "Principal component analysis: the features squeezed to their 50 main directions before "
                  "t-SNE; distances there are faithful.", "tsne-features", "PCA space"),
        "pooling": _t("pooling", "How one vector is made per sample: the mean over the answer's tokens, or the last "
                      "token's.", "tsne-features", "mean over answer tokens", "last token"),
        "centroid": _t("task-centroid distance", "The distance between the centres of two tasks' point clouds: "
                       "larger = the model keeps the tasks apart.", "tsne-features", "task clusters", "cluster",
                       "clusters"),
    },
    "Paper studies": {
        "study": _t("study", "One table or figure of the five papers rerun on this pool, with the paper's claim "
                    "beside what it measures here and whether the claim holds (docs/studies.md).", "", "studies",
                    "paper studies", "claim", "holds"),
        "inter_balancing": _t("inter-balancing", "PCB's weight for each model's change to a parameter: how large it "
                              "is against the other models' changes there (with or without the model itself, j = i).",
                              "pcb-self-term", "inter balancing", "j = i", "j ≠ i"),
        "operating_ratio": _t("operating ratio", "The pruning ratio a paper recommends and reports its numbers at "
                              "(FAPM: 0.9); the study judges the claim there.", "relative-shares", "operating point"),
        "ablation": _t("ablation", "A paper's experiment that changes one part of its method at a time (a filter, "
                       "an activation, a frequency) to show which part matters.", "", "ablations"),
    },
}

# what a page's control covers, in the order the tooltip lists the terms
GROUPS: dict[str, tuple[str, ...]] = {
    "sweeps": ("wise_ft", "fapm", "dare", "ties", "hma"),
    "tradeoff": ("speciality", "generality", "pareto"),
    "finetune": ("adamw", "mofo", "sfa", "l2", "l1", "distance"),
    "merge": ("task_arithmetic", "ties", "dare", "pcb", "wise_ft", "hma", "fapm"),
    "linearity": ("nls", "d_alpha", "residual", "distance"),
    "sequence": ("adamw", "mofo", "sfa", "l2", "l1", "proximal", "ewc", "hft", "replay", "lora", "combination"),
}

# the docs/methods.md anchor of an analysis whose name is not one (sweep-* analyses: "sweeps")
ANALYSIS_ANCHORS = {"linearity": "nls", "search": "merge-search", "pcb-search": "pcb-lambda-search",
                    "slwm-weights": "slwm", "taskvec": "taskvec-stats", "features": "tsne-features"}
