"""Issue 11's check of a built pico zoo, outside forgetlab's evaluation (plain transformers and safetensors):
for each full fine-tune, D(θ, θ0) = mean over tensors of ‖θ − θ0‖ / ‖θ0‖ (tensors with ‖θ0‖ > 0), greedy exact
match on the eval split (the generated tokens equal the answer's tokens followed by EOS), and held-out loss
(`model(x, labels=x)` on up to 160 blocks of 128 tokens of `data/general_heldout.txt`, tokenised as one text).

    python bench/zoo_check.py ZOO_FOLDER [N_PAIRS=100]
"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from transformers import AutoTokenizer, AutoModelForCausalLM
torch.set_num_threads(1)
root = Path(sys.argv[1]); n_pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 100
tok = AutoTokenizer.from_pretrained(root / "base")
w0 = load_file(str(root / "base" / "model.safetensors"))
text = (root / "data" / "general_heldout.txt").read_text()
ids = tok(text)["input_ids"]
blocks = [ids[i:i + 128] for i in range(0, len(ids) - 128, 128)][:160]
def heldout(m):
    tot = n = 0
    with torch.no_grad():
        for i in range(0, len(blocks), 16):
            x = torch.tensor(blocks[i:i + 16])
            out = m(x, labels=x)
            k = x.numel() - x.shape[0]
            tot += out.loss.item() * k; n += k
    return tot / n
def em(m, task):
    pairs = [json.loads(l) for l in open(root / "data" / f"{task}_eval.jsonl")][:n_pairs]
    hit = 0
    for p in pairs:
        x = tok(p["prompt"], return_tensors="pt")["input_ids"]
        target = tok(p["prompt"] + p["answer"])["input_ids"][x.shape[1]:] + [tok.eos_token_id]
        with torch.no_grad():
            o = m.generate(x, max_new_tokens=len(target), do_sample=False, pad_token_id=tok.pad_token_id)
        hit += o[0, x.shape[1]:].tolist() == target
    return hit / len(pairs)
base = AutoModelForCausalLM.from_pretrained(root / "base").eval()
L0 = heldout(base)
print("base heldout %.4f" % L0, {t: em(base, t) for t in ("math", "code", "translate")}, flush=True)
for t in ("math", "code", "translate"):
    w = load_file(str(root / f"ft-{t}" / "model.safetensors"))
    D = sum((w[k].float() - w0[k].float()).norm() / w0[k].float().norm() for k in w0 if w0[k].float().norm() > 0) / sum(1 for k in w0 if w0[k].float().norm() > 0)
    m = AutoModelForCausalLM.from_pretrained(root / f"ft-{t}").eval()
    print(f"ft-{t}: D {float(D):.4f}  EM {em(m, t):.2f}  heldout {heldout(m):.4f} (Δ {heldout(m) - L0:+.4f})", flush=True)
