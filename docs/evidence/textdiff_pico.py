"""What the Text view shows on the pico zoo (docs/textdiff.md): for each full fine-tune, the rise per token class
on the whole held-out split, at the fine-tune (α = 1) and at the WiSE-FT point α = 0.5, and the logit lens.

    FORGETLAB_HOME=/tmp/fh .venv/bin/python docs/evidence/textdiff_pico.py > docs/evidence/textdiff_pico.txt
(reads the zoo, writes nothing under it: --no-save equivalent)."""
from __future__ import annotations

import json

import pandas as pd
import torch

from forgetlab.analysis.textdiff import textdiff
from forgetlab.core.pool import ModelPool
from forgetlab.core.workspace import zoo_dir

torch.set_num_threads(1)
root = zoo_dir() / "pico"
manifest = json.loads((root / "manifest.json").read_text())
pool = ModelPool.from_yaml(root / "pool.yaml", scan_nonfinite=False)
print(f"zoo {root}: created {manifest.get('created')}, fingerprint {manifest.get('fingerprint')}")
pd.set_option("display.width", 200)
for model in ("math", "translate", "code"):
    full = textdiff(pool, model)
    half = textdiff(pool, model, alpha=0.5)
    a, b = full.by_class().set_index("token_class"), half.by_class().set_index("token_class")
    s1, s5 = full.summary(), half.summary()
    print(f"\n== {model}: {s1['tokens']} held-out tokens; mean rise {s1['mean_rise']:.4f} nats at α=1, "
          f"{s5['mean_rise']:.4f} at α=0.5 (kept {s5['mean_rise'] / s1['mean_rise']:.0%}); mean KL "
          f"{s1['mean_kl']:.4f} → {s5['mean_kl']:.4f}")
    table = pd.DataFrame({"tokens": a["tokens"], "share_of_tokens": a["share_of_tokens"],
                          "mean_rise_a1": a["mean_rise"], "share_of_rise_a1": a["share_of_rise"],
                          "mean_kl_a1": a["mean_kl"], "mean_rise_a05": b["mean_rise"],
                          "share_of_rise_a05": b["share_of_rise"], "kept_a05": b["mean_rise"] / a["mean_rise"]})
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    print("logit lens at α=1 (first 64 blocks):")
    print(full.lens_frame().to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print("tokens with the largest total rise at α=1:")
    print(full.top_tokens("rise", 8).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print("contexts with the largest rise at α=1:")
    print(full.top_contexts("rise", 5)[["where", "context", "rise", "top1_base", "top1_model"]]
          .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
