"""Every job runs on every tested decoder family (issue 46): inspect, taskvec, eval, linearity at every level the
model has, attribution (layer, module, head; expert for a mixture of experts), features, the text view, the sweeps,
every merge method of the registry, the what-if fine-tunes, and the app's main pages (one fused dense family and
one MoE). Each family gets one tiny random pool (tests/conftest.make_tiny_pool) per module; every assertion fails
when a job raised or returned an empty result. Where a job's numbers can be checked cheaply against transformers
alone, they are: the text view's logits, the working copy's θ0/θ1, submodule_alpha's attn/mlp split, LoRA
training something."""
from __future__ import annotations

import math
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file

from forgetlab.analysis import attribution as A
from forgetlab.analysis import features as F
from forgetlab.analysis import finetune as FT
from forgetlab.analysis import linearity as L
from forgetlab.analysis import sweeps as S
from forgetlab.analysis import taskvec as TV
from forgetlab.analysis import textdiff as T
from forgetlab.analysis.textdiff_scoring import LogitReader
from forgetlab.core.anatomy import Anatomy
from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.pool import ModelPool
from forgetlab.merge import METHODS, run
from forgetlab.merge.working_copy import WorkingCopy
from tests.architectures import FAMILIES, MOE_FAMILIES, tiny_model
from tests.conftest import make_tiny_pool
from tests.jobs_helper import finish_cleanly, start_page

_POOLS: dict = {}


def _pool_for(family, tmp_path_factory):
    """The family's tiny pool (built once per session) and its adapters folder."""
    if family not in _POOLS:
        tiny = make_tiny_pool(tmp_path_factory.mktemp(f"arch-{family}"), family)
        _POOLS[family] = tiny
    return _POOLS[family]


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request, tmp_path_factory):
    """(family, TinyPool, ModelPool) with FORGETLAB_HOME in a folder of the family's own."""
    tiny = _pool_for(request.param, tmp_path_factory)
    mp = pytest.MonkeyPatch()
    mp.setenv("FORGETLAB_HOME", str(tmp_path_factory.mktemp(f"home-{request.param}")))
    yield request.param, tiny, ModelPool.from_yaml(tiny.pool_yaml)
    mp.undo()


def _task(pool):
    return list(pool.task_names)[0]


def _finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


# --------------------------------------------------------------------------------------- inspect, taskvec, eval

def test_inspect_shows_the_anatomy(fam, capsys):
    from forgetlab.cli import main

    family, tiny, pool = fam
    assert main(["inspect", str(tiny.base)]) == 0
    out = capsys.readouterr().out
    anatomy = Anatomy.from_config(pool.config)
    assert f"anatomy: {family}: 2 layers, 4 heads" in out
    assert f"levels {', '.join(anatomy.levels)}" in out
    assert ("experts" in out and "router" in out) == (family in MOE_FAMILIES)
    assert "expert" in anatomy.levels if family in MOE_FAMILIES else "expert" not in anatomy.levels


def test_taskvec_and_eval(fam, capsys):
    from forgetlab.cli import main

    family, tiny, pool = fam
    r = TV.compute(pool, TV.TaskvecSettings())
    frame = r.by_level()
    assert len(r.norms) == 2 and len(frame) > 0
    assert r.cosine is not None
    assert main(["eval", str(tiny.pool_yaml), "--max-general", "1", "--max-task", "2", "--no-lm-eval"]) == 0
    out = capsys.readouterr().out
    assert "ft0" in out and "ft1" in out


# --------------------------------------------------------------------------------------------- linearity

def test_linearity_at_every_level(fam):
    family, _, pool = fam
    levels = Anatomy.from_config(pool.config).levels
    r = L.compute(pool, L.LinearitySettings(task=_task(pool), model="ft0", levels=levels, samples=2,
                                            alphas=(0.0, 0.5)))
    frame = r.to_frame()
    assert set(frame["level"]) == set(levels), (family, set(levels) - set(frame["level"]))
    counts = frame["level"].value_counts()
    assert counts["head"] == 2 * 4 and counts["layer"] == 2
    if family in MOE_FAMILIES:
        assert counts["expert"] == 2 * 4
    assert frame["nls_mean"].notna().all()


# ------------------------------------------------------------------------------------------- attribution

def test_attribution_at_every_level(fam):
    family, _, pool = fam
    levels = ["layer", "module", "head"] + (["expert"] if family in MOE_FAMILIES else [])
    for level in levels:
        r = A.compute(pool, A.AttributionSettings(model="ft0", task=_task(pool), level=level, max_general=1,
                                                  max_task=2, device="cpu"))
        frame = r.to_frame()
        keys = set(frame["key"])
        want = {"layer": {"embed", "0", "1"}, "module": {"0.attn", "0.mlp", "1.attn", "1.mlp"},
                "head": {f"{i}.attn.h{h}" for i in range(2) for h in range(4)} | {"0.mlp", "1.mlp"},
                # the router (and a shared expert) stay in the layer's MLP part
                "expert": {f"{i}.mlp.e{e}" for i in range(2) for e in range(4)} | {"0.mlp", "1.mlp"}}[level]
        assert want <= keys, (family, level, want - keys)
        if level == "expert":
            # every expert's slice of the fused tensors carries its share of τ
            assert (frame[frame["module"] == "expert"]["tau_norm"] > 0).all()
        assert frame["d_general_loss"].notna().all() and not frame["zero_tau"].all()
    if family not in MOE_FAMILIES:
        with pytest.raises(Exception, match="has no experts"):
            A.compute(pool, A.AttributionSettings(model="ft0", task=_task(pool), level="expert", max_general=1,
                                                  max_task=2, device="cpu"))


# ------------------------------------------------------------------------------------------------ features

def test_features(fam):
    family, _, pool = fam
    for level in ("layer", "mlp"):
        r = F.compute(pool, F.FeaturesSettings(level=level, layer=-1, samples=3, perplexity=3.0, pca_dims=4))
        coords = r.to_frame()
        assert len(coords) == 3 * 2 * 3 and coords[["x", "y"]].notna().all().all(), (family, level)


# ---------------------------------------------------------------------------------------------- text view

@pytest.mark.parametrize("family", FAMILIES)
def test_text_view_logits_are_the_models(family):
    """The text view's logits from the decoder's hidden states (final norm read from the layout, then the model's
    own soft-cap / scaling) and the logit lens at the last depth equal model(ids).logits."""
    model = tiny_model(family, 64)
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    reader = LogitReader(model, lens=True)
    assert reader.lens and not reader.plain
    hidden, residual = reader.forward(ids, mask)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        assert torch.allclose(reader.logits(hidden), ref, atol=1e-5, rtol=0)
        assert torch.allclose(reader.logits(reader.norm(residual[-1])), ref, atol=1e-5, rtol=0)


def test_text_view(fam):
    family, _, pool = fam
    r = T.compute(pool, T.TextDiffSettings(model="ft0", lines=("two plus two is four", "copy this")))
    kl = r.tokens["kl"].dropna()      # a sequence's first token has no prediction
    assert len(kl) > 0 and (kl >= 0).all()
    assert len(r.lens) > 0, family


# --------------------------------------------------------------------------------------------------- sweeps

def test_working_copy_endpoints_are_the_checkpoints(fam):
    """θ0 and θ1 of the sweeps' working copy are the base and the fine-tune as transformers loads them (a MoE's
    fused experts too)."""
    family, _, pool = fam
    work = WorkingCopy.load(pool, "ft0")
    for alpha, ref in ((1.0, pool.load("ft0")), (0.0, pool.load("base"))):
        work.lerp(work.tuned, alpha)
        want = dict(ref.named_parameters())
        for n, p in work.model.named_parameters():
            assert torch.equal(p.detach(), want[n].detach().float()), (family, alpha, n)


def test_sweeps(fam):
    family, _, pool = fam
    task = _task(pool)
    a = S.alpha_curve(pool, "ft0", alphas=(0.0, 0.5, 1.0), task=task, max_general=1, max_task=2)
    assert len(a.points) == 3 and all(_finite(p.general_loss) for p in a.points)
    f = S.pruning_curve(pool, "ft0", ratios=(0.0, 0.5), scores=("fapm",), task=task, max_general=1, max_task=2)
    assert len(f.points) == 2 and all(_finite(p.general_loss) for p in f.points)


# ---------------------------------------------------------------------------------------------------- merges

def _adapters(tiny, family):
    """Two random LoRA adapters of the base (PEFT folders) for knots; a MoE's on its attention only."""
    from peft import LoraConfig, get_peft_model

    from forgetlab.train.lora import linear_module_names

    out = []
    for i in range(2):
        path = tiny.root / f"lora{i}"
        if not path.exists():
            model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny.base))
            cfg = LoraConfig(r=2, lora_alpha=4, target_modules=linear_module_names(model), task_type="CAUSAL_LM")
            peft = get_peft_model(model, cfg)
            g = torch.Generator().manual_seed(7 + i)
            with torch.no_grad():
                for n, p in peft.named_parameters():
                    if "lora_B" in n:
                        p.copy_(0.05 * torch.randn(p.shape, generator=g))
            peft.save_pretrained(str(path))
        out.append(path)
    return out


def test_every_merge_method(fam, tmp_path):
    family, tiny, pool = fam
    base_names = set(open_checkpoint(tiny.base).names())
    failed = {}
    for name, spec in METHODS.items():
        models = [str(tiny.finetuned["ft0"]), str(tiny.finetuned["ft1"])]
        if name == "knots":
            models = [str(p) for p in _adapters(tiny, family)]
        cap = spec.max_models
        if cap is not None:
            models = models[:cap]
        recipe = {"method": name, "base": str(tiny.base), "models": models, "params": {}}
        if name == "passthrough":
            recipe = {"method": name, "base": str(tiny.base), "models": [], "params": {}}
        if spec.needs_pool:
            recipe["params"] = {"samples": 2, "tasks": ",".join(pool.task_names)}
        if name == "hma":                  # one α per block of layers: the tiny models have 2 layers
            recipe["params"] = {"alphas": [0.2, 0.8]}
        if name == "submodule_alpha":
            recipe["params"] = {"alphas": "0.mlp=1", "default": 0.0}
        try:
            res = run(recipe, tmp_path / name, pool=pool if spec.needs_pool else None)
            got = {}
            for f in sorted(res.out_dir.glob("*.safetensors")):
                got.update(load_file(str(f)))
            missing = base_names - set(got)
            bad = [n for n, t in got.items() if not torch.isfinite(t.float()).all()]
            if not got or missing or bad:
                failed[name] = f"missing {sorted(missing)[:3]}, non-finite {bad[:3]}"
        except Exception as exc:   # collected: one family's report names every method that fails
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    assert not failed, failed
    # submodule_alpha "0.mlp=1": layer 0's MLP (a MoE's experts and router too) is ft0's, its attention the base's
    got = load_file(str(next((tmp_path / "submodule_alpha").glob("*.safetensors"))))
    base, ft = open_checkpoint(tiny.base), open_checkpoint(tiny.finetuned["ft0"])
    anatomy = Anatomy.from_config(pool.config, names=list(got))
    mlp0 = [n for n in got if anatomy.role(n).layer == 0 and anatomy.role(n).module == "mlp"]
    attn0 = [n for n in got if anatomy.role(n).layer == 0 and anatomy.role(n).module == "attn"]
    assert mlp0 and attn0
    for n in mlp0:
        assert torch.allclose(got[n].float(), ft.read(n, dtype=torch.float32)), n
    for n in attn0:
        assert torch.allclose(got[n].float(), base.read(n, dtype=torch.float32)), n


# ------------------------------------------------------------------------------------------ what-if fine-tunes

@pytest.mark.parametrize("how", ["adamw", "lora", "mofo-head", "hft"])
def test_finetunes(fam, how):
    family, _, pool = fam
    kw = dict(task=_task(pool), steps=2, batch_size=2, eval_every=2, max_general=1)
    kw.update({"adamw": {}, "lora": {"lora": 2}, "mofo-head": {"optimizer": "mofo", "partition": "head"},
               "hft": {"hft": 0.5}}[how])
    r = FT.compute(pool, FT.FinetuneSettings(**kw))
    frame = r.to_frame()
    assert len(frame) == 1 and int(frame["steps"].iloc[0]) == 2, (family, how)
    assert _finite(frame["general_loss"].iloc[0])
    assert float(frame["distance"].iloc[0]) > 0, (family, how, "nothing trained")


# -------------------------------------------------------------------------------------------------- pages

@pytest.mark.parametrize("family", ["phi3", "mixtral"])
def test_pages_main_buttons(family, tmp_path_factory, tmp_path, monkeypatch):
    tiny = _pool_for(family, tmp_path_factory)
    root = tmp_path / "pool"
    shutil.copytree(tiny.root, root)
    yaml_path = root / "pool.yaml"
    home = tmp_path / "home"

    at = start_page("linearity", yaml_path, home, monkeypatch)
    at.selectbox(key="linearity_model").set_value("ft0")
    for task in ("math", "copy"):
        key = f"linearity_samples_{task}"
        if any(getattr(w, "key", None) == key for w in at.number_input):
            at.number_input(key=key).set_value(2)
    at.text_input(key="linearity_alphas").set_value("0, 0.5")
    at.button(key="linearity_run").click().run()
    finish_cleanly(at, "linearity")
    assert len(at.dataframe[0].value) > 0

    at = start_page("attribution", yaml_path, home, monkeypatch)
    levels = at.radio(key="attribution_level").options
    assert ("expert" in levels) == (family in MOE_FAMILIES)
    at.radio(key="attribution_level").set_value("expert" if family in MOE_FAMILIES else "head")
    at.session_state["app_max_general"] = 1
    at.session_state["app_max_task"] = 2
    at.button(key="attribution_run").click().run()
    finish_cleanly(at, "attribution")
    assert len(at.get("plotly_chart")) == 3

    at = start_page("merge", yaml_path, home, monkeypatch)
    at.session_state["app_max_general"] = 1
    at.session_state["app_max_task"] = 2
    at.text_input(key="merge_name_ties").set_value(f"ties-{family}")
    at.button(key="merge_run").click().run()
    finish_cleanly(at, "merge")
    assert f"ties-{family}" in list(at.dataframe[0].value["model"])

    at = start_page("finetune", yaml_path, home, monkeypatch)
    at.radio(key="finetune_mode").set_value("one run").run()
    at.number_input(key="finetune_steps").set_value(2)
    at.number_input(key="finetune_eval_every").set_value(2)
    at.number_input(key="finetune_max_general").set_value(1)
    at.button(key="finetune_run").click().run()
    finish_cleanly(at, "finetune")
    assert len(at.dataframe[0].value) == 1


def test_inspect_of_an_unreadable_architecture_says_which_levels_and_why(tmp_path_factory, monkeypatch, capsys):
    """An architecture whose anatomy cannot be read still lists its tensors; the per-level part is the anatomy's
    message (the levels unavailable, why, the supported families) instead of a failure."""
    from forgetlab.cli import main
    from forgetlab.commands import models
    from forgetlab.core.anatomy import unsupported

    tiny = _pool_for("gpt_neox", tmp_path_factory)

    def refuse(config, names=None):
        raise unsupported(config, "forgetlab cannot read the attention projections")

    monkeypatch.setattr(models.Anatomy, "from_config", staticmethod(refuse))
    assert main(["inspect", str(tiny.base), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "layer, attention, MLP, head and expert levels are unavailable" in out
    assert "cannot read the attention projections" in out and "Tested families" in out
    assert "gpt_neox.layers.0.attention.query_key_value.weight" in out
