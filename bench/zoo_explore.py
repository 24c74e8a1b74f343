"""Explore pico zoo settings (docs/zoo.md, "Format 2"): pretrain a base with the pico default preset changed by
KEY=VALUE overrides, print its held-out loss, answer loss and greedy answer prefix accuracy per task (the share
of eval prompts whose greedy continuation starts with the answer: what a fine-tune that only learns to stop can
reach), then fine-tune it on each task and print D(θ, θ0), the scorecard and Δ held-out loss.

    python bench/zoo_explore.py NAME [share=0.5] [psteps=1400] [plr=…] [plen=…] [pbatch=…] [hidden=…]
        [inter=…] [layers=…] [form=prompt|prose|statement|terse|equals or per task: math:equals,code:prompt,…]
        [code=full|basic|words] [fsteps=…] [flr=…] [ft=0] [threads=1]
        (fsteps and flr may be given per task: flr=math:3e-4,translate:1.5e-4)

Works in /tmp/zoo_explore/NAME by default (--root to change; the base is kept there and reused)."""
import copy, json, sys, time
from dataclasses import replace
from pathlib import Path
import torch
from forgetlab.core.taskvectors import distance
from forgetlab.zoo.datafiles import read_data
from forgetlab.zoo.pico import init_model, make_tokenizer, pretraining_texts
from forgetlab.zoo.presets import get_spec, EvalSpec
from forgetlab.zoo.training import pretrain, finetune, score

args = [a for a in sys.argv[1:] if not a.startswith("--root=")]
roots = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--root=")]
name = args[0]
kv = dict(a.split("=", 1) for a in args[1:])
torch.set_num_threads(int(kv.pop("threads", 1)))
spec = get_spec("pico", "default")
def f(k, d): return type(d)(kv[k]) if k in kv else d
data = replace(spec.data, skill_share=f("share", spec.data.skill_share), skill_form=f("form", spec.data.skill_form), code_level=f("code", spec.data.code_level))
pre = replace(spec.pretrain, steps=f("psteps", spec.pretrain.steps), lr=f("plr", spec.pretrain.lr),
              max_length=f("plen", spec.pretrain.max_length), batch_size=f("pbatch", spec.pretrain.batch_size))
shape = replace(spec.shape, hidden_size=f("hidden", spec.shape.hidden_size),
                intermediate_size=f("inter", spec.shape.intermediate_size),
                num_hidden_layers=f("layers", spec.shape.num_hidden_layers))
def per_task(key, defaults):
    """A value for every task from `key=V` or `key=math:V,code:V,…`; tasks left out keep `defaults[task]`."""
    raw = kv.pop(key, None)
    if raw is None:
        return dict(defaults)
    if ":" not in raw:
        return {t: type(d)(raw) for t, d in defaults.items()}
    given = dict(p.split(":") for p in raw.split(","))
    return {t: type(d)(given[t]) if t in given else d for t, d in defaults.items()}
ft_steps = per_task("fsteps", {t: spec.finetune.steps for t in spec.tasks})
ft_lr = per_task("flr", {t: spec.finetune_for(t).lr for t in spec.tasks})
ft_spec = {t: replace(spec.finetune, steps=ft_steps[t], lr=ft_lr[t]) for t in spec.tasks}
spec = replace(spec, data=data, pretrain=pre, shape=shape)
out = Path(roots[0] if roots else "/tmp/zoo_explore") / name
out.mkdir(parents=True, exist_ok=True)
log = open(out / "log.txt", "a")
def say(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()
say("settings", kv, {t: (s.steps, s.lr) for t, s in ft_spec.items()})
from forgetlab.zoo.datafiles import make_data, write_data
if not (out / "data").exists():
    write_data(make_data(spec), out / "data")
general_train, probes = read_data(out / "data", spec.tasks)
train_pairs = {t: d.train for t, d in probes.tasks.items()}
t0 = time.time()
tok = make_tokenizer(spec, general_train, train_pairs)
texts = pretraining_texts(spec, general_train, train_pairs)
if (out / "base.pt").exists():
    model = init_model(spec.shape, tok, spec.seed); model.load_state_dict(torch.load(out / "base.pt"))
else:
    model = init_model(spec.shape, tok, spec.seed)
    last = [0.0]
    def tick(fraction, message=""):
        if fraction - last[0] >= 0.1:
            last[0] = fraction; say("pretrain", f"{fraction:.0%}", message, f"{time.time() - t0:.0f} s")
    r = pretrain(model, tok, texts, spec.pretrain, seed=spec.seed, progress=tick)
    torch.save(model.state_dict(), out / "base.pt")
    say("pretrain s", round(time.time() - t0, 1), "final loss", round(r.final_loss, 3))
model.eval()
ev = EvalSpec(max_general=80, max_task=60, block_size=min(128, spec.pretrain.max_length))

def prefix_acc(m, task, n=60):
    pairs = probes.tasks[task].eval[:n]; hit = 0
    for p in pairs:
        ids = tok(p.prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            o = m.generate(ids, max_new_tokens=14, do_sample=False, pad_token_id=tok.pad_token_id)
        hit += tok.decode(o[0, ids.shape[1]:], skip_special_tokens=True).startswith(p.answer)
    return hit / len(pairs)

base_card = score(model, tok, probes, ev, name="base").to_dict()
say("base", json.dumps({k: v for k, v in base_card.items() if k in ("general_loss", "tasks")})[:600])
say("base prefix", {t: prefix_acc(model, t) for t in spec.tasks})
if kv.get("ft", "1") == "0":
    sys.exit()
theta0 = {k: v.clone() for k, v in model.state_dict().items()}
taus = {}
cards = {}
for task in spec.tasks:
    m = copy.deepcopy(model); m.train()
    finetune(m, tok, probes.tasks[task].train, ft_spec[task], seed=spec.seed + 1)
    m.eval()
    card = score(m, tok, probes, ev, name=task).to_dict()
    D = distance(m.state_dict(), theta0)
    say("ft", task, "D %.4f" % D, "dloss %.3f" % (card["general_loss"] - base_card["general_loss"]),
        json.dumps(card["tasks"][task]), "prefix", prefix_acc(m, task))
    taus[task] = {k: (v - theta0[k]).flatten() for k, v in m.state_dict().items()}
    cards[task] = card
em = lambda c, t: c["tasks"][t]["exact_match"]
for task in spec.tasks:
    own = em(cards[task], task) - em(base_card, task)
    say("gain on", task, "own %.2f" % own, {o: round(em(cards[o], task) - em(base_card, task), 2)
                                             for o in spec.tasks if o != task})
def cos(a, b, skip=()):
    keys = [k for k in a if not any(s in k for s in skip)]
    x = torch.cat([a[k] for k in keys]); y = torch.cat([b[k] for k in keys])
    return float(x @ y / (x.norm() * y.norm()))
ts = list(spec.tasks)
for i in range(len(ts)):
    for j in range(i + 1, len(ts)):
        say("cos", ts[i], ts[j], "all %.3f" % cos(taus[ts[i]], taus[ts[j]]),
            "no-embed %.3f" % cos(taus[ts[i]], taus[ts[j]], skip=("embed_tokens", "lm_head")))
say("total s", round(time.time() - t0, 1))
