"""Issue 46: decoders outside the tested families (forgetlab.core.layouts.FAMILIES), through the CLI as users run it.

- **Unreadable layout** — Falcon with ``new_decoder_architecture`` (its fused ``query_key_value`` groups each kv
  head's queries before its key and value: not GPT-NeoX's order) and CodeGen (its fused ``qkv_proj`` holds q, v, k
  per block of heads: not Phi-3's order): whole-model jobs work (merge TIES and linear, eval, taskvec, linearity at
  the model level, inspect); per-level jobs (linearity's default levels, attribution at head level, features at
  head level) exit 2 with a message naming the tested families and no traceback — never a guessed slice.
- **Readable layout** — StarCoder2 (separate q/k/v/o projections, untested): its head slices pass the numerical
  check (`Anatomy.verify_heads`), a layout with a wrong head size fails it, and the per-level jobs run.

Each pool is a tiny random checkpoint of the family's real transformers config class (2 layers, hidden 32) with the
probe data of tests/conftest.make_tiny_pool; the CLI runs in process (`forgetlab.cli.main`), one command also as a
subprocess.
"""
from __future__ import annotations

import csv
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from safetensors.torch import load_file

from forgetlab.cli import main
from forgetlab.core.anatomy import Anatomy, UnsupportedArchitectureError
from forgetlab.core.layouts import FAMILIES
from tests.conftest import make_tiny_pool


def _config(kind: str, tok):
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if kind == "falcon":
        return transformers.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
                                         new_decoder_architecture=True, max_position_embeddings=256,
                                         pad_token_id=tok.pad_token_id, **ids)
    if kind == "codegen":
        return transformers.CodeGenConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=256, n_ctx=256,
                                          **ids)
    return transformers.Starcoder2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                         pad_token_id=tok.pad_token_id, **ids)


def foreign_pool(root: Path, kind: str):
    """A tiny pool (tests/conftest.make_tiny_pool's tokenizer, probes and pool.yaml) whose base and two fine-tunes
    (θ0 + 0.02·noise) are random `kind` models; the fine-tunes are named after the pool's tasks."""
    pool = make_tiny_pool(root, "llama")
    tok = transformers.AutoTokenizer.from_pretrained(str(pool.base))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(kind, tok)).eval()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    for i, folder in enumerate([pool.base, *pool.finetuned.values()]):
        for f in (*folder.glob("*.safetensors"), folder / "config.json"):
            f.unlink()
        if i:
            g = torch.Generator().manual_seed(100 + i)
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(base[n] + 0.02 * torch.randn(p.shape, generator=g))
        model.save_pretrained(str(folder))
    spec = yaml.safe_load(pool.pool_yaml.read_text())
    spec["models"] = {"math": "ft0", "copy": "ft1"}
    pool.pool_yaml.write_text(yaml.safe_dump(spec, sort_keys=False))
    return pool


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    root = tmp_path_factory.mktemp("foreign")
    return {k: foreign_pool(root / k, k) for k in ("falcon", "codegen", "starcoder2")}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))


def cli(capsys, *argv) -> tuple[int, str, str]:
    """`forgetlab ARGV` in process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    t = {}
    for f in folder.glob("*.safetensors"):
        t.update(load_file(str(f)))
    return t


def _rows(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


UNREADABLE = ("falcon", "codegen")
PER_LEVEL = {
    "linearity": ["linearity", "{pool}", "--model", "math", "--task", "math", "--samples", "2", "--alphas", "0,0.5", "--no-save"],
    "attribution-head": ["attribution", "{pool}", "--model", "math", "--level", "head", "--max-general", "2",
                         "--max-task", "2", "--no-save"],
    "features-head": ["features", "{pool}", "--level", "head", "--layer", "0", "--head", "1", "--tasks", "math",
                      "--samples", "4", "--perplexity", "2", "--no-save"],
}


@pytest.mark.parametrize("kind", UNREADABLE)
def test_whole_model_jobs_work(pools, capsys, tmp_path, kind):
    pool = pools[kind]
    p = str(pool.pool_yaml)
    ft = [str(f) for f in pool.finetuned.values()]
    # merges: TIES and a linear merge whose every tensor is the mean of the two fine-tunes
    recipes = {"ties": {"method": "ties", "base": str(pool.base), "models": ft, "params": {"keep": 0.3}},
               "linear": {"method": "linear", "models": ft}}
    for name, rec in recipes.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(rec))
        rc, _, err = cli(capsys, "merge", tmp_path / f"{name}.yaml", tmp_path / name)
        assert rc == 0, err
    a, b, base = (_tensors(Path(f)) for f in (*ft, pool.base))
    merged = _tensors(tmp_path / "linear")
    assert set(merged) == set(a)
    assert max(float((merged[k] - (a[k] + b[k]) / 2).abs().max()) for k in a) <= 1e-6
    ties = _tensors(tmp_path / "ties")
    assert set(ties) == set(base) and any(float((ties[k] - base[k]).abs().max()) > 1e-4 for k in base)
    assert transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ties")).config.model_type == kind

    rc, out, err = cli(capsys, "eval", p, "--max-general", "2", "--max-task", "2", "--no-lm-eval",
                       "--out", tmp_path / "eval.csv")
    assert rc == 0, err
    assert {r["model"] for r in _rows(tmp_path / "eval.csv")} >= {"base", "math", "copy"}
    rc, out, err = cli(capsys, "taskvec", p, "--no-save", "--out", tmp_path / "tv.csv")
    assert rc == 0, err
    assert _rows(tmp_path / "tv.csv")
    rc, out, err = cli(capsys, "linearity", p, "--levels", "model", "--model", "math", "--task", "math", "--samples", "2",
                       "--alphas", "0,0.5", "--no-save", "--out", tmp_path / "nls.csv")
    assert rc == 0, err
    rows = _rows(tmp_path / "nls.csv")
    assert [r["level"] for r in rows] == ["model"] and float(rows[0]["nls_mean"]) > 0
    rc, out, err = cli(capsys, "inspect", pool.base)
    assert rc == 0, err
    assert kind in out and "Tested families:" in out   # why there are no per-level counts


@pytest.mark.parametrize("job", PER_LEVEL)
@pytest.mark.parametrize("kind", UNREADABLE)
def test_per_level_jobs_exit_2_naming_the_families(pools, capsys, kind, job):
    argv = [a.format(pool=pools[kind].pool_yaml) for a in PER_LEVEL[job]]
    rc, out, err = cli(capsys, *argv)
    assert rc == 2, (out, err)
    assert f"model_type={kind}" in err and "Traceback" not in out + err
    for name, types in FAMILIES.items():
        assert f"{name} ({', '.join(types)})" in err
    assert "'model' level" in err   # what still works
    assert "forgetlab/core/layouts.py" in err   # what another family would take


def test_a_refused_job_as_a_user_runs_it(pools, tmp_path):
    """The same refusal in a fresh `forgetlab` process: exit 2, one error line, no traceback."""
    env = dict(os.environ, FORGETLAB_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    argv = [a.format(pool=pools["falcon"].pool_yaml) for a in PER_LEVEL["linearity"]]
    proc = subprocess.run([sys.executable, "-m", "forgetlab", *argv], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "forgetlab: error:" in proc.stderr and "Llama (llama)" in proc.stderr


def test_readable_untested_family_passes_the_head_check(pools):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(pools["starcoder2"].base)).eval()
    anatomy = Anatomy.from_model(model)
    assert anatomy.model_type == "starcoder2" and anatomy.family == "llama"
    assert anatomy.head_error is None and anatomy.check_level("head") == "head"
    # the same model read with a wrong head size (8 heads of 4): head 1's query rows are head 0's second half,
    # so the check moves head 0 too and refuses the head level, leaving the others
    wrong = Anatomy(dataclasses.replace(anatomy.layout, num_heads=8, num_kv_heads=4, head_dim=4), anatomy.names)
    wrong.verify_heads(model)
    assert wrong.head_error and "numerical check" in wrong.head_error
    with pytest.raises(UnsupportedArchitectureError):
        wrong.check_level("head")
    assert wrong.check_level("attn") == "attn"


def test_readable_untested_family_runs_per_level_jobs(pools, capsys, tmp_path):
    p = pools["starcoder2"].pool_yaml
    rc, out, err = cli(capsys, "linearity", p, "--model", "math", "--task", "math", "--samples", "2", "--alphas", "0,0.5",
                       "--no-save", "--out", tmp_path / "nls.csv")
    assert rc == 0, err
    rows = _rows(tmp_path / "nls.csv")
    heads = [r for r in rows if r["level"] == "head"]
    assert len(heads) == 2 * 4 and all(float(r["nls_mean"]) >= 0 for r in heads)
    assert {r["level"] for r in rows} >= {"model", "layer", "attn", "mlp", "head"}
    rc, out, err = cli(capsys, "attribution", p, "--model", "math", "--level", "head", "--max-general", "2",
                       "--max-task", "2", "--no-save", "--out", tmp_path / "attr.csv")
    assert rc == 0, err
    assert _rows(tmp_path / "attr.csv")
    rc, out, err = cli(capsys, "features", p, "--level", "head", "--layer", "0", "--head", "1", "--tasks", "math",
                       "--samples", "4", "--perplexity", "2", "--no-save", "--out", tmp_path / "feat.csv")
    assert rc == 0, err
    assert _rows(tmp_path / "feat.csv")
