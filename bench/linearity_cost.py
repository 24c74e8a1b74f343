"""What the full non-linearity table costs, measured against its peers in the same run.

Prints (threads and sizes stated):
  - full table (model + layer + attn + mlp + every head) / model level alone   (the issue's target: ≲ 2)
  - submodule levels only (layer + attn + mlp + head) / model level alone
  - full table / naive recomputation (a full forward pass per α per submodule: `direct_scores`)
and checks that the cached and naive scores agree.

    /work/venv/bin/python bench/linearity_cost.py [--hidden 256 --layers 6 --heads 8 --samples 16]
"""
from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from forgetlab.analysis.linearity import DEFAULT_LEVELS, nonlinearity_scores
from forgetlab.analysis.linearity_reference import direct_scores
from forgetlab.core.data import TaskPair


def char_tokenizer() -> PreTrainedTokenizerFast:
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789 +=:.,")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def timed(fn, repeat: int):
    """Best of `repeat` runs, in CPU seconds of this process: with one torch thread that is the work done,
    and unlike wall time it does not grow when other jobs share the machine."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-naive", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = char_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=int(args.hidden * 8 / 3),
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=256)
    base = LlamaForCausalLM(cfg).eval()
    ft = copy.deepcopy(base)
    with torch.no_grad():
        for p in ft.parameters():
            p.add_(0.3 * p.abs().mean() * torch.randn_like(p))
    rng = np.random.default_rng(0)
    pairs = [TaskPair(f"{a} plus {b} is", f" {a + b}.") for a, b in rng.integers(100, 10000, (args.samples, 2))]
    inputs = (base, ft, tok, pairs)
    common = dict(samples=args.samples, batch_size=args.batch_size)
    n_tokens = sum(len(tok(p.prompt + p.answer)["input_ids"]) for p in pairs)
    print(f"model: Llama hidden {args.hidden}, {args.layers} layers, {args.heads} heads ({args.kv_heads} kv), "
          f"{sum(p.numel() for p in base.parameters()) / 1e6:.2f} M params; {args.samples} samples "
          f"({n_tokens} tokens); torch threads = {torch.get_num_threads()}; CPU seconds, best of {args.repeat}")
    runs = {"model": ("model",), "full": tuple(DEFAULT_LEVELS), "sub": ("layer", "attn", "mlp", "head")}
    best = {k: float("inf") for k in runs}
    results = {}
    for _ in range(args.repeat):  # interleaved, so that a load spike on the machine hits every variant alike
        for k, levels in runs.items():
            t, results[k] = timed(lambda: nonlinearity_scores(inputs, "bench", levels=levels, **common), 1)
            best[k] = min(best[k], t)
    t_model, t_full, t_sub = best["model"], best["full"], best["sub"]
    r_full = results["full"]
    n_sub = len(r_full.scores) - 1
    print(f"model level alone            : {t_model:8.2f} s")
    print(f"full table ({len(r_full.scores):3d} submodules) : {t_full:8.2f} s   ratio to model level = "
          f"{t_full / t_model:.2f}")
    print(f"submodule levels only        : {t_sub:8.2f} s   ratio to model level = {t_sub / t_model:.2f}")
    if not args.skip_naive:
        t_naive, r_naive = timed(lambda: direct_scores(inputs, "bench", **common), 1)
        print(f"naive recomputation          : {t_naive:8.2f} s   full table / naive = {t_full / t_naive:.4f} "
              f"(naive is {t_naive / t_full:.1f}× slower; {n_sub} submodules × {len(r_full.alphas) + 1} α "
              "forwards)")
        a, b = r_full.to_frame(), r_naive.to_frame()
        err = float(np.nanmax(np.abs(np.stack(a["curve"]) - np.stack(b["curve"]))))
        print(f"max |d_cached(α) − d_naive(α)| over every submodule and α: {err:.2e}")
    print(r_full.by_level().to_string(index=False))


if __name__ == "__main__":
    main()
