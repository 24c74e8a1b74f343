"""FAPM (issue 17): adapters' own default pruning ratio, and the rule for an all-zero base tensor."""
from __future__ import annotations

import torch

from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.merge import METHODS, merge_state_dicts, run
from forgetlab.merge.methods.fapm import ADAPTER_RATIO, fapm_mask, fapm_prune, fapm_scores


def test_all_zero_base_tensor_is_scored_by_magnitude_hand_computed():
    w0 = torch.zeros(5)
    tau = torch.tensor([0.3, -2.0, 0.0, 1.0, -0.1])
    s = fapm_scores(tau, w0)
    assert not torch.isnan(s).any()  # the formula's 0·∞
    assert s.tolist() == tau.abs().tolist()
    # ratio 0.6: ⌊0.6·5⌋ = 3 zeroed, the 2 largest |τ| kept
    assert fapm_prune(tau, w0, 0.6).tolist() == [0.0, -2.0, 0.0, 1.0, 0.0]
    assert fapm_mask(tau, w0, 0.2).sum() == 4
    # a tensor with some zero base entries (mean|W0| > 0) keeps the paper's rule: those entries score −∞
    w0b = torch.tensor([0.0, 1.0, 2.0, 1.0, 1.0])
    sb = fapm_scores(tau, w0b)
    assert sb[0] == float("-inf") and sb[2] == 0.0
    torch.testing.assert_close(sb[1:], torch.tensor([2.0 - 1.0 * 2.0, 0.0, 1.0 - 1.0, 0.1 - 0.1]))
    # through a merge: the zero bias gets a non-trivial pruned update at ratio 0.6 (it used to keep nothing)
    out = merge_state_dicts("fapm", {"b": w0}, [{"b": tau}], ratio=0.6)
    assert out["b"].tolist() == [0.0, -2.0, 0.0, 1.0, 0.0]


def test_adapter_ratio_is_in_the_registry_for_the_app_form():
    spec = METHODS["fapm"].to_dict()
    params = {p["name"]: p for p in spec["params"]}
    assert params["ratio"]["default"] == 0.9
    assert params["adapter_ratio"]["default"] == ADAPTER_RATIO == 0.5
    assert "relatively small" in params["adapter_ratio"]["help"]


def _lora(pool, out):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(pool.base)),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(str(out))
    return out


def test_adapters_get_their_own_ratio_next_to_full_finetunes(tiny_llama, tmp_path):
    lora = _lora(tiny_llama, tmp_path / "lora")
    ft = tiny_llama.finetuned["ft0"]
    base = open_checkpoint(tiny_llama.base)
    ad = open_checkpoint(lora, base=base)
    full = open_checkpoint(ft)
    target = "model.layers.0.self_attn.q_proj.weight"
    w0 = base.read(target)
    for params, (r_ad, r_full) in (({}, (ADAPTER_RATIO, 0.9)), ({"ratio": 0.8, "adapter_ratio": 0.3}, (0.3, 0.8))):
        res = run({"method": "fapm", "base": str(tiny_llama.base), "models": [str(lora), str(ft)],
                   "params": params}, tmp_path / f"out{len(params)}")
        got = open_checkpoint(res.out_dir).read(target)
        exp = w0 + fapm_prune(ad.delta(target), w0, r_ad) + fapm_prune(full.read(target) - w0, w0, r_full)
        torch.testing.assert_close(got, exp, rtol=0, atol=1e-6)
        kept = int((fapm_prune(ad.delta(target), w0, r_ad) != 0).sum())
        assert kept == ad.delta(target).numel() - int(r_ad * ad.delta(target).numel())
