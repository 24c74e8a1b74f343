"""PCB global vs tensor scope (and TIES) on the default pico zoo: share of each fine-tune's answer-loss gain kept by the
merge of the three full fine-tunes, held-out loss, and the share of entries changed in embeddings vs the rest.

    forgetlab zoo build --preset pico
    python docs/evidence/pcb_scope_pico.py ~/.forgetlab/zoo/pico/pool.yaml > docs/evidence/pcb_scope_pico.txt
"""
import copy, sys
from forgetlab.core.evaluate import evaluate
from forgetlab.core.pool import ModelPool
from forgetlab.merge.api import merge_state_dicts
pool = ModelPool.from_yaml(sys.argv[1])
names, tasks = ["math", "code", "translate"], ["math", "code", "translate"]
sd = lambda m: {k: v.detach().clone() for k, v in m.state_dict().items()}
base = pool.load("base"); b = sd(base); fts = [sd(pool.load(n)) for n in names]
kw = dict(max_general=32, max_task=50)
card0 = evaluate(base, pool.tokenizer, pool.probes, name="base", tasks=tasks, **kw)
cards = {n: evaluate(pool.load(n), pool.tokenizer, pool.probes, name=n, tasks=[t], **kw) for n, t in zip(names, tasks)}
work = copy.deepcopy(base)
emb = [k for k in b if "embed" in k or "lm_head" in k]
for label, method, p in [("ties", "ties", {}), ("pcb global", "pcb", {}), ("pcb tensor", "pcb", {"scope": "tensor"}),
                         ("pcb global keep 0.5", "pcb", {"keep": 0.5})]:
    m = merge_state_dicts(method, b, fts, **p)
    kept = {k: float((m[k] != b[k]).float().mean()) for k in m}
    work.load_state_dict(m, strict=False)
    c = evaluate(work, pool.tokenizer, pool.probes, name=label, tasks=tasks, **kw)
    sh = [(card0.tasks[t].answer_loss - c.tasks[t].answer_loss) / (card0.tasks[t].answer_loss - cards[n].tasks[t].answer_loss) for n, t in zip(names, tasks)]
    print(f"{label:22s} shares {[round(x,2) for x in sh]} general {c.general_loss:.3f}  changed share emb {sum(kept[k] for k in emb)/len(emb):.2f} other {sum(v for k,v in kept.items() if k not in emb)/max(1,len(kept)-len(emb)):.2f}")
