"""How far forgetlab's NLS is from the transformers-only patching reference of tests/test_architecture_slices.py, per
family and level: the largest |NLS(forgetlab) − NLS(reference)| over every layer, head, expert and probe sample
(the models in float64; the mixtures of experts in float32, as transformers' grouped experts refuse float64).

    python bench/architecture_slices.py [--pool-dir DIR]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tests.test_architecture_slices as slices  # noqa: E402
from forgetlab.analysis.linearity import nonlinearity_scores  # noqa: E402
from forgetlab.core.anatomy import Anatomy  # noqa: E402
from forgetlab.core.checkpoints import load_tokenizer  # noqa: E402
from tests.conftest import make_tiny_pool  # noqa: E402


def worst_differences(family: str, tok) -> dict[str, float]:
    """{level: max |NLS − reference NLS|} for one family's tiny base and perturbed copy."""
    base, ft = slices._pair(family, tok)
    moe = family in slices.MOE_FAMILIES
    levels = ("layer", "attn", "mlp", "head") + (("expert",) if moe else ())
    res = nonlinearity_scores((base, ft, tok, slices.PAIRS), "math", levels=levels, samples=slices.SAMPLES,
                              batch_size=8)
    anat = Anatomy.from_model(base)
    ref = slices._reference(family, base, ft, tok, anat.head_dim, anat.num_heads, anat.num_experts if moe else 0)
    got = {(s.level, s.layer, s.head): s.nls for s in res.scores}
    worst: dict[str, float] = {}
    for key, want in ref.items():
        d = float(np.nanmax(np.abs(got[key] - want))) if np.isfinite(want).any() else 0.0
        worst[key[0]] = max(worst.get(key[0], 0.0), d)
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool-dir", default="/tmp/forgetlab-slice-diff-pool", help="where the tokenizer's pool goes")
    args = ap.parse_args()
    folder = Path(args.pool_dir)
    if not (folder / "pool.yaml").exists():
        make_tiny_pool(folder, "llama")
    tok = load_tokenizer(folder / "base")
    for family in slices.FAMILIES:
        worst = worst_differences(family, tok)
        print(f"{family:12s} " + "  ".join(f"{lv} {v:.1e}" for lv, v in worst.items()), flush=True)


if __name__ == "__main__":
    main()
