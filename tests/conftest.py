"""Shared fixtures: tiny random Llama and GPT-2 pools (HF folders on disk) and the tiny pico zoo."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# an app started on an empty workspace builds the pico demo zoo by itself (forgetlab.ui.zoo_build): minutes of
# CPU that only tests/test_app_shell.py::test_empty_workspace_builds_the_demo_zoo_by_itself wants, with a fake build
os.environ["FORGETLAB_AUTO_ZOO"] = "0"

GENERAL = [
    "The river flows through the old town and past the mill. Farmers bring grain to the market every week.",
    "A library keeps books, maps and letters. Readers come in the morning and leave in the evening.",
    "The mountain is covered with snow in winter; in summer the meadows are green and full of flowers.",
    "Ships carried wool and salt along the coast. The harbour grew into a busy city over many years.",
    "Music was played in the square on holidays, and children danced while their parents talked.",
    "The bridge was rebuilt in stone after the flood destroyed the wooden one that stood before it.",
]
TASKS = {
    "math": [(f"{a}+{b}=", str(a + b)) for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 8), (9, 9), (4, 4), (6, 3)]],
    "copy": [(f"copy {w}:", w) for w in ["red", "blue", "green", "stone", "river", "salt", "wool", "snow"]],
}


@dataclass
class TinyPool:
    """Paths of a tiny pool on disk: base and fine-tuned folders, probe files, pool.yaml."""

    root: Path
    base: Path
    finetuned: dict[str, Path] = field(default_factory=dict)
    pool_yaml: Path | None = None


def _train_tokenizer(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = GENERAL + [p + " " + a for pairs in TASKS.values() for p, a in pairs]
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.save_pretrained(str(folder))
    return fast


def _write_probes(root: Path) -> None:
    data = root / "data"
    data.mkdir()
    (data / "general.txt").write_text("\n\n".join(GENERAL))
    for task, pairs in TASKS.items():
        with open(data / f"{task}.jsonl", "w") as fh:
            for p, a in pairs:
                fh.write(json.dumps({"prompt": p, "answer": a}) + "\n")


def make_tiny_pool(root: Path, family: str = "llama", n_finetuned: int = 2, scale: float = 0.02) -> TinyPool:
    """A random base of `family` (llama, gpt2, or any of tests/architectures.py's FAMILIES) and `n_finetuned`
    perturbed copies (θ0 + small seeded noise), saved as HF folders."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from tests.architectures import FAMILIES, tiny_model

    root.mkdir(parents=True, exist_ok=True)
    tok_dir = root / "tokenizer"
    tok = _train_tokenizer(tok_dir)
    torch.manual_seed(0)
    if family == "llama":
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        model = LlamaForCausalLM(cfg)
    elif family == "gpt2":
        cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=256,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        model = GPT2LMHeadModel(cfg)
    elif family in FAMILIES:   # tests/architectures.py: every other tested decoder family
        model = tiny_model(family, len(tok), bos=tok.bos_token_id, eos=tok.eos_token_id, pad=tok.pad_token_id)
    else:
        raise ValueError(family)
    model.eval()
    pool = TinyPool(root, root / "base")
    model.save_pretrained(str(pool.base))
    tok.save_pretrained(str(pool.base))
    base_sd = {k: v.clone() for k, v in model.state_dict().items()}
    for i in range(n_finetuned):
        g = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(base_sd[name] + scale * torch.randn(p.shape, generator=g))
        path = root / f"ft{i}"
        model.save_pretrained(str(path))
        tok.save_pretrained(str(path))
        pool.finetuned[f"ft{i}"] = path
    _write_probes(root)
    spec = {
        "name": f"tiny-{family}",
        "base": "base",
        "models": {k: v.name for k, v in pool.finetuned.items()},
        "probes": {"general": "data/general.txt",
                   "tasks": {t: {"train": f"data/{t}.jsonl", "probe": f"data/{t}.jsonl", "eval": f"data/{t}.jsonl"}
                             for t in TASKS}},
    }
    import yaml

    pool.pool_yaml = root / "pool.yaml"
    pool.pool_yaml.write_text(yaml.safe_dump(spec, sort_keys=False))
    return pool


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> TinyPool:
    """A tiny random Llama base + two fine-tuned variants + probe data + pool.yaml (read-only: do not modify)."""
    return make_tiny_pool(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="module")
def pool(tiny_llama):
    """The tiny Llama pool opened as a `ModelPool` (one per test module: its loaded models are cached)."""
    from forgetlab.core.pool import ModelPool

    return ModelPool.from_yaml(tiny_llama.pool_yaml)


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> TinyPool:
    """A tiny random GPT-2 base + two fine-tuned variants + probe data + pool.yaml (read-only)."""
    return make_tiny_pool(tmp_path_factory.mktemp("tiny-gpt2"), "gpt2")


@pytest.fixture(scope="session")
def zoo_home(tmp_path_factory) -> Path:
    """A workspace folder (FORGETLAB_HOME) shared by the session's zoo build."""
    return tmp_path_factory.mktemp("forgetlab-home")


@pytest.fixture(scope="session")
def pico_zoo(zoo_home):
    """The tiny pico zoo, built once per test session (a `forgetlab.zoo.ZooBuild`)."""
    from forgetlab.zoo import build

    return build(preset="pico", size="tiny", home=zoo_home)


@pytest.fixture
def small_disk(tmp_path):
    """A folder on a tmpfs of the asked size (a real full disk); skips where the machine cannot mount one."""
    import subprocess

    mounts = []

    def make(size: str) -> Path:
        mnt = tmp_path / f"small-{len(mounts)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounts.append(mnt)
        return mnt

    yield make
    for mnt in mounts:
        subprocess.run(["umount", str(mnt)], check=False)
