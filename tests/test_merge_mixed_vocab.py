"""Mixed vocabularies (issue 25; mergekit issues #47, #139, #425): fine-tunes with added tokens or a resized
vocabulary, merged with `tokenizer_source: union | base | MODEL` and the `tokenizer:` block (tokens, force,
pad_to_multiple_of) by mergekit 0.1.5 (`mergekit-multi`, one call) and by forgetlab from the same YAML: the same
tensors within 1e-5 (embed_tokens and lm_head included: permuted rows, rows filled from the base / the one model
that has the token / the mean / zeros, padding rows), the same vocabulary and vocab_size; plus hand-computed
rows of the fill rules, independent of mergekit.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from forgetlab.merge import run
from tests.conftest import make_tiny_pool
from tests.reference_tools import MERGEKIT_MULTI, reference_env, skip_without_mergekit

needs_mergekit = skip_without_mergekit(MERGEKIT_MULTI)

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _with_tokens(src: Path, dst: Path, tokens: list[str], seed: int, pad_to: int | None = None) -> Path:
    """A fine-tune of `src` with `tokens` added to its tokenizer, its embeddings resized (to a multiple of `pad_to`
    if given: rows no token uses) and the new rows (and the rest, slightly) perturbed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(src))
    model = AutoModelForCausalLM.from_pretrained(str(src))
    tok.add_tokens(tokens)
    model.resize_token_embeddings(len(tok), pad_to_multiple_of=pad_to, mean_resizing=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    model.save_pretrained(str(dst))
    tok.save_pretrained(str(dst))
    return dst


@pytest.fixture(scope="module")
def vpool(tmp_path_factory):
    """base, `plain` (the base's vocabulary), `a` (+<calc>, <tool>), `b` (+<tool>, <code>; embeddings padded to a
    multiple of 16)."""
    root = tmp_path_factory.mktemp("mixed-vocab")
    pool = make_tiny_pool(root, "llama", n_finetuned=1)
    return {"base": str(pool.base), "plain": str(pool.finetuned["ft0"]),
            "a": str(_with_tokens(pool.base, root / "ft-a", ["<calc>", "<tool>"], 1)),
            "b": str(_with_tokens(pool.base, root / "ft-b", ["<tool>", "<code>"], 2, pad_to=16))}


def cases(p) -> dict[str, dict]:
    f32 = {"dtype": "float32"}
    return {
        "ta_union": {"merge_method": "task_arithmetic", "base_model": p["base"],
                     "models": [{"model": p["a"], "parameters": {"weight": 1.0}},
                                {"model": p["b"], "parameters": {"weight": 0.5}},
                                {"model": p["plain"], "parameters": {"weight": 0.3}}],
                     "tokenizer_source": "union", **f32},
        "linear_union_nobase": {"merge_method": "linear",
                                "models": [{"model": p["a"], "parameters": {"weight": 1.0}},
                                           {"model": p["b"], "parameters": {"weight": 2.0}}],
                                "tokenizer_source": "union", **f32},
        "ties_model_source": {"merge_method": "ties", "base_model": p["base"],
                              "models": [{"model": p["a"], "parameters": {"weight": 1.0, "density": 0.5}},
                                         {"model": p["b"], "parameters": {"weight": 1.0, "density": 0.5}}],
                              "tokenizer_source": p["b"], **f32},
        "ta_base_source": {"merge_method": "task_arithmetic", "base_model": p["base"],
                           "models": [{"model": p["a"], "parameters": {"weight": 1.0}},
                                      {"model": p["b"], "parameters": {"weight": 1.0}}],
                           "tokenizer_source": "base", **f32},
        "slerp_tokens_block": {"merge_method": "slerp", "base_model": p["base"],
                               "models": [{"model": p["a"]}], "parameters": {"t": 0.4},
                               "tokenizer": {"source": "union", "pad_to_multiple_of": 64,
                                             "tokens": {"<calc>": {"source": p["a"], "force": False},
                                                        "<tool>": {"source": {"kind": "zero"}, "force": True},
                                                        "<s>": {"source": {"kind": "model_token", "model": p["a"],
                                                                           "token": "<calc>"}, "force": True},
                                                        "<new>": {"source": {"kind": "model_token",
                                                                             "model": p["base"], "token_id": 5}}}},
                               **f32},
        "karcher_union": {"merge_method": "karcher", "base_model": p["base"], "models": [{"model": p["a"]},
                                                                                          {"model": p["b"]}],
                          "tokenizer_source": "union", **f32},
    }


@pytest.fixture(scope="module")
def merged(vpool, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed-out")
    docs = cases(vpool)
    ours = {n: run(d, root / "ours" / n).out_dir for n, d in docs.items()}
    multi = root / "multi.yaml"
    multi.write_text(yaml.safe_dump_all([{**d, "name": f"out-{n}"} for n, d in docs.items()], sort_keys=False))
    proc = subprocess.run([str(MERGEKIT_MULTI), str(multi), "-I", str(root / "mk"), "--no-lazy", "--no-write-model-card",
                           "--quiet"], env=reference_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"mergekit-multi failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return {n: (root / "mk" / f"out-{n}", ours[n]) for n in docs}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update({k: v.float() for k, v in load_file(str(f)).items()})
    return out


def _vocab(folder: Path) -> dict[str, int]:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder)).get_vocab()


@needs_mergekit
@pytest.mark.parametrize("case", list(cases({k: k for k in ("base", "plain", "a", "b")})))
def test_same_vocabulary_and_tensors_as_mergekit(merged, case):
    _assert_same_as_mergekit(*merged[case], case)


@needs_mergekit
@pytest.mark.parametrize("case", ["ta_union", "ta_base_source", "ties_model_source"])
def test_cli_merges_mixed_vocabularies_like_mergekit(vpool, merged, tmp_path, capsys, case):
    """`forgetlab merge` (and --dry-run) refused these recipes ("a vocabulary of 302 tokens but the base has 300 …
    resize the embeddings"): its memory estimate checked the vocabulary sizes before the recipe's tokenizer
    aligned them. The command's output equals mergekit's from the same YAML."""
    from forgetlab.cli import main

    recipe = tmp_path / f"{case}.yaml"
    recipe.write_text(yaml.safe_dump(cases(vpool)[case], sort_keys=False))
    out = tmp_path / "out"
    assert main(["merge", str(recipe), str(out), "--dry-run"]) == 0, capsys.readouterr().err
    assert "token rows aligned" in capsys.readouterr().out and not out.exists()
    assert main(["merge", str(recipe), str(out)]) == 0, capsys.readouterr().err
    _assert_same_as_mergekit(merged[case][0], out, case)


def _assert_same_as_mergekit(mk: Path, ours: Path, case: str) -> None:
    va, vb = _vocab(mk), _vocab(ours)
    # the same tokens; the ids of tokens that only non-base models add follow mergekit's set() of models (an
    # order that changes with PYTHONHASHSEED), forgetlab's follow the recipe's order, so rows are compared by token
    assert set(va) == set(vb) and sorted(va.values()) == sorted(vb.values())
    assert {t: i for t, i in va.items() if i < 300} == {t: i for t, i in vb.items() if i < 300}  # the base's 300
    cfg = [json.loads((d / "config.json").read_text())["vocab_size"] for d in (mk, ours)]
    assert cfg[0] == cfg[1]
    a, b = _tensors(mk), _tensors(ours)
    assert set(a) == set(b)
    assert a[EMBED].shape[0] == cfg[0]
    order_a = torch.tensor([va[t] for t in va])
    order_b = torch.tensor([vb[t] for t in va])
    for k in a:
        assert a[k].shape == b[k].shape, k
        if k in (EMBED, HEAD):
            n = len(va)
            if a[k].shape[0] > n:  # padding rows: each input's mean row, merged
                assert float((a[k][n:] - b[k][n:]).abs().max()) <= 1e-5
            a[k], b[k] = a[k][order_a], b[k][order_b]
        worst = float((a[k] - b[k]).abs().max())
        assert worst <= 1e-5, f"{case} {k}: max |mergekit − forgetlab| = {worst}"


def _rows(path: str, name: str = EMBED) -> tuple[torch.Tensor, dict[str, int]]:
    return _tensors(Path(path))[name], _vocab(Path(path))


def test_union_rows_follow_mergekit_rules_by_hand(vpool, tmp_path):
    """linear (no base) over a and b with the union vocabulary: a token both have is the weighted mean of their
    rows (at each model's own id); <calc> (only a) is a's row; <code> (only b) b's row, everywhere — so the merge
    gives exactly that row. b's padding rows are dropped: vocab_size is the union's size."""
    out = run(cases(vpool)["linear_union_nobase"], tmp_path / "o").out_dir
    merged, vocab = _rows(out)
    ea, va = _rows(vpool["a"])
    eb, vb = _rows(vpool["b"])
    assert set(vocab) == set(va) | set(vb)
    assert merged.shape[0] == len(vocab) == json.loads((out / "config.json").read_text())["vocab_size"]
    assert eb.shape[0] > len(vb)  # b's embeddings are padded beyond its tokenizer
    for tok in ("<pad>", "<tool>"):  # both have it: (1·a + 2·b)/3 at their own ids
        want = (1.0 * ea[va[tok]] + 2.0 * eb[vb[tok]]) / 3.0
        assert torch.allclose(merged[vocab[tok]], want, atol=1e-6), tok
    assert torch.allclose(merged[vocab["<calc>"]], ea[va["<calc>"]], atol=1e-6)
    assert torch.allclose(merged[vocab["<code>"]], eb[vb["<code>"]], atol=1e-6)


def test_base_row_preferred_and_tokens_block_by_hand(vpool, tmp_path):
    """task arithmetic (θ0 + 0.5·(θa − θ0)) with the `tokenizer:` block: a forced zero row is zero in every input,
    so the merge's row is 0; a token_id source gives every input the base's row 5; <calc> (only a has it,
    source a): the base's aligned row is a's too, so the merge keeps it; pad_to_multiple_of pads to 64."""
    d = {**cases(vpool)["slerp_tokens_block"], "merge_method": "task_arithmetic", "parameters": {},
         "models": [{"model": vpool["a"], "parameters": {"weight": 0.5}}]}
    out = run(d, tmp_path / "o").out_dir
    merged, vocab = _rows(out)
    assert merged.shape[0] % 64 == 0 and merged.shape[0] > len(vocab)
    assert float(merged[vocab["<tool>"]].abs().max()) == 0.0
    assert "<new>" in vocab
    e0, _ = _rows(vpool["base"])
    assert torch.allclose(merged[vocab["<new>"]], e0[5], atol=1e-6)  # both inputs get the base's row 5
    ea, va = _rows(vpool["a"])
    assert torch.allclose(merged[vocab["<calc>"]], ea[va["<calc>"]], atol=1e-5)


def test_tokenizer_source_not_among_the_models_is_refused_before_writing(vpool, tmp_path):
    from forgetlab.core.errors import ParameterError
    d = {**cases(vpool)["ta_union"], "tokenizer_source": vpool["plain"] + "-missing"}
    d.pop("dtype")
    with pytest.raises(ParameterError, match="not among the recipe's models"):
        run(d, tmp_path / "o")
    assert not (tmp_path / "o").exists()
