"""The streaming engine: streamed == in-memory, global statistics == whole-vector ones, atomic output,
LoRA adapters, and bad input (existing output, failure half-way, incompatible models)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.errors import IncompatibleModelsError, OutputExistsError, ParameterError, WorkspaceError
from forgetlab.merge import METHODS, merge_state_dicts, run
from forgetlab.merge.methods import pcb as pcbmod
from forgetlab.merge.core import CheckpointSource, check_compatible, collect_stats
from forgetlab.merge.recipes import Recipe


def _load_folder(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _recipe(pool, method, params, n=2):
    return {"method": method, "base": str(pool.base), "models": [str(p) for p in list(pool.finetuned.values())[:n]],
            "params": params}


def _in_memory(pool, method, params, n=2):
    base = open_checkpoint(pool.base)
    fts = [open_checkpoint(p).state_dict() for p in list(pool.finetuned.values())[:n]]
    return merge_state_dicts(method, base.state_dict(), fts, config=base.config, **params)


CASES = [("ties", {"scope": "global", "keep": 0.3}), ("ties", {"keep": 0.3}), ("pcb", {}),
         ("pcb", {"scope": "tensor", "lam": [0.5, 1.5]}), ("dare_ties", {"drop": 0.5, "seed": 11}),
         ("hma", {"alphas": [0.2, 0.9]}), ("fapm", {"ratio": 0.7}), ("breadcrumbs", {"keep": 0.3, "gamma": 0.05}),
         ("consensus", {"k": 1}), ("linear", {"weights": [1, 3]})]


@pytest.mark.parametrize("method,params", CASES)
def test_streaming_equals_in_memory(tiny_llama, tmp_path, method, params):
    n = 1 if method == "hma" else 2
    res = run(_recipe(tiny_llama, method, params, n), tmp_path / "out", max_shard_bytes=30_000)
    got = _load_folder(res.out_dir)
    exp = _in_memory(tiny_llama, method, params, n)
    assert set(got) == set(exp)
    for k in exp:
        assert torch.equal(got[k], exp[k]), k
    assert (res.out_dir / "model.safetensors.index.json").exists()  # sharded
    assert (res.out_dir / "config.json").exists() and (res.out_dir / "tokenizer.json").exists()
    saved = Recipe.from_dict(yaml.safe_load((res.out_dir / "recipe.yaml").read_text()))
    assert saved.method == method


def test_merged_folder_loads_as_a_model(tiny_llama, tmp_path):
    from forgetlab.core.checkpoints import load_model
    res = run(_recipe(tiny_llama, "task_arithmetic", {"lam": 0.5}), tmp_path / "m")
    model = load_model(res.out_dir)
    ids = torch.tensor([[1, 5, 7]])
    assert torch.isfinite(model(ids).logits).all()


def _concat_taus(pool, n=2):
    base = open_checkpoint(pool.base)
    names = [nm for nm in base.names()]
    b = torch.cat([base.read(nm).reshape(-1) for nm in names])
    taus = []
    for p in list(pool.finetuned.values())[:n]:
        c = open_checkpoint(p)
        taus.append(torch.cat([c.read(nm).reshape(-1) for nm in names]) - b)
    return names, taus


def _sources(pool, n=2):
    base = CheckpointSource(open_checkpoint(pool.base))
    models = [CheckpointSource(open_checkpoint(p)) for p in list(pool.finetuned.values())[:n]]
    return base, models, check_compatible(base, models)


def kth_largest(values: torch.Tensor, k: int) -> float | None:
    """The reference for the streamed selections: torch.kthvalue over the whole vector held in memory."""
    flat = values.reshape(-1).to(torch.float32)
    return None if k <= 0 else float(torch.kthvalue(flat, flat.numel() - k + 1).values)


def test_global_ties_thresholds_equal_whole_vector_kth_largest(tiny_llama):
    base, models, entries = _sources(tiny_llama)
    params = {"keep": 0.25, "scope": "global", "lam": 1.0, "weights": [1.0, 1.0]}
    thr = collect_stats(METHODS["ties"], params, base, models, entries)
    _, taus = _concat_taus(tiny_llama)
    k = int(0.25 * taus[0].numel())
    assert thr == [kth_largest(t.abs(), k) for t in taus]
    # and the merged result equals TIES applied to the whole flattened vector
    whole = {**params, "scope": "tensor"}  # one tensor holding everything: plain top-k, no streaming statistics
    merged = merge_state_dicts("ties", {"v": torch.zeros_like(taus[0])}, [{"v": t} for t in taus], **whole)["v"]
    exp = torch.cat([v.reshape(-1) - open_checkpoint(tiny_llama.base).read(k_) .reshape(-1)
                     for k_, v in _in_memory(tiny_llama, "ties", params).items()])
    assert torch.allclose(merged, exp, atol=1e-6)


def test_global_pcb_statistics_equal_whole_vector_computation(tiny_llama):
    base, models, entries = _sources(tiny_llama)
    st = collect_stats(METHODS["pcb"], {"keep": 0.2, "lam": [1.0, 1.0], "scope": "global"}, base, models, entries)
    _, taus = _concat_taus(tiny_llama)
    n01 = lambda x: (x - x.min()) / (x.max() - x.min())  # noqa: E731
    intra0 = torch.softmax(2 * n01(taus[0] ** 2).double(), 0)
    inter0 = torch.softmax(n01(taus[0] ** 2).double(), 0) + torch.softmax(n01(taus[0] * taus[1]).double(), 0)
    assert st.lo[(0, 1)] == float((taus[0] * taus[1]).min()) and st.hi[(0, 0)] == float((taus[0] ** 2).max())
    assert st.z_intra[0] == pytest.approx(float(torch.exp(2 * n01(taus[0] ** 2).double()).sum()), rel=1e-6)
    beta0 = (intra0 * inter0).float()
    k = int(0.2 * taus[0].numel())
    assert st.thresholds[0] == pytest.approx(kth_largest(beta0, k), rel=1e-5)
    # merged global PCB == PCB with statistics of the concatenated vector
    whole = pcbmod.pcb_merge(taus, keep=0.2, lam=1.0)
    got = _in_memory(tiny_llama, "pcb", {"scope": "global"})
    b = open_checkpoint(tiny_llama.base)
    streamed = torch.cat([got[nm].reshape(-1) - b.read(nm).reshape(-1) for nm in b.names()])
    assert torch.allclose(streamed, whole, atol=1e-6)


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def test_failure_half_way_leaves_no_output_and_inputs_untouched(tiny_llama, tmp_path, monkeypatch):
    before = _tree_digest(tiny_llama.root)
    spec = METHODS["task_arithmetic"]
    calls = {"n": 0}
    original = spec.merge

    def failing(job):
        calls["n"] += 1
        if calls["n"] == 8:
            raise OSError("simulated disk failure")
        return original(job)

    import dataclasses
    METHODS.replace("task_arithmetic", dataclasses.replace(spec, merge=failing))
    try:
        with pytest.raises(OSError, match="simulated"):
            run(_recipe(tiny_llama, "task_arithmetic", {}), tmp_path / "out", max_shard_bytes=30_000)
    finally:
        METHODS.replace("task_arithmetic", spec)
    assert calls["n"] == 8
    assert list(tmp_path.iterdir()) == []  # neither the output nor a temporary folder
    assert _tree_digest(tiny_llama.root) == before


def test_write_error_leaves_no_output(tiny_llama, tmp_path, monkeypatch):
    import forgetlab.core.checkpoints.writing as ck
    orig = ck._ShardStream.write
    state = {"n": 0}

    def bad_write(self, name, tensor):
        state["n"] += 1
        if state["n"] == 5:
            raise OSError(28, "No space left on device")
        return orig(self, name, tensor)

    monkeypatch.setattr(ck._ShardStream, "write", bad_write)
    with pytest.raises(WorkspaceError, match="No space left.*nothing was written"):
        run(_recipe(tiny_llama, "ties", {}), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_refused_unless_overwrite(tiny_llama, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="overwrite"):
        run(_recipe(tiny_llama, "linear", {}), out)
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(OutputExistsError, match="not written by forgetlab"):   # not ours: never replaced
        run(_recipe(tiny_llama, "linear", {}), out, overwrite=True)
    assert (out / "keep.txt").read_text() == "mine"
    ours = tmp_path / "ours"
    run(_recipe(tiny_llama, "linear", {}), ours)
    (ours / "notes.txt").write_text("the user's, added after the first merge")
    with pytest.raises(OutputExistsError, match="notes.txt"):                # ours, but holding the user's file
        run(_recipe(tiny_llama, "linear", {}), ours, overwrite=True)
    assert (ours / "notes.txt").read_text() == "the user's, added after the first merge"
    (ours / "notes.txt").unlink()
    run(_recipe(tiny_llama, "linear", {}), ours, overwrite=True)
    (ours / "recipe.yaml").write_text("edited")       # issue 41: a file of ours the user changed is theirs now
    with pytest.raises(OutputExistsError, match="changed since forgetlab wrote them: recipe.yaml"):
        run(_recipe(tiny_llama, "linear", {}), ours, overwrite=True)
    assert (ours / "recipe.yaml").read_text() == "edited"


def test_incompatible_models_are_refused_before_writing(tiny_llama, tiny_gpt2, tmp_path):
    r = {"method": "task_arithmetic", "base": str(tiny_llama.base), "models": [str(tiny_gpt2.finetuned["ft0"])]}
    with pytest.raises(IncompatibleModelsError):
        run(r, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_recipe_without_models_or_with_bad_params(tiny_llama, tmp_path):
    with pytest.raises(ParameterError, match="no fine-tuned model"):
        run({"method": "ties", "base": str(tiny_llama.base), "models": []}, tmp_path / "o")
    with pytest.raises(ParameterError, match="keep"):
        run(_recipe(tiny_llama, "ties", {"keep": -1}), tmp_path / "o")
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="cuda"):
            run(_recipe(tiny_llama, "ties", {}), tmp_path / "o", device="cuda")


def _make_lora(pool, tmp_path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(pool.base))
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    peft_model = get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    out = tmp_path / "lora"
    peft_model.save_pretrained(str(out))
    return out


def test_fapm_on_a_lora_adapter_prunes_its_delta(tiny_llama, tmp_path):
    lora = _make_lora(tiny_llama, tmp_path)
    ck = open_checkpoint(lora, base=tiny_llama.base)
    res = run({"method": "fapm", "base": str(tiny_llama.base), "models": [str(lora)], "params": {"ratio": 0.5}},
              tmp_path / "out")
    got = _load_folder(res.out_dir)
    base = open_checkpoint(tiny_llama.base)
    from forgetlab.merge.methods.fapm import fapm_prune
    target = ck.delta_names()[0]
    d = ck.delta(target)
    exp = base.read(target) + fapm_prune(d, base.read(target), 0.5)
    assert torch.allclose(got[target], exp, atol=1e-6)
    untouched = "model.embed_tokens.weight"
    assert torch.equal(got[untouched], base.read(untouched))
    # LoRA task vector merged with a full fine-tune by task arithmetic
    r2 = run({"method": "task_arithmetic", "base": str(tiny_llama.base),
              "models": [str(lora), str(tiny_llama.finetuned["ft0"])]}, tmp_path / "out2")
    got2 = _load_folder(r2.out_dir)
    ft0 = open_checkpoint(tiny_llama.finetuned["ft0"]).read(target)
    assert torch.allclose(got2[target], ft0 + d, atol=1e-6)


def test_progress_reaches_one(tiny_llama, tmp_path):
    seen = []
    run(_recipe(tiny_llama, "pcb", {}), tmp_path / "out", progress=lambda f, m: seen.append(f))
    assert seen[-1] == 1.0 and all(0 <= f <= 1 for f in seen)
    assert seen == sorted(seen)


def test_checkpoint_source_reads_owned_copies_equal_to_the_checkpoint(tiny_llama):
    ck = open_checkpoint(tiny_llama.base)
    src = CheckpointSource(ck)
    assert src._pread is not None  # plain reads, not a memory map: peak RSS stays at a few tensors
    for name in ck.names()[:5]:
        t = src.read(name)
        assert torch.equal(t, ck.read(name))
        t.add_(1.0)  # the job may work in place: the next read is unaffected
        assert torch.equal(src.read(name), ck.read(name))


def test_output_dtype_from_the_recipe(tiny_llama, tmp_path):
    r = _recipe(tiny_llama, "task_arithmetic", {"lam": 0.5})
    r["dtype"] = "bfloat16"
    res = run(r, tmp_path / "bf16")
    got = _load_folder(res.out_dir)
    assert {t.dtype for t in got.values()} == {torch.bfloat16}
    assert json.loads((res.out_dir / "config.json").read_text())["dtype"] == "bfloat16"
    exp = _in_memory(tiny_llama, "task_arithmetic", {"lam": 0.5})
    k = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(got[k], exp[k].to(torch.bfloat16))


def test_a_fine_tune_of_another_architecture_is_refused_by_merge_as_by_the_pool(tiny_llama, tmp_path):
    """A 'Mistral' fine-tune with exactly the Llama base's tensor names and shapes: the pool refused it, the merge
    merged it. Both now run one check (forgetlab.core.pool.check_same_architecture)."""
    import json
    import shutil

    from forgetlab.core.pool import ModelPool

    other = tmp_path / "mistral-ft"
    shutil.copytree(tiny_llama.finetuned["ft0"], other)
    cfg = json.loads((other / "config.json").read_text())
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"])
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleModelsError, match="is a mistral model but the base is a llama model"):
        run({"method": "task_arithmetic", "base": str(tiny_llama.base), "models": [str(other)]}, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(IncompatibleModelsError, match="is a mistral model but the base is a llama model"):
        ModelPool(str(tiny_llama.base), {"m": str(other)})


def test_tied_tensors_are_one_tensor_in_memory_as_on_disk(tiny_gpt2, tmp_path):
    """A tied model's state dict names the embedding twice (wte and lm_head): DARE drew a mask per name, so the
    in-memory merge disagreed with the streamed one (which merges the tied tensor once)."""
    from safetensors.torch import load_file

    from forgetlab.core.checkpoints import load_model

    base = load_model(tiny_gpt2.base).state_dict()
    fts = [load_model(p).state_dict() for p in tiny_gpt2.finetuned.values()]
    assert base["lm_head.weight"].data_ptr() == base["transformer.wte.weight"].data_ptr()   # really tied
    merged = merge_state_dicts("dare_linear", base, fts, drop=0.5, seed=3)
    assert merged["lm_head.weight"] is merged["transformer.wte.weight"]
    run({"method": "dare_linear", "base": str(tiny_gpt2.base), "models": [str(p) for p in tiny_gpt2.finetuned.values()],
         "params": {"drop": 0.5, "seed": 3}}, tmp_path / "streamed")
    streamed = load_file(tmp_path / "streamed" / "model.safetensors")
    assert torch.equal(merged["transformer.wte.weight"], streamed["transformer.wte.weight"])


def test_a_fine_tune_that_unties_the_head_of_a_tied_base_is_refused(tiny_gpt2, tmp_path):
    """Its own head would be dropped without a word (the merged logits were 15.3 away from the fine-tune's)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from forgetlab.core.checkpoints import load_model

    untied = tmp_path / "untied"
    shutil.copytree(tiny_gpt2.finetuned["ft0"], untied)
    weights = load_file(untied / "model.safetensors")
    weights["lm_head.weight"] = weights["transformer.wte.weight"] * 1.5
    save_file(weights, str(untied / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((untied / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (untied / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleModelsError, match="unties it .*would keep the base's tied head"):
        run({"method": "task_arithmetic", "base": str(tiny_gpt2.base), "models": [str(untied)]}, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    base = load_model(tiny_gpt2.base).state_dict()
    ft = {k: v.clone() for k, v in base.items()}
    ft["lm_head.weight"] = base["lm_head.weight"] * 1.5
    with pytest.raises(IncompatibleModelsError, match="has its own lm_head.weight"):
        merge_state_dicts("task_arithmetic", base, [ft])


def test_a_bin_fine_tune_storing_its_tied_head_is_merged_in_memory_as_on_disk(tiny_gpt2, tmp_path):
    """`search` and `pcb-search` (in-memory merges of checkpoint state dicts) refused a `.bin` fine-tune that stores
    its tied head, which `merge` accepts, with "…that the base the base lacks"."""
    import shutil

    from forgetlab.analysis.lambda_search import pcb_components
    from forgetlab.core.checkpoints import load_model, open_checkpoint

    ft_bin = tmp_path / "ft-bin"
    ft_bin.mkdir()
    for f in tiny_gpt2.finetuned["ft0"].iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, ft_bin / f.name)
    torch.save(load_model(tiny_gpt2.finetuned["ft0"]).state_dict(), ft_bin / "pytorch_model.bin")
    base = open_checkpoint(tiny_gpt2.base)
    ft = open_checkpoint(ft_bin, base=base).state_dict()
    assert "lm_head.weight" in ft and "lm_head.weight" not in base.state_dict()
    merged = merge_state_dicts("task_arithmetic", base.state_dict(), [ft])
    assert "lm_head.weight" not in merged
    assert torch.equal(merged["transformer.wte.weight"], ft["transformer.wte.weight"])   # λ = 1, one model
    assert len(pcb_components(base.state_dict(), [ft, ft], keep=0.5)) == 2
    other = dict(ft)
    other["extra.weight"] = torch.zeros(3)
    with pytest.raises(IncompatibleModelsError, match=r"has a tensor 'extra.weight' that the base lacks"):
        merge_state_dicts("task_arithmetic", base.state_dict(), [other])


@pytest.mark.parametrize("method,params", [("pcb", {}), ("ties", {"scope": "global", "keep": 0.3}),
                                           ("localize_stitch", {})])
def test_inputs_kept_on_the_device_are_read_once_with_the_same_result(tiny_llama, tmp_path, monkeypatch, method,
                                                                      params):
    """A global method on a device with room (CUDA: `resident_budget`) reads each checkpoint tensor once and keeps
    it for its later passes and the merge: the same bytes as reading the files every pass."""
    import forgetlab.merge.engine as engine
    from forgetlab.merge.core import TensorReader

    loads = []
    real_load = TensorReader._load
    monkeypatch.setattr(TensorReader, "_load", lambda self, entries, i, busy: (loads.append(entries[i].name),
                                                                              real_load(self, entries, i, busy))[1])
    plain = run(_recipe(tiny_llama, method, params, 2), tmp_path / "plain")
    reads_plain = len(loads)
    loads.clear()
    monkeypatch.setattr(engine, "resident_budget", lambda device: 1 << 40)
    kept = run(_recipe(tiny_llama, method, params, 2), tmp_path / "kept")
    got, exp = _load_folder(kept.out_dir), _load_folder(plain.out_dir)
    assert set(got) == set(exp) and all(torch.equal(got[k], exp[k]) for k in exp)
    assert len(loads) == len(set(loads))                     # every tensor read once
    assert reads_plain >= 3 * len(loads)                     # instead of once per pass and for the merge
