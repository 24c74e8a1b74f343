"""Compare recipes chosen from an attribution map with WiSE-FT α=0.5 and FAPM ratio 0.9 (same evaluation)."""
import json, sys
import pandas as pd, torch
torch.set_num_threads(1)
from forgetlab.analysis.sweeps import WorkingCopy, wise_ft_at, _pruned
from forgetlab.analysis.measures import pareto_mask
from forgetlab.core.evaluate import evaluate
from forgetlab.core.pool import ModelPool
from forgetlab.merge.layers import layer_locator
from forgetlab.merge.methods.submodule import alpha_of, submodule_alpha

pool = ModelPool.from_yaml(sys.argv[1]); model = sys.argv[2]; task = sys.argv[3]; csv = sys.argv[4]
m = pd.read_csv(csv)
only = m[m["map"] == "only_this"]
loo = m[m["map"] == "leave_one_out"]
front = [k for k, on in zip(only.key, pareto_mask(list(-only.d_answer_loss), list(only.d_general_loss))) if on]
# recipe 2: drop the parts whose removal lowers general loss while costing < 0.05 exact match
drop = [k for k, g, s in zip(loo.key, loo.d_general_loss, loo.d_speciality) if g < 0 and s > -0.05]
keep2 = [k for k in loo.key if k not in drop]
# recipe 3: keep only parts whose only-this buys exact match (d_speciality > 0)
keep3 = [k for k in only.key if k != "embed"]
# recipe 4: drop only the part whose removal lowers general loss most (leave-one-out)
worst = loo.key.iloc[int(loo.d_general_loss.values.argmin())]
keep4 = [k for k in loo.key if k != worst]
work = WorkingCopy(pool, model, device="cpu")
locate = layer_locator(pool.config)
def rec(keys, rest=0.0):
    al = {k: 1.0 for k in keys}
    return lambda n, w0, w1: submodule_alpha(w0, w1, alpha_of(n, locate(n), al, rest))
cands = {"base": wise_ft_at(0.0), "fine-tune": wise_ft_at(1.0), "wise-ft α=0.5": wise_ft_at(0.5),
         "fapm ratio=0.9": _pruned(0.9, "fapm"), f"map: only-this front (answer loss) {front}": rec(front),
         f"map: drop {drop}": rec(keep2), "map: all but embed": rec(keep3),
         f"map: all but {worst}": rec(keep4)}
rows = []
for name, fn in cands.items():
    work.apply(fn)
    c = evaluate(work.model, pool.tokenizer, pool.probes, name=name, max_general=32, max_task=100, tasks=[task])
    rows.append({"model": name, "general_loss": c.general_loss, "exact_match": c.tasks[task].exact_match,
                 "answer_loss": c.tasks[task].answer_loss})
    print(json.dumps(rows[-1]), flush=True)
df = pd.DataFrame(rows)
df["pareto"] = pareto_mask(list(df.exact_match), list(df.general_loss))
print(df.to_string())
