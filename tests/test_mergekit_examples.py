"""Issue 41: mergekit 0.1.5's own `examples/` (arcee-ai/mergekit, read on 6 Dec 2026; the folder is not in the pip
package, so its six files are reproduced below as they stand) merge with forgetlab to mergekit-yaml's tensors.

The model names are replaced by tiny Llama checkpoints made here, with the 40 layers the layer ranges ask for
(no range is scaled). mergekit computes in the recipe's dtype (float16, bfloat16) where forgetlab computes in
float32 and rounds once, so the values are compared within a few units in the last place of that dtype. Where
mergekit's arithmetic decides something (TIES's top-k by |τ| and its sign election, Arcee Fusion's outlier mask),
a decision taken in float16 and one taken in float32 agree only if the inputs leave no near-tie; the checkpoints
are built so that none is left:

- float16 set (base and three fine-tunes): every value a multiple of g = 2⁻¹⁴ below 2¹¹·g in magnitude, so that
  θ, τ = θt − θ0 and their sums are exact in float16 as in float32; within a tensor (≤ 1024 entries) each model's
  |τ| are distinct (a permutation of g·{1 … 1024}), and the models' τ share their sign entry by entry;
- bfloat16 set (Arcee Fusion: a base and one fine-tune): θ0 in [−1, 1] on a grid of 2⁻⁴; every row holds the
  same (θ0, τ) pairs in its own order (so every row has the same KL), τ is 0 for 10/16 of a row, ±0.5 for 4/16
  and ±4 for 2/16: the KL of a row is then large enough for bfloat16's softmax (with τ of a few 2⁻⁶ mergekit's
  bfloat16 KL is rounding noise, negative), and the importance outlier cut, median + 1.5·IQR = 1.5·(the small
  level), lies far from every importance.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from forgetlab.cli import main
from tests.reference_tools import MERGEKIT_YAML, reference_env, skip_without_mergekit

pytestmark = skip_without_mergekit(MERGEKIT_YAML)

EXAMPLES = {
    "arcee_fusion.yml": """\
models:
  - model: model_a
  - model: model_b
merge_method: arcee_fusion
base_model: model_a
dtype: bfloat16
""",
    "bio-merge.yml": """\
models:
  - model: mistralai/Mistral-7B-Instruct-v0.2
    parameters:
      density: 0.5
      weight: 0.5
  - model: BioMistral/BioMistral-7B
    parameters:
      density: 0.5
      weight: 0.5
merge_method: ties
base_model: mistralai/Mistral-7B-v0.1
parameters:
  normalize: false
  int8_mask: true
dtype: float16
""",
    "gradient-slerp.yml": """\
slices:
  - sources:
      - model: psmathur/orca_mini_v3_13b
        layer_range: [0, 40]
      - model: garage-bAInd/Platypus2-13B
        layer_range: [0, 40]
merge_method: slerp
base_model: psmathur/orca_mini_v3_13b
parameters:
  t:
    - filter: self_attn
      value: [0, 0.5, 0.3, 0.7, 1]
    - filter: mlp
      value: [1, 0.5, 0.7, 0.3, 0]
    - value: 0.5 # fallback for rest of tensors
dtype: float16
""",
    "linear.yml": """\
models:
  - model: psmathur/orca_mini_v3_13b
    parameters:
      weight: 1.0
  - model: WizardLM/WizardLM-13B-V1.2
    parameters:
      weight: 0.3
  - model: garage-bAInd/Platypus2-13B
    parameters:
      weight: 0.5
merge_method: linear
dtype: float16
""",
    "orcamini-platy-44layer.yml": """\
slices:
  - sources:
    - model: psmathur/orca_mini_v3_13b
      layer_range: [0, 24]
  - sources:
    - model: garage-bAInd/Platypus2-13B
      layer_range: [20, 40]
merge_method: passthrough
dtype: float16
""",
    "ties.yml": """\
models:
  - model: psmathur/orca_mini_v3_13b
    parameters:
      density: [1, 0.7, 0.1] # density gradient
      weight: 1.0
  - model: garage-bAInd/Platypus2-13B
    parameters:
      density: 0.5
      weight: [0, 0.3, 0.7, 1] # weight gradient
  - model: WizardLM/WizardMath-13B-V1.0
    parameters:
      density: 0.33
      weight:
        - filter: mlp
          value: 0.5
        - value: 0
merge_method: ties
base_model: TheBloke/Llama-2-13B-fp16
parameters:
  normalize: true
  int8_mask: true
dtype: float16
""",
}

# each model of the examples → a tiny checkpoint: (set, name); the 13B Llama-2 fine-tunes and the two 7B Mistrals
# are all the float16 set's fine-tunes of one base, model_a/model_b the bfloat16 set
MODELS = {
    "TheBloke/Llama-2-13B-fp16": ("f16", "base"), "psmathur/orca_mini_v3_13b": ("f16", "ft0"),
    "garage-bAInd/Platypus2-13B": ("f16", "ft1"), "WizardLM/WizardLM-13B-V1.2": ("f16", "ft2"),
    "WizardLM/WizardMath-13B-V1.0": ("f16", "ft2"), "mistralai/Mistral-7B-v0.1": ("f16", "base"),
    "mistralai/Mistral-7B-Instruct-v0.2": ("f16", "ft0"), "BioMistral/BioMistral-7B": ("f16", "ft1"),
    "model_a": ("bf16", "base"), "model_b": ("bf16", "ft0"),
}
G = 2.0 ** -14


def _llama(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def _save(model, state: dict, dtype: torch.dtype, folder: Path) -> None:
    model.load_state_dict(state)
    model.to(dtype).save_pretrained(str(folder))


def _float16_set(root: Path) -> None:
    """A base and three fine-tunes on the exact float16 grid (module docstring)."""
    model = _llama(40)
    g = torch.Generator().manual_seed(41)
    states: list[dict] = [{} for _ in range(4)]
    for name, p in model.state_dict().items():
        n = p.numel()
        assert n <= 1024, (name, n)  # distinct |τ| within a tensor need ≤ 1024 entries
        base = torch.randint(-1023, 1024, (n,), generator=g)
        sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
        states[0][name] = (base * G).reshape(p.shape)
        for i in range(1, 4):
            mag = torch.randperm(1024, generator=g)[:n] + 1
            states[i][name] = ((base + sign * mag) * G).reshape(p.shape)
    for state, folder in zip(states, ("base", "ft0", "ft1", "ft2")):
        _save(model, state, torch.float16, root / folder)


def _bfloat16_set(root: Path) -> None:
    """A base and one fine-tune whose Arcee Fusion mask has no near-tie in bfloat16 (module docstring)."""
    model = _llama(2)
    g = torch.Generator().manual_seed(42)
    base_state, ft_state = {}, {}
    for name, p in model.state_dict().items():
        cols = p.shape[-1]
        assert cols % 16 == 0, (name, p.shape)
        k = cols // 16
        tau = torch.cat([torch.zeros(10 * k), torch.full((4 * k,), 0.5), torch.full((2 * k,), 4.0)])
        tau *= torch.randint(0, 2, (cols,), generator=g) * 2 - 1
        base = torch.randint(-16, 17, (cols,), generator=g) * 2.0 ** -4
        rows = p.numel() // cols
        order = torch.stack([torch.randperm(cols, generator=g) for _ in range(rows)])
        base_state[name] = base[order].reshape(p.shape)
        ft_state[name] = (base + tau)[order].reshape(p.shape)
    _save(model, base_state, torch.bfloat16, root / "base")
    _save(model, ft_state, torch.bfloat16, root / "ft0")



@pytest.fixture(scope="module")
def mergekit_outputs(tmp_path_factory):
    """{example: (its YAML file with the tiny models' paths, mergekit-yaml's output folder)}."""
    root = tmp_path_factory.mktemp("mk-examples")
    _float16_set(root / "f16")
    _bfloat16_set(root / "bf16")
    files = {}
    for name, text in EXAMPLES.items():
        for ref in sorted(MODELS, key=len, reverse=True):  # longest first: no name is part of a longer one then
            text = text.replace(f"model: {ref}\n", f"model: {root.joinpath(*MODELS[ref])}\n")
        assert not any(f"model: {ref}\n" in text for ref in MODELS), text
        files[name] = root / name
        files[name].write_text(text)
    flags = ["--no-write-model-card", "--no-copy-tokenizer", "--no-lazy-unpickle", "--quiet"]
    procs = {name: subprocess.Popen([str(MERGEKIT_YAML), str(f), str(root / f"mk-{name}"), *flags], env=reference_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for name, f in files.items()}
    for name, p in procs.items():
        log, _ = p.communicate(timeout=600)
        assert p.returncode == 0, f"mergekit-yaml {name} failed:\n{log.decode(errors='replace')[-3000:]}"
    return {name: (f, root / f"mk-{name}") for name, f in files.items()}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    t = {}
    for f in sorted(folder.glob("*.safetensors")):
        t.update(load_file(str(f)))
    return t


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_mergekit_example_merges_as_mergekit_does(mergekit_outputs, tmp_path, example):
    recipe, mk_dir = mergekit_outputs[example]
    assert main(["merge", str(recipe), str(tmp_path / "out")]) == 0
    a, b = _tensors(mk_dir), _tensors(tmp_path / "out")
    assert sorted(a) == sorted(b)
    dtype = getattr(torch, yaml.safe_load(EXAMPLES[example])["dtype"])
    assert {t.dtype for t in b.values()} == {dtype}
    # mergekit writes the recipe's dtype too, except arcee_fusion's tensors: its float32 mask promotes them
    assert {t.dtype for t in a.values()} == ({torch.float32} if example == "arcee_fusion.yml" else {dtype})
    eps = torch.finfo(dtype).eps
    changed = 0
    for k in a:
        x, y = a[k].float(), b[k].float()
        # a few units in the last place of the tensor's largest value: mergekit rounds at each step (its sums
        # include θ0), forgetlab once
        tol = 2 * eps * float(torch.maximum(x.abs().max(), y.abs().max()))
        bad = (x - y).abs() > tol
        assert not bad.any(), f"{example} {k}: {int(bad.sum())} of {x.numel()} entries differ by more than " \
                              f"{tol:.2e}, max {float((x - y).abs().max()):.2e}"
        if example != "orcamini-platy-44layer.yml":
            changed += int(not torch.equal(y, _source(recipe, k).float()))
    if example == "orcamini-platy-44layer.yml":  # passthrough copies layers: 24 of one model and 20 of the other
        assert sum(k.endswith("input_layernorm.weight") for k in a) == 44
    else:
        assert changed > len(a) // 2  # the merge is not a copy of an input: the comparison means something


def _source(recipe: Path, name: str) -> torch.Tensor:
    """The tensor `name` of the recipe's first model (its base where it has one)."""
    from forgetlab.core.checkpoints import open_checkpoint

    d = yaml.safe_load(recipe.read_text())
    first = d.get("base_model") or (d.get("models") or d["slices"][0]["sources"])[0]["model"]
    return open_checkpoint(first).read(name)
