"""Merges of a zoo, hashed: the check that a refactoring left every merge byte-identical.

Runs `forgetlab merge` (the CLI, as a user would) for every registered method with its defaults and a few
variants (global scopes, LoRA adapters, per-model weights) on a zoo's pool, and records the sha256 of every
file of each output folder except forgetlab's marker and the recipe (which records the version). Run it before
and after a change and compare:

    python bench/merge_identity.py ~/.forgetlab/zoo/pico/pool.yaml --save before.json
    # … change the code …
    python bench/merge_identity.py ~/.forgetlab/zoo/pico/pool.yaml --compare before.json

`--python` runs another tree's forgetlab (e.g. a worktree: `--python "env PYTHONPATH=/path/to/tree python"`).
Prints one line per case (hash prefix, seconds; `same`/`DIFFERENT` with --compare) and exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SKIP = {".forgetlab-output.json", "recipe.yaml"}


def cases(pool: dict) -> list[tuple[str, dict, bool]]:
    """(case name, recipe without base, needs the pool) for every method and the variants worth pinning."""
    models = pool.get("models") or {}
    full = [m for m, v in models.items() if isinstance(v, str)]
    lora = [m for m, v in models.items() if isinstance(v, dict)]
    one, three = full[:1], full[:3]
    out = [
        ("linear", {"method": "linear", "models": three}, False),
        ("linear weights", {"method": "linear", "models": three, "params": {"weights": [0.5, 0.3, 0.2]}}, False),
        ("wise_ft", {"method": "wise_ft", "models": one}, False),
        ("wise_ft alpha=0.3", {"method": "wise_ft", "models": one, "params": {"alpha": 0.3}}, False),
        ("hma", {"method": "hma", "models": one}, False),
        ("task_arithmetic", {"method": "task_arithmetic", "models": three}, False),
        ("task_arithmetic lam=0.4", {"method": "task_arithmetic", "models": three, "params": {"lam": 0.4}}, False),
        ("ties", {"method": "ties", "models": three}, False),
        ("ties global", {"method": "ties", "models": three, "params": {"scope": "global"}}, False),
        ("ties keep=1", {"method": "ties", "models": three, "params": {"keep": 1.0}}, False),
        ("dare_linear", {"method": "dare_linear", "models": three}, False),
        ("dare_linear drop=0.5 seed=3", {"method": "dare_linear", "models": three,
                                        "params": {"drop": 0.5, "seed": 3}}, False),
        ("dare_ties", {"method": "dare_ties", "models": three}, False),
        # forgetlab's DARE before issue 25 (mergekit's defaults are now the methods' own): equal to main's
        # "dare_linear" / "dare_linear drop=0.5 seed=3" / "dare_ties" hashes
        ("dare_linear rescale=inverse", {"method": "dare_linear", "models": three,
                                         "params": {"rescale": "inverse"}}, False),
        ("dare_linear drop=0.5 seed=3 rescale=inverse", {"method": "dare_linear", "models": three,
                                                         "params": {"drop": 0.5, "seed": 3, "rescale": "inverse"}},
         False),
        ("dare_ties normalize rescale=inverse", {"method": "dare_ties", "models": three,
                                                "params": {"normalize": True, "rescale": "inverse"}}, False),
        ("breadcrumbs", {"method": "breadcrumbs", "models": three}, False),
        ("consensus", {"method": "consensus", "models": three}, False),
        ("pcb", {"method": "pcb", "models": three}, False),
        ("pcb tensor", {"method": "pcb", "models": three, "params": {"scope": "tensor"}}, False),
        ("fapm", {"method": "fapm", "models": three}, False),
        ("fapm magnitude", {"method": "fapm", "models": three, "params": {"score": "magnitude"}}, False),
        ("slwm", {"method": "slwm", "models": three, "params": {"samples": 8}}, True),
    ]
    if lora:
        out += [
            ("task_arithmetic lora", {"method": "task_arithmetic", "models": lora[:3]}, False),
            ("fapm lora", {"method": "fapm", "models": lora[:3]}, False),
            ("ties lora", {"method": "ties", "models": lora[:3]}, False),
        ]
    return out


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in SKIP):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pool", type=Path, help="a zoo's pool.yaml (e.g. ~/.forgetlab/zoo/pico/pool.yaml)")
    ap.add_argument("--save", type=Path, help="write the hashes to this JSON file")
    ap.add_argument("--compare", type=Path, help="compare with hashes saved earlier; exit 1 on a difference")
    ap.add_argument("--python", default=sys.executable, help="how to run python for `-m forgetlab`")
    ap.add_argument("--only", help="only cases whose name contains this")
    args = ap.parse_args()
    pool_file = args.pool.expanduser().resolve()
    pool = yaml.safe_load(pool_file.read_text())
    root = pool_file.parent
    models = pool.get("models") or {}

    def ref(name: str) -> str:
        v = models[name]
        return str(root / (v["adapter"] if isinstance(v, dict) else v))

    old = json.loads(args.compare.read_text()) if args.compare else {}
    found, bad = {}, 0
    with tempfile.TemporaryDirectory(prefix="merge-identity-") as tmp:
        for i, (name, recipe, needs_pool) in enumerate(cases(pool)):
            if args.only and args.only not in name:
                continue
            r = {"method": recipe["method"], "base": str(root / pool["base"]),
                 "models": [ref(m) for m in recipe["models"]], "params": recipe.get("params", {})}
            rfile = Path(tmp) / f"r{i}.yaml"
            rfile.write_text(yaml.safe_dump(r))
            out = Path(tmp) / f"m{i}"
            cmd = [*shlex.split(args.python), "-m", "forgetlab", "merge", str(rfile), str(out)]
            cmd += ["--pool", str(pool_file)] if needs_pool else []
            start = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True)
            seconds = time.time() - start
            if p.returncode != 0:
                found[name] = f"failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}"
            else:
                found[name] = digest(out)
            verdict = ""
            if old:
                same = old.get(name) == found[name]
                verdict = "same" if same else "DIFFERENT"
                bad += not same
            print(f"{name:30s} {found[name][:16]:18s} {seconds:6.1f} s {verdict}", flush=True)
    if args.save:
        args.save.write_text(json.dumps(found, indent=2) + "\n")
    if old:
        print(f"\n{len(found) - bad} of {len(found)} merges byte-identical to {args.compare}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
