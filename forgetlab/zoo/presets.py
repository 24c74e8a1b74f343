"""Zoo presets and sizes: every number a zoo build depends on, in frozen dataclasses.

`PRESETS[preset][size]` is a `ZooSpec`. Its `fingerprint()` (with the forgetlab version) is written to the
manifest; a zoo whose manifest carries another fingerprint is rebuilt rather than trusted.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd

from forgetlab.analysis.linearity import LinearitySettings
from forgetlab.core.errors import ParameterError
from forgetlab.train.defaults import FinetuneDefaults
from forgetlab.train.sequence import DEFAULT_COMPARE

SIZES = ("tiny", "default")


@dataclass(frozen=True)
class ModelShape:
    """A LlamaForCausalLM shape for the pico preset (tied input/output embeddings)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 256


@dataclass(frozen=True)
class TrainSpec:
    """One training run: steps, batch size, peak learning rate, warm-up, weight decay, sequence length."""

    steps: int
    batch_size: int
    lr: float
    warmup: int = 0
    weight_decay: float = 0.0
    max_length: int = 128


@dataclass(frozen=True)
class LoraSpec:
    """A PEFT LoRA adapter: rank r, alpha, dropout, target modules, and its own training run."""

    r: int
    alpha: int
    dropout: float
    target_modules: tuple[str, ...]
    train: TrainSpec


@dataclass(frozen=True)
class DataSpec:
    """How much data a build uses: Wikipedia characters per part, task pairs per split, `skill_share`: the
    share of the pico pretraining text made of the tasks' train facts in a general-text form
    (`forgetlab.zoo.tasks.skill_sentence` in `skill_form`; never the eval or probe pairs), and `code_level`:
    the code task's templates (`forgetlab.zoo.tasks.code_pair`)."""

    wiki_train_chars: int | None
    wiki_heldout_chars: int | None
    n_train: int
    n_probe: int
    n_eval: int
    heldout_fraction: float = 0.1
    wiki_seed: int = 0
    skill_share: float = 0.0
    skill_form: str = "prose"
    code_level: str = "full"


@dataclass(frozen=True)
class EvalSpec:
    """How each model is scored: held-out general blocks (of `block_size` tokens) and eval pairs per task."""

    max_general: int
    max_task: int
    block_size: int = 128
    batch_size: int = 32


@dataclass(frozen=True)
class SequenceClaimsSpec:
    """The task sequence whose claims a zoo measures (forgetlab.zoo.sequence_claims) and the Sequence page and
    `forgetlab sequence` start from on that zoo: the order, the methods compared, and each stage's steps and peak
    learning rate where they differ from the zoo's fine-tune recipe (None: the recipe's)."""

    order: tuple[str, ...] = ("math", "code", "translate")
    methods: tuple[str, ...] = DEFAULT_COMPARE
    steps: int | None = None
    lr: float | None = None


@dataclass(frozen=True)
class ClaimsSpec:
    """How "what this zoo shows" is measured at the end of a build (`forgetlab.zoo.claims.zoo_claims`):
    evaluation limits (held-out blocks, eval pairs per task), probe pairs for NLS and slwm, speciality measure."""

    max_general: int = 32
    max_task: int = 50
    nls_samples: int = LinearitySettings().samples    # the Linearity page's default: one NLS for a model, both places
    slwm_samples: int = 12
    measure: str = "exact_match"
    merges: tuple[str, ...] = ("task_arithmetic", "ties", "pcb", "slwm")  # forgetlab.zoo.claims.CLAIMABLE_MERGES
    sequence: SequenceClaimsSpec | None = None           # also measure the task-sequence claims


@dataclass(frozen=True)
class ZooSpec:
    """Everything one zoo build depends on."""

    preset: str
    size: str
    data: DataSpec
    finetune: TrainSpec
    evaluation: EvalSpec
    tasks: tuple[str, ...] = ("math", "code", "translate")
    seed: int = 0
    threads: int = 2
    vocab_size: int | None = None          # pico: trained tokenizer size
    shape: ModelShape | None = None        # pico: architecture
    pretrain: TrainSpec | None = None      # pico: pretraining run on Wikipedia
    lora: LoraSpec | None = None           # one PEFT adapter per task
    claims: ClaimsSpec | None = None       # measure the papers' claims at the end of the build
    template: str | None = None            # "chat" wraps prompts in the tokenizer's chat template
    finetune_lr: dict[str, float] = field(default_factory=dict)   # a task's own fine-tune lr, where it needs one
    extras: dict[str, Any] = field(default_factory=dict)

    def finetune_for(self, task: str) -> TrainSpec:
        """The full fine-tune run of `task`: `finetune`, with the task's learning rate from `finetune_lr` if it has
        one."""
        if task not in self.finetune_lr:
            return self.finetune
        return replace(self.finetune, lr=self.finetune_lr[task])

    @property
    def name(self) -> str:
        """The zoo folder name: `<preset>` for the default size, `<preset>-<size>` otherwise."""
        return self.preset if self.size == "default" else f"{self.preset}-{self.size}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every setting."""
        return json.loads(json.dumps(asdict(self)))

    def fingerprint(self) -> str:
        """SHA-256 (first 16 hex digits) of the settings' canonical JSON."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def model_names(self) -> list[str]:
        """Folders the build writes, in build order: `base`, `ft-<task>`, and (with LoRA) `lora-<task>`."""
        names = ["base"] + [f"ft-{t}" for t in self.tasks]
        if self.lora is not None:
            names += [f"lora-{t}" for t in self.tasks]
        return names

    def to_frame(self) -> pd.DataFrame:
        """The settings as a two-column table (setting, value), nested keys joined with dots."""
        rows: list[dict[str, Any]] = []

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                rows.append({"setting": prefix, "value": value})

        walk("", self.to_dict())
        return pd.DataFrame(rows)


_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_PICO_TINY = ZooSpec(
    preset="pico",
    size="tiny",
    vocab_size=1024,
    shape=ModelShape(vocab_size=1024, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128),
    data=DataSpec(wiki_train_chars=250_000, wiki_heldout_chars=40_000, n_train=800, n_probe=32, n_eval=64,
                  skill_share=0.2, skill_form="prompt"),
    pretrain=TrainSpec(steps=120, batch_size=16, lr=3e-3, warmup=10, weight_decay=0.01, max_length=64),
    finetune=TrainSpec(steps=80, batch_size=32, lr=1e-3, warmup=8, max_length=64),
    lora=LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=_LORA_TARGETS,
                  train=TrainSpec(steps=40, batch_size=32, lr=3e-3, warmup=4, max_length=64)),
    evaluation=EvalSpec(max_general=48, max_task=64, block_size=64),
    # the tiny models hardly ever produce an exact answer, so their claims are measured on the answer loss
    claims=ClaimsSpec(max_general=16, max_task=32, nls_samples=6, slwm_samples=6, measure="answer_loss"),
    threads=1,
)

_PICO_DEFAULT = ZooSpec(
    preset="pico",
    size="default",
    vocab_size=2048,
    shape=ModelShape(vocab_size=2048, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256),
    # 70 % of the pretraining text is the tasks' train facts, each task in its own form (docs/zoo.md, "Distinct
    # tasks"): math and translate in their prompt's frame with ` = ` for the task's mark and EOS after the answer,
    # code as worked examples without EOS, code answers words; each fine-tune then has its own lesson (the mark,
    # or stopping), so the task vectors are near orthogonal and no fine-tune helps another task; 1400 steps let
    # the base learn the sums, and code needs a slightly higher fine-tune lr to move as far as the others
    data=DataSpec(wiki_train_chars=1_500_000, wiki_heldout_chars=120_000, n_train=1200, n_probe=64,
                  n_eval=100, skill_share=0.7, skill_form="math:equals,code:prompt,translate:equals",
                  code_level="words"),
    pretrain=TrainSpec(steps=1400, batch_size=16, lr=2e-3, warmup=40, weight_decay=0.01, max_length=128),
    finetune=TrainSpec(steps=150, batch_size=16, lr=2.25e-4, warmup=10, max_length=64),
    finetune_lr={"code": 2.75e-4},
    lora=LoraSpec(r=8, alpha=16, dropout=0.0, target_modules=_LORA_TARGETS,
                  train=TrainSpec(steps=150, batch_size=16, lr=1e-3, warmup=10, max_length=64)),
    evaluation=EvalSpec(max_general=160, max_task=100, block_size=128),
    claims=ClaimsSpec(max_general=32, max_task=50, slwm_samples=12, measure="exact_match",
                      merges=("task_arithmetic", "ties", "pcb", "slwm", "multislerp", "model_stock", "della", "lines",
                              "tsv", "iso_c", "iso_cts", "cart", "localize_stitch", "regmean", "regmean_pp",
                              "fisher"),
                      # the zoo's fine-tune rate (2.25e-4) barely disturbs math in later stages (AdamW keeps 74 % of
                      # its gain, BWT −0.09); at 1e-3 sequential AdamW keeps 20 % (BWT −0.19): docs/zoo.md
                      sequence=SequenceClaimsSpec(lr=1e-3)),
    threads=2,
)

_SMOL_DEFAULT = ZooSpec(
    preset="smol",
    size="default",
    data=DataSpec(wiki_train_chars=200_000, wiki_heldout_chars=60_000, n_train=600, n_probe=32, n_eval=64),
    finetune=TrainSpec(steps=60, batch_size=8, lr=3e-4, warmup=6, max_length=96),
    lora=LoraSpec(r=8, alpha=16, dropout=0.0, target_modules=_LORA_TARGETS,
                  train=TrainSpec(steps=60, batch_size=8, lr=1e-3, warmup=6, max_length=96)),
    evaluation=EvalSpec(max_general=24, max_task=64, block_size=128, batch_size=8),
    template="chat",
    threads=2,
)

_SMOL_TINY = replace(
    _SMOL_DEFAULT,
    size="tiny",
    data=replace(_SMOL_DEFAULT.data, n_train=200, n_eval=24, n_probe=16),
    finetune=replace(_SMOL_DEFAULT.finetune, steps=12, warmup=2),
    lora=replace(_SMOL_DEFAULT.lora, train=replace(_SMOL_DEFAULT.lora.train, steps=12, warmup=2)),
    evaluation=replace(_SMOL_DEFAULT.evaluation, max_general=6, max_task=24),
)

PRESETS: dict[str, dict[str, ZooSpec]] = {
    "pico": {"tiny": _PICO_TINY, "default": _PICO_DEFAULT},
    "smol": {"tiny": _SMOL_TINY, "default": _SMOL_DEFAULT},
}


def get_spec(preset: str, size: str = "default") -> ZooSpec:
    """The `ZooSpec` of a preset and size; unknown names raise ParameterError listing the known ones."""
    if preset not in PRESETS:
        raise ParameterError(f"Unknown zoo preset {preset!r}. Choose one of: {', '.join(PRESETS)}.")
    sizes = PRESETS[preset]
    if size not in sizes:
        raise ParameterError(f"Unknown size {size!r} for zoo preset {preset!r}. Choose one of: {', '.join(sizes)}.")
    return sizes[size]


def zoo_stage_budgets(spec: ZooSpec, order, sequence: SequenceClaimsSpec | None = None) -> dict[str, FinetuneDefaults]:
    """Each task's stage recipe in the zoo's task sequence: the zoo's own fine-tune of the task (`finetune_for`),
    with the sequence's steps and learning rate in their place where it sets them. The same numbers
    `forgetlab.train.sequence.stage_budgets` reads back from the built zoo's manifest."""
    out = {}
    for task in order:
        run = spec.finetune_for(task)
        steps = sequence.steps if sequence is not None and sequence.steps is not None else run.steps
        lr = sequence.lr if sequence is not None and sequence.lr is not None else run.lr
        out[task] = FinetuneDefaults(steps=int(steps), batch_size=int(run.batch_size), lr=float(lr),
                                     warmup=min(int(run.warmup), int(steps)), source="zoo preset")
    return out
