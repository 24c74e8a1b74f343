"""How often a TIES trim meets ties at its cut: for every (tensor, fine-tuned model) of a zoo, stored in float32
and rounded to bfloat16, whether the k-th largest |τ| (k = keep_count(n, keep)) is shared by more entries than
k can take. At a tie forgetlab keeps the first entries in storage order (exactly k, scope "tensor") or every
tied entry (a threshold, scope "global"); mergekit's argsort keeps some other k, so the merges differ there.

    python bench/ties_at_cut.py [~/.forgetlab/zoo/pico] [--keep 0.2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml

from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.merge.select import keep_count, kth_largest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("zoo", nargs="?", default=str(Path("~/.forgetlab/zoo/pico").expanduser()))
    ap.add_argument("--keep", type=float, default=0.2)
    args = ap.parse_args()
    root = Path(args.zoo)
    pool = yaml.safe_load((root / "pool.yaml").read_text())
    base = open_checkpoint(root / pool["base"])
    full = [root / v for v in (pool.get("models") or {}).values() if isinstance(v, str)]
    for dtype in (torch.float32, torch.bfloat16):
        pairs = tied = beyond = 0
        for path in full:
            ft = open_checkpoint(path)
            for name in base.names():
                b, f = base.read(name).to(dtype).float(), ft.read(name).to(dtype).float()
                tau = (f - b).abs().reshape(-1).contiguous()
                k = keep_count(tau.numel(), args.keep)
                if not 0 < k < tau.numel():
                    continue
                cut, n_ge = kth_largest(tau, k)
                pairs += 1
                if n_ge > k and cut > 0:
                    tied += 1
                    beyond += n_ge - k
        print(f"{str(dtype).replace('torch.', '')}: {tied} of {pairs} (tensor, model) pairs tie at the TIES cut "
              f"(keep {args.keep}); {beyond} tied entries more than k in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
