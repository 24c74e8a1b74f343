"""The closed-form merges of issue 26 against the weight average, on a zoo (the rows the demo's "what this zoo
shows" gains, measured — the integrator folds them into forgetlab/zoo/claims.py).

For every method, the merge of the zoo's full fine-tunes (knots: of its LoRA adapters) is evaluated beside the base,
the fine-tunes and the plain weight average of the same models (`linear`):
- speciality kept: per model, the share of its own-task gain over the base that the merge keeps,
  (merge − base) / (fine-tune − base) in exact match on the eval split (answer loss with --measure answer_loss);
- generality cost: the merge's held-out general loss − the base's (nats; > 0 is forgetting).
A method "beats the average" when its mean kept share is higher; the cost column says at what price.

    FORGETLAB_HOME=/tmp/fh python bench/closed_form_on_zoo.py [--zoo pico] [--methods lines,tsv,…] [--max-task 32]

Reads the zoo (never writes it); merges are built in memory (LoRA merges in a temporary folder).
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ("lines", "tsv", "iso_c", "iso_cts", "cart", "localize_stitch", "regmean", "regmean_pp", "fisher", "knots")
POOL_METHODS = {"regmean", "regmean_pp", "fisher"}


def _spec(card, task, measure):
    s = card.tasks[task]
    return s.exact_match if measure == "exact_match" else -s.answer_loss


def closed_form_vs_average(pool, methods=METHODS, measure="exact_match", max_general=None, max_task=None,
                           samples=16, progress=print):
    """Rows (method, models, kept share per task and mean, general-loss cost, the same for the weight average)."""
    import torch

    from forgetlab.core.evaluate import evaluate
    from forgetlab.merge import merge_state_dicts, run
    from forgetlab.merge.registry import PrepareContext, get_method, validate_params

    full = {m: m for m in pool.model_names if m in pool.probes.tasks}
    loras = {m: m.removeprefix("lora-") for m in pool.model_names
             if m.startswith("lora-") and m.removeprefix("lora-") in pool.probes.tasks}
    kw = dict(max_general=max_general, max_task=max_task)
    base_model = pool.load("base")
    work = copy.deepcopy(base_model)
    cards = {"base": evaluate(base_model, pool.tokenizer, pool.probes, name="base", **kw)}
    for m in [*full, *loras]:
        cards[m] = evaluate(pool.load(m), pool.tokenizer, pool.probes, name=m, **kw)
    base_sd = {k: v.detach().float() for k, v in base_model.state_dict().items()}
    ft_sds = [{k: v.detach().float() for k, v in pool.load(n).state_dict().items()} for n in full]

    def score(label, models, merged):
        work.load_state_dict(merged, strict=False)
        card = evaluate(work, pool.tokenizer, pool.probes, name=label, **kw)
        shares = {}
        for m, task in models.items():
            gain = _spec(cards[m], task, measure) - _spec(cards["base"], task, measure)
            got = _spec(card, task, measure) - _spec(cards["base"], task, measure)
            shares[task] = got / gain if gain != 0 else float("nan")
        vals = [v for v in shares.values() if math.isfinite(v)]
        return {"shares": shares, "mean": sum(vals) / len(vals) if vals else float("nan"),
                "cost": card.general_loss - cards["base"].general_loss}

    def lora_merge(method, params):
        with tempfile.TemporaryDirectory() as tmp:
            res = run({"method": method, "base": str(pool.checkpoint("base").path),
                       "models": [str(pool.checkpoint(m).path) for m in loras], "params": params}, Path(tmp) / "m")
            from forgetlab.core.checkpoints import open_checkpoint
            return open_checkpoint(res.out_dir).state_dict(torch.float32)

    avg_full = score("average", full, merge_state_dicts("linear", base_sd, ft_sds))
    avg_lora = score("average-lora", loras, lora_merge("linear", {})) if loras and "knots" in methods else None
    rows = []
    for method in methods:
        t = time.perf_counter()
        spec = get_method(method)
        if method == "knots":
            if not loras:
                continue
            merged, models, ref = lora_merge("knots", {}), loras, avg_lora
        elif method in POOL_METHODS:
            params = validate_params(spec, {"samples": samples}, len(full))
            prepared = spec.prepare(PrepareContext(pool, None, [], list(full), params))
            merged = merge_state_dicts(method, base_sd, ft_sds, prepared=prepared, config=pool.config,
                                       samples=samples)
            models, ref = full, avg_full
        else:
            merged = merge_state_dicts(method, base_sd, ft_sds, config=pool.config)
            models, ref = full, avg_full
        r = score(method, models, merged)
        rows.append({"method": method, "models": "LoRA adapters" if method == "knots" else "full fine-tunes",
                     **{f"kept {k}": v for k, v in r["shares"].items()}, "kept mean": r["mean"],
                     "general cost": r["cost"], "average kept mean": ref["mean"], "average general cost": ref["cost"],
                     "beats average": r["mean"] > ref["mean"], "seconds": time.perf_counter() - t})
        progress(f"{method}: kept {r['mean']:.2f} (average {ref['mean']:.2f}), cost {r['cost']:+.3f} "
                 f"(average {ref['cost']:+.3f})")
    return rows, cards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", default="pico")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--measure", default="exact_match", choices=["exact_match", "answer_loss"])
    ap.add_argument("--max-general", type=int, default=None)
    ap.add_argument("--max-task", type=int, default=None)
    ap.add_argument("--samples", type=int, default=16, help="probe pairs per task for regmean / fisher")
    args = ap.parse_args()
    import pandas as pd
    import torch

    from forgetlab.core.pool import ModelPool
    from forgetlab.core.workspace import zoo_dir

    torch.set_num_threads(1)
    pool = ModelPool.from_yaml(Path(zoo_dir()) / args.zoo / "pool.yaml")
    t = time.perf_counter()
    rows, cards = closed_form_vs_average(pool, [m.strip() for m in args.methods.split(",") if m.strip()],
                                         args.measure, args.max_general, args.max_task, args.samples)
    base = cards["base"]
    print(f"zoo {args.zoo}: base general loss {base.general_loss:.4f}; measure {args.measure}; "
          f"{time.perf_counter() - t:.0f} s")
    for m, c in cards.items():
        if m != "base":
            print(f"  {m}: general loss {c.general_loss:.4f} (+{c.general_loss - base.general_loss:.4f}); "
                  + ", ".join(f"{k} {v.exact_match:.3f}" for k, v in c.tasks.items()))
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
