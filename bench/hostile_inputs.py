"""Replay the hostile inputs of issue 17 against the `forgetlab` CLI (and the adapter readers against PEFT).

Every CLI case runs in a fresh copy of a tiny pool (made here with transformers, tokenizers and PEFT) and is
judged from the outside, as the issue's check does:

- the exit status (2 for a refusal; 0 where the fix is to do the right thing),
- no Python traceback on stdout or stderr, and the message is one paragraph (no blank line inside it),
- the folder tree before and after (every path and the sha256 of every file): nothing new on disk and no
  existing file changed or removed, except what the case is meant to write.

Adapter cases compare forgetlab's task vector with PEFT's `merge_and_unload()` minus the base.
Prints one markdown table (case | command | exit | message | verdict) and exits 1 if any case fails.

    python bench/hostile_inputs.py [--keep DIR] [--only SUBSTRING]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FORGETLAB = [sys.executable, "-m", "forgetlab"]


@dataclass
class Outcome:
    case: str
    command: str
    exit: int | str
    message: str
    verdict: str


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root (links not followed) with the sha256 of files ('dir' / 'link -> target')."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for d in dirnames:
            p = Path(dirpath) / d
            out[str(p.relative_to(root))] = f"link -> {os.readlink(p)}" if p.is_symlink() else "dir"
        for f in filenames:
            p = Path(dirpath) / f
            if p.is_symlink():
                out[str(p.relative_to(root))] = f"link -> {os.readlink(p)}"
            else:
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def tree_changes(before: dict, after: dict, allowed: tuple[str, ...]) -> list[str]:
    def ok(path: str) -> bool:
        return any(path == a or path.startswith(a.rstrip("/") + "/") for a in allowed)

    problems = [f"new {p}" for p in after if p not in before and not ok(p)]
    problems += [f"changed {p}" for p in before if p in after and after[p] != before[p] and not ok(p)]
    problems += [f"removed {p}" for p in before if p not in after and not ok(p)]
    return problems


def first_paragraph(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if "Warning" not in ln and not ln.startswith("  warnings.warn")]
    return " ".join(ln.strip() for ln in lines)[:240]


class Replay:
    def __init__(self, fixture: Path, work: Path, only: str | None):
        self.fixture, self.work, self.only = fixture, work, only
        self.results: list[Outcome] = []
        self.n = 0

    def fresh(self) -> Path:
        self.n += 1
        w = self.work / f"case{self.n:03d}"
        shutil.copytree(self.fixture, w, symlinks=True)
        return w

    def cli(self, case: str, argv: list[str], *, expect: int = 2, allowed: tuple[str, ...] = (), prepare=None,
            check=None, must_say: str | None = None, env: dict | None = None, timeout: float = 300,
            cwd_rel: str = ".") -> None:
        if self.only and self.only not in case:
            return
        w = self.fresh()
        if prepare:
            prepare(w)
        before = snapshot(w)
        home = w / ".home"
        full_env = {**os.environ, "FORGETLAB_HOME": str(home), "PYTHONWARNINGS": "ignore", **(env or {})}
        start = time.time()
        try:
            p = subprocess.run(FORGETLAB + argv, cwd=w / cwd_rel, env=full_env, capture_output=True, text=True,
                               timeout=timeout)
            code, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            code, out, err = "timeout", "", ""
        seconds = time.time() - start
        after = snapshot(w)
        problems = []
        if code != expect:
            problems.append(f"exit {code}, expected {expect}")
        if "Traceback" in out + err:
            problems.append("traceback")
        msg_text = err if code == 2 else (err + out)
        if code == 2 and "\n\n" in err.strip():
            problems.append("message of more than one paragraph")
        if must_say and must_say.lower() not in (out + err).lower():
            problems.append(f"message lacks {must_say!r}")
        problems += tree_changes(before, after, allowed + (".home",))
        if check:
            problems += check(w, out, err) or []
        cmd = " ".join(a if len(a) < 40 else a[:37] + "…" for a in argv)
        self.results.append(Outcome(case, f"`{cmd}`".replace("|", "\\|"), code,
                                    first_paragraph(msg_text).replace("|", "\\|") + f" ({seconds:.1f} s)",
                                    "ok" if not problems else "FAIL: " + "; ".join(problems)))

    def api(self, case: str, fn) -> None:
        if self.only and self.only not in case:
            return
        try:
            message, problems = fn(self.fresh())
        except Exception as exc:  # noqa: BLE001 - a case that raises is reported, not fatal
            message, problems = f"{type(exc).__name__}: {exc}"[:240], ["raised"]
        self.results.append(Outcome(case, "(Python API)", "—", message.replace("|", "\\|"),
                                    "ok" if not problems else "FAIL: " + "; ".join(problems)))


# -- fixtures ------------------------------------------------------------------------------------------------

def make_fixture(root: Path) -> Path:
    """A tiny Llama pool (base, ft0, ft1, probes, pool.yaml), three PEFT adapters and a few recipe files."""
    from tests.conftest import make_tiny_pool

    make_tiny_pool(root, "llama")
    write_yaml(root / "ties.yaml", {"method": "ties", "base": "base", "models": ["ft0", "ft1"]})
    return root


def write_yaml(path: Path, data) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_adapter(base: Path, out: Path, **lora) -> dict:
    """A PEFT adapter with every trainable tensor randomised; returns merge_and_unload()'s state dict."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base))
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, **lora))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in peft_model.named_parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(str(out))
    return {k: v.detach().clone() for k, v in peft_model.merge_and_unload().state_dict().items()}


ALIAS_BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"]
                       + [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                          f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                          f"*{chr(97 + i)}]" for i in range(8)])


# -- the cases -----------------------------------------------------------------------------------------------

def cases(r: Replay) -> None:  # noqa: C901 - one flat list of cases reads best
    merge = ["merge", "ties.yaml"]

    # Data loss: --overwrite replaces only forgetlab's own outputs
    def thesis(w):
        (w / "thesis").mkdir()
        (w / "thesis" / "chapter1.tex").write_text("years of work")
    r.cli("merge --overwrite onto a folder forgetlab did not write", merge + ["thesis", "--overwrite"],
          prepare=thesis, must_say="not written by forgetlab")
    r.cli("merge --overwrite onto the folder holding the inputs", ["merge", "ties.yaml", ".", "--overwrite"])
    r.cli("merge --overwrite onto the current folder (cwd = inputs' parent)",
          ["merge", "../ties.yaml", ".", "--overwrite"], cwd_rel="data")

    def link(w):
        thesis(w)
        (w / "link").symlink_to(w / "thesis")
    r.cli("merge --overwrite onto a symlink to a user folder", merge + ["link", "--overwrite"], prepare=link)

    def afile(w):
        (w / "notes.txt").write_text("mine")
    r.cli("merge --overwrite onto an existing file", merge + ["notes.txt", "--overwrite"], prepare=afile)

    def own_merge(w):
        subprocess.run(FORGETLAB + merge + ["out"], cwd=w, capture_output=True, check=True,
                       env={**os.environ, "FORGETLAB_HOME": str(w / ".home"), "PYTHONWARNINGS": "ignore"})

    def no_leftovers(w, out, err):
        return [f"leftover {p.name}" for p in w.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    r.cli("merge --overwrite onto its own earlier merge (replaced)", merge + ["out", "--overwrite"], expect=0,
          prepare=own_merge, allowed=("out",), check=no_leftovers)

    # zoo build never deletes user folders
    def user_zoo(w):
        z = w / ".home" / "zoo" / "pico-tiny"
        for d in ("data", "base", "ft-math", "lora-math"):
            (z / d).mkdir(parents=True)
        (z / "data" / "mydata.csv").write_text("a,b\n1,2\n")
    r.cli("zoo build into a zoo folder of user folders without a manifest", ["zoo", "build", "--size", "tiny"],
          prepare=user_zoo,
          check=lambda w, o, e: [] if (w / ".home/zoo/pico-tiny/data/mydata.csv").read_text() == "a,b\n1,2\n"
          else ["mydata.csv changed"])

    # pool files edited without losing what is not ours
    def commented_pool(w):
        text = (w / "pool.yaml").read_text()
        (w / "pool.yaml").write_text("# my notes about this pool\n" + text + "my_key: kept\n")

    def pool_kept(w, out, err):
        text = (w / "pool.yaml").read_text()
        problems = [] if "# my notes about this pool" in text else ["comment dropped"]
        problems += [] if "my_key: kept" in text else ["user key dropped"]
        problems += [] if "mine:" in text else ["saved model not added"]
        return problems
    r.cli("finetune --save-as keeps pool.yaml's comments and keys",
          ["finetune", "pool.yaml", "--task", "math", "--steps", "2", "--max-general", "2", "--max-task", "2",
           "--save-as", "mine", "--no-save"], expect=0, prepare=commented_pool, allowed=("pool.yaml", "finetuned"),
          check=pool_kept)

    # --out never replaces a file
    r.cli("taskvec --out onto an existing file", ["taskvec", "pool.yaml", "--out", "notes.txt"], prepare=afile)
    r.cli("merge-export --out onto an existing file", ["merge-export", "ties.yaml", "--out", "notes.txt"],
          prepare=afile)
    r.cli("eval --out onto an existing file", ["eval", "pool.yaml", "--max-general", "1", "--max-task", "1",
                                              "--out", "notes.txt"], prepare=afile)

    def dotted(w):
        (w / "out" / "dir.v2").mkdir(parents=True)
    r.cli("taskvec --out out/dir.v2/norms writes inside out/dir.v2", ["taskvec", "pool.yaml", "--out",
                                                                      "out/dir.v2/norms"],
          expect=0, prepare=dotted, allowed=("out/dir.v2",))
    r.cli("--out names a folder (taskvec)", ["taskvec", "pool.yaml", "--out", "data"])
    r.cli("--out names a folder (merge-export)", ["merge-export", "ties.yaml", "--out", "data"])
    r.cli("--out names a folder (eval)", ["eval", "pool.yaml", "--out", "data"])
    r.cli("--out into a folder that does not exist (taskvec)", ["taskvec", "pool.yaml", "--out", "nope/x.csv"])
    r.cli("--out into a folder that does not exist (merge-export)",
          ["merge-export", "ties.yaml", "--out", "nope/x.yaml"])

    # names
    for label, name in [("a newline", "abc\n"), ("a control character", "a\x01b"), ("300 characters", "n" * 300)]:
        r.cli(f"finetune --save-as with {label}", ["finetune", "pool.yaml", "--task", "math", "--steps", "2",
                                                   "--save-as", name, "--no-save"])

        # on the CLI a recipe's name is only recorded (the output is the folder given on the command line):
        # the merge must go exactly there and say so; the app, where the name makes the folder, refuses it
        def named(w, name=name):
            write_yaml(w / "named.yaml", {"method": "ties", "name": name, "base": "base", "models": ["ft0", "ft1"]})
        r.cli(f"recipe name with {label} (CLI: written only to OUT)", ["merge", "named.yaml", "out"], prepare=named,
              expect=0, allowed=("out",), must_say="into")

    def nul_name(w):
        (w / "nul.yaml").write_text('method: ties\nname: "a\\0b"\nbase: base\nmodels: [ft0, ft1]\n')
    r.cli("recipe name with a NUL (CLI: written only to OUT)", ["merge", "nul.yaml", "out"], prepare=nul_name,
          expect=0, allowed=("out",), must_say="into")

    def escaping(w):
        write_yaml(w / "esc.yaml", {"method": "ties", "name": "../../escape", "base": "base", "models": ["ft0"]})
    r.cli("recipe name with ../ (CLI: written only to OUT)", ["merge", "esc.yaml", "out"], prepare=escaping,
          expect=0, allowed=("out",), must_say="into",
          check=lambda w, o, e: ["wrote outside"] if (w.parent / "escape").exists() or (w.parent.parent / "escape").exists() else [])

    # YAML alias bombs
    def bomb_recipe(w):
        (w / "bomb.yaml").write_text(ALIAS_BOMB + "\nmethod: ties\nbase: *i\nmodels: [ft0]\n")
    r.cli("recipe whose base is a 9-level alias bomb", ["merge", "bomb.yaml", "out"], prepare=bomb_recipe,
          timeout=60, must_say="alias")

    def bomb_pool(w):
        (w / "bpool.yaml").write_text(ALIAS_BOMB + "\nbase: *i\n")
    r.cli("pool file with an alias bomb", ["taskvec", "bpool.yaml"], prepare=bomb_pool, timeout=60, must_say="alias")

    def bomb_mk(w):
        (w / "bmk.yaml").write_text(ALIAS_BOMB + "\nmerge_method: ties\nbase_model: base\nmodels: *i\n")
    r.cli("mergekit YAML with an alias bomb", ["merge", "bmk.yaml", "out"], prepare=bomb_mk, timeout=60,
          must_say="alias")

    # non-finite and empty checkpoints
    def nan_ft(w):
        from safetensors.torch import load_file, save_file
        f = w / "ft1" / "model.safetensors"
        sd = load_file(str(f))
        name = next(iter(k for k in sd if "mlp" in k))
        sd[name][0, 0] = float("nan")
        save_file(sd, str(f), metadata={"format": "pt"})
    r.cli("merge of a fine-tune holding NaN", merge + ["out"], prepare=nan_ft, must_say="NaN")
    r.cli("taskvec of a fine-tune holding NaN shows NaN", ["taskvec", "pool.yaml"], expect=0, prepare=nan_ft,
          check=lambda w, o, e: [] if "nan" in o.lower() else ["no NaN in the table"])

    def empty_ft(w):
        from safetensors.torch import save_file
        save_file({}, str(w / "ft1" / "model.safetensors"))
    r.cli("merge of a checkpoint with zero tensors", merge + ["out"], prepare=empty_ft)

    # recipe values
    for label, extra in [("seed 1.9", "seed: 1.9"), ("seed .inf", "seed: .inf"), ("seed 'abc'", "seed: abc"),
                         ("models as a string", None), ("HMA with more α than blocks", None)]:
        def rec(w, extra=extra, label=label):
            if label == "models as a string":
                (w / "r.yaml").write_text("method: ties\nbase: base\nmodels: ft0\n")
            elif label.startswith("HMA"):
                write_yaml(w / "r.yaml", {"method": "hma", "base": "base", "models": ["ft0"],
                                          "params": {"alphas": [0.1, 0.2, 0.3, 0.4, 0.5]}})
            else:
                (w / "r.yaml").write_text(f"method: dare_ties\nbase: base\nmodels: [ft0, ft1]\n{extra}\n")
        r.cli(f"recipe with {label}", ["merge", "r.yaml", "out"], prepare=rec)

    def mk_density(w):
        (w / "mk.yaml").write_text("merge_method: ties\nbase_model: base\nmodels:\n  - model: ft0\n"
                                   "    parameters: {density: 1.7, weight: 1}\n")
    r.cli("mergekit density 1.7 (merge-export --to forgetlab)", ["merge-export", "mk.yaml", "--to", "forgetlab"],
          prepare=mk_density)

    def mk_int(w):
        (w / "mk.yaml").write_text("merge_method: ties\nbase_model: base\nmodels:\n  - 5\n")
    r.cli("mergekit model entry that is an int", ["merge", "mk.yaml", "out"], prepare=mk_int)

    def mk_list(w):
        (w / "mk.yaml").write_text("merge_method: ties\nbase_model: base\nmodels:\n  - model: ft0\n"
                                   "    parameters: [1, 2]\n")
    r.cli("mergekit parameters as a list", ["merge", "mk.yaml", "out"], prepare=mk_list)

    # bad adapters
    def adapter(w, config, name="bad"):
        from safetensors.torch import save_file
        import torch
        d = w / name
        d.mkdir()
        (d / "adapter_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 32),
                   "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(32, 2)},
                  str(d / "adapter_model.safetensors"))
    for label, cfg in [("r: 0", {"r": 0, "base_model_name_or_path": "../base"}),
                       ("r: \"8\"", {"r": "8", "base_model_name_or_path": "../base"}),
                       ("malformed JSON", "{r: 2,")]:
        r.cli(f"inspect of an adapter with {label}", ["inspect", "bad", "--base", "base"],
              prepare=lambda w, cfg=cfg: adapter(w, cfg))

    def self_ref(w):
        adapter(w, {"r": 2, "base_model_name_or_path": "."}, "bad")
    r.cli("adapter whose base is itself", ["inspect", "bad"], prepare=self_ref)

    def mutual(w):
        adapter(w, {"r": 2, "base_model_name_or_path": "../b"}, "a")
        adapter(w, {"r": 2, "base_model_name_or_path": "../a"}, "b")
    r.cli("two adapters naming each other", ["inspect", "a"], prepare=mutual)

    def bad_index(w):
        import torch
        d = w / "binft"
        d.mkdir()
        shutil.copy(w / "ft0" / "config.json", d / "config.json")
        torch.save({}, d / "pytorch_model-00001-of-00001.bin")
        (d / "pytorch_model.bin.index.json").write_text("{not json")
    r.cli("malformed pytorch_model.bin.index.json", ["inspect", "binft"], prepare=bad_index)

    def bad_config(w):
        cfg = json.loads((w / "ft1" / "config.json").read_text())
        cfg["intermediate_size"] = 48
        (w / "ft1" / "config.json").write_text(json.dumps(cfg))
    r.cli("eval of a model whose config disagrees with its weights", ["eval", "pool.yaml", "--max-general", "1",
                                                                       "--max-task", "1"], prepare=bad_config)
    r.cli("inspect of a model whose config disagrees with its weights", ["inspect", "ft1"], prepare=bad_config)

    # numbers and devices
    alpha = ["sweep", "alpha", "pool.yaml", "--model", "ft0", "--task", "math", "--no-save"]
    r.cli("sweep --batch-size 0", alpha + ["--batch-size", "0"])
    r.cli("sweep --device tpu9", alpha + ["--device", "tpu9"])
    r.cli("merge --device tpu9", merge + ["out", "--device", "tpu9"])
    r.cli("eval --max-general 0", ["eval", "pool.yaml", "--max-general", "0"])
    r.cli("eval --max-task -3", ["eval", "pool.yaml", "--max-task", "-3"])
    r.cli("sweep --max-general -1", alpha + ["--max-general", "-1"])

    # pools
    def typo_pool(w):
        (w / "pool.yaml").write_text((w / "pool.yaml").read_text().replace("models:", "modles:"))
    r.cli("pool with a misspelt key (modles)", ["taskvec", "pool.yaml"], prepare=typo_pool)

    def bad_template(w):
        (w / "pool.yaml").write_text((w / "pool.yaml").read_text().replace("probes:", "probes:\n  template: nosuch"))
    r.cli("pool with an unknown prompt template", ["eval", "pool.yaml"], prepare=bad_template)

    # LoRA variants: the task vector equals PEFT's merged weights minus the base
    def variant(kwargs):
        def fn(w):
            from forgetlab.checkpoints import open_checkpoint
            merged = make_adapter(w / "base", w / "adp", **kwargs)
            base = open_checkpoint(w / "base")
            ckpt = open_checkpoint(w / "adp", base=base)
            err = 0.0
            for n in ckpt.names():
                ref = merged[n].float() - base.read(n) if n in merged else None
                if ref is not None:
                    err = max(err, float((ckpt.delta(n) - ref).abs().max()))
            return f"max \\|τ − (merge_and_unload − θ0)\\| = {err:.2e}", ([] if err < 1e-5 else ["differs from PEFT"])
        return fn
    r.api("DoRA adapter vs PEFT", variant({"use_dora": True, "target_modules": ["q_proj", "v_proj"]}))
    r.api("adapter with modules_to_save (lm_head) vs PEFT",
          variant({"target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]}))
    r.api("LoRA on embed_tokens vs PEFT", variant({"target_modules": ["embed_tokens", "q_proj"]}))
    r.api("rsLoRA with rank_pattern vs PEFT", variant({"target_modules": ["q_proj", "v_proj"], "use_rslora": True,
                                                       "rank_pattern": {"v_proj": 2}}))

    # Killed merges leave nothing behind
    def kill_case(sig):
        def fn(w):
            big = w / "big"
            make_big(big)
            env = {**os.environ, "FORGETLAB_HOME": str(w / ".home"), "PYTHONWARNINGS": "ignore"}
            p = subprocess.Popen(FORGETLAB + ["merge", "ties.yaml", "out"], cwd=big, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.time() + 60
            while time.time() < deadline and p.poll() is None and not list(big.glob(".out.tmp-*")):
                time.sleep(0.005)
            hit = p.poll() is None
            p.send_signal(sig)
            _, err = p.communicate(timeout=60)
            if sig == signal.SIGKILL:  # nothing can run on SIGKILL: the next run cleans up
                subprocess.run(FORGETLAB + ["merge", "ties.yaml", "out2"], cwd=big, env=env, capture_output=True)
            left = [x.name for x in big.iterdir() if ".tmp-" in x.name]
            msg = (f"signal sent {'while the merge ran' if hit else 'after the merge finished'}; exit {p.returncode}; "
                   f"leftovers after{' the next run' if sig == signal.SIGKILL else ''}: {left or 'none'}; "
                   f"{first_paragraph(err)[:120]}")
            problems = [f"leftover {left}"] if left else []
            problems += [] if hit else ["not reproduced: the merge finished before the signal"]
            problems += ["traceback"] if "Traceback" in err else []
            problems += ["output folder exists"] if sig != signal.SIGKILL and (big / "out").exists() else []
            return msg, problems
        return fn
    r.api("merge killed with SIGTERM", kill_case(signal.SIGTERM))
    r.api("merge killed with SIGKILL, then the next run", kill_case(signal.SIGKILL))

    def concurrent(w):
        env = {**os.environ, "FORGETLAB_HOME": str(w / ".home"), "PYTHONWARNINGS": "ignore"}
        big = w / "big"
        make_big(big)
        subprocess.run(FORGETLAB + ["merge", "ties.yaml", "out"], cwd=big, env=env, capture_output=True, check=True)
        ps = [subprocess.Popen(FORGETLAB + ["merge", "ties.yaml", "out", "--overwrite"], cwd=big, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=300) for p in ps]
        codes = sorted(p.returncode for p in ps)
        refused = [first_paragraph(e) for p, (_, e) in zip(ps, outs) if p.returncode == 2]
        problems = [] if codes in ([0, 2], [0, 0]) else [f"exit codes {codes}"]
        if codes == [0, 0]:
            problems.append("both reported success")
        problems += ["traceback"] if any("Traceback" in e for _, e in outs) else []
        return f"exit codes {codes}; refused: {refused[0][:160] if refused else '-'}", problems
    r.api("two --overwrite merges at once", concurrent)


_BIG: Path | None = None


def make_big(folder: Path) -> None:
    """A base and two fine-tunes of ~45M parameters each (a merge that takes a moment), made once and copied."""
    global _BIG
    if _BIG is None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        _BIG = Path(tempfile.mkdtemp(prefix="hostile-big-"))
        cfg = LlamaConfig(vocab_size=8000, hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                          num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=False)
        torch.manual_seed(0)
        m = LlamaForCausalLM(cfg)
        m.save_pretrained(str(_BIG / "base"))
        for i in range(2):
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(0.01 * torch.randn_like(p))
            m.save_pretrained(str(_BIG / f"ft{i}"))
        write_yaml(_BIG / "ties.yaml", {"method": "ties", "base": "base", "models": ["ft0", "ft1"]})
    shutil.copytree(_BIG, folder)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--only", help="only cases whose name contains this")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="hostile-"))
    work.mkdir(parents=True, exist_ok=True)
    fixture = make_fixture(work / "fixture")
    r = Replay(fixture, work, args.only)
    start = time.time()
    cases(r)
    print(f"hostile inputs of issue 17, replayed {time.strftime('%Y-%m-%d %H:%M')} in {time.time() - start:.0f} s "
          f"(python bench/hostile_inputs.py)\n")
    print("| case | command | exit | message (first 240 characters; time) | verdict |")
    print("| --- | --- | --- | --- | --- |")
    for o in r.results:
        print(f"| {o.case} | {o.command} | {o.exit} | {o.message} | {o.verdict} |")
    bad = [o for o in r.results if o.verdict != "ok"]
    print(f"\n{len(r.results) - len(bad)} of {len(r.results)} cases ok")
    if _BIG:
        shutil.rmtree(_BIG, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
