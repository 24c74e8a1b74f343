"""Same numbers before and after a refactor: run the same CLI jobs with two source trees and compare what they write.

    python tools/same_numbers.py OLD_TREE NEW_TREE [--pool POOL] [--work DIR]

Each tree is a checkout of forgetlab (e.g. `git worktree add /tmp/before <commit>`); its CLI runs as
`python -m forgetlab …` with PYTHONPATH=TREE, in a workspace of its own (FORGETLAB_HOME under --work, the pool's
zoo linked in), with the same arguments and seeds. The jobs cover the sweeps (every kind), linearity, attribution,
the text view, features, task-vector norms, the scorecards, the merge search, PCB's λ search, a fine-tune
comparison and merges of several methods. Tables are compared column by column (numbers: the largest absolute
difference; text: equal), leaving out what measures the run rather than the model (seconds, workers, peaks);
merged models tensor by tensor. Prints one line per output and exits 1 when anything differs beyond `--atol`.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

TIMING = ("seconds", "worker", "worker_host", "worker_pid", "peak", "time", "elapsed", "created", "run")


def jobs(pool: str, out: Path, recipes: Path) -> dict[str, list[str]]:
    """name → CLI arguments (the output file(s) under `out`, named after the job)."""
    small = ["--max-general", "4", "--max-task", "4"]
    j = {
        "sweep-alpha": ["sweep", "alpha", pool, "--model", "math", "--alphas", "0,0.5,1", *small],
        "sweep-pruning": ["sweep", "pruning", pool, "--model", "math", "--ratios", "0,0.9", *small],
        "sweep-density": ["sweep", "density", pool, "--model", "math", "--drops", "0,0.9", "--keeps", "1,0.2",
                          "--methods", "dare", "ties", "della", *small],
        "sweep-hma": ["sweep", "hma", pool, "--model", "math", "--grid", "0.1,0.3", "0.5,0.5", *small],
        "sweep-lines": ["sweep", "lines", pool, "--model", "math", "--betas", "0,0.5", *small],
        "sweep-rank": ["sweep", "rank", pool, "--model", "math", "--ranks", "0.5,1", *small],
        "sweep-iso": ["sweep", "iso", pool, "--model", "math", "--iso-alphas", "0.5,1", *small],
        "linearity": ["linearity", pool, "--task", "math", "--samples", "6", "--alphas", "0,0.5",
                      "--curves", str(out / "linearity-curves.csv")],
        "attribution": ["attribution", pool, "--model", "math", "--level", "layer", *small],
        "textdiff": ["textdiff", pool, "--model", "math", "--max-general", "2"],
        "features": ["features", pool, "--tasks", "math", "code", "--samples", "6", "--perplexity", "2",
                     "--distances", str(out / "features-distances.csv")],
        "taskvec": ["taskvec", pool],
        "eval": ["eval", pool, "--no-lm-eval", *small],
        "search": ["search", str(recipes / "ta.yaml"), "--pool", pool, "--budget", "4", "--seed", "1", *small],
        "pcb-search": ["pcb-search", str(recipes / "pcb.yaml"), "--pool", pool, "--budget", "4", "--seed", "1"],
        "finetune": ["finetune", pool, "--task", "math", "--compare", "--steps", "4", "--eval-every", "2", *small],
    }
    for name, args in j.items():
        suffix = ".yaml" if name == "pcb-search" else ".csv"
        args += ["--out", str(out / f"{name}{suffix}")]
        if name not in ("eval", "pcb-search", "taskvec", "features"):
            args.append("--no-save")
    for method in ("ties", "dare_ties", "pcb", "slwm", "regmean", "tsv"):
        j[f"merge-{method}"] = ["merge", str(recipes / f"{method}.yaml"), str(out / f"merge-{method}"), "--pool", pool]
    return j


def write_recipes(pool_yaml: Path, folder: Path) -> None:
    """The merge recipes the jobs use, over the pool's three full fine-tunes."""
    folder.mkdir(parents=True, exist_ok=True)
    import yaml

    root = pool_yaml.parent
    spec = yaml.safe_load(pool_yaml.read_text())
    base = (root / spec["base"]).resolve()
    models = [(root / spec["models"][m]).resolve() for m in ("math", "code", "translate")]
    params = {"ta": {"lam": 0.5}, "ties": {"keep": 0.3}, "dare_ties": {"drop": 0.5, "seed": 3},
              "pcb": {"keep": 0.2}, "slwm": {"samples": 16}, "regmean": {"samples": 16}, "tsv": {}}
    for method, p in params.items():
        name = "task_arithmetic" if method == "ta" else method
        lines = [f"method: {name}", f"base: {base}", "models:"] + [f"  - {{model: {m}}}" for m in models]
        if p:
            lines.append("params: {" + ", ".join(f"{k}: {v}" for k, v in p.items()) + "}")
        (folder / f"{method}.yaml").write_text("\n".join(lines) + "\n")


def run_tree(tree: Path, pool: str, work: Path) -> Path:
    """Run every job with `tree`'s forgetlab; returns the folder of its outputs."""
    home, out = work / f"home-{tree.name}", work / f"out-{tree.name}"
    home.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    zoo = Path(pool).resolve().parent.parent
    if not (home / "zoo").exists():
        (home / "zoo").symlink_to(zoo, target_is_directory=True)
    write_recipes(Path(pool), work / "recipes")
    env = {**os.environ, "PYTHONPATH": str(tree), "FORGETLAB_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    for name, args in jobs(pool, out, work / "recipes").items():
        r = subprocess.run([sys.executable, "-m", "forgetlab", *args], env=env, cwd=tree, capture_output=True,
                           text=True, timeout=1800)
        (out / f"{name}.log").write_text(r.stdout + r.stderr)
        print(f"{tree.name}: {name} exited {r.returncode}", flush=True)
    return out


def compare_tables(a: Path, b: Path) -> tuple[float, str]:
    """(largest absolute difference of the numeric columns, what else differs) of two CSV files."""
    fa, fb = pd.read_csv(a), pd.read_csv(b)
    keep = [c for c in fa.columns if not any(t in c for t in TIMING)]
    if list(fb.columns[[not any(t in c for t in TIMING) for c in fb.columns]]) != keep or len(fa) != len(fb):
        return float("inf"), f"columns or rows differ: {list(fa.columns)} vs {list(fb.columns)}, {len(fa)} vs {len(fb)}"
    worst, notes = 0.0, []
    for c in keep:
        if pd.api.types.is_numeric_dtype(fa[c]) and pd.api.types.is_numeric_dtype(fb[c]):
            d = (fa[c].astype(float) - fb[c].astype(float)).abs()
            both_nan = fa[c].isna() & fb[c].isna()
            worst = max(worst, float(d[~both_nan].max() if (~both_nan).any() else 0.0))
            if (fa[c].isna() != fb[c].isna()).any():
                notes.append(f"{c}: NaN in different rows")
        elif not fa[c].astype(str).equals(fb[c].astype(str)):
            notes.append(f"{c}: text differs")
    return worst, "; ".join(notes)


def compare_folders(a: Path, b: Path) -> float:
    """Largest absolute difference over every tensor of two merged-model folders (inf if the names differ)."""
    from safetensors.torch import load_file

    def tensors(folder: Path) -> dict:
        out = {}
        for f in sorted(folder.glob("*.safetensors")):
            out.update(load_file(str(f)))
        return out

    ta, tb = tensors(a), tensors(b)
    if set(ta) != set(tb) or not ta:
        return float("inf")
    return max(float((ta[k].float() - tb[k].float()).abs().max()) if ta[k].numel() else 0.0 for k in ta)


def main(argv: list[str] | None = None) -> int:
    """Run both trees and print the comparison; 1 when anything differs beyond --atol."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--pool", default=str(Path.home() / ".forgetlab/zoo/pico-tiny/pool.yaml"))
    p.add_argument("--work", type=Path, default=Path("/tmp/same-numbers"))
    p.add_argument("--atol", type=float, default=0.0)
    p.add_argument("--compare-only", action="store_true", help="compare the outputs of an earlier run")
    args = p.parse_args(argv)
    trees = [t.resolve() for t in (args.old, args.new)]
    outs = ([args.work / f"out-{t.name}" for t in trees] if args.compare_only
            else [run_tree(t, args.pool, args.work) for t in trees])
    bad = 0
    for fa in sorted(outs[0].iterdir()):
        fb = outs[1] / fa.name
        if fa.suffix == ".log":
            continue
        if not fb.exists():
            print(f"{fa.name}: missing in the new tree's outputs")
            bad += 1
            continue
        if fa.is_dir():
            worst, note = compare_folders(fa, fb), ""
        elif fa.suffix == ".csv":
            worst, note = compare_tables(fa, fb)
        else:
            worst, note = (0.0, "") if fa.read_text() == fb.read_text() else (float("inf"), "file differs")
        ok = worst <= args.atol and not note
        bad += not ok
        print(f"{'same' if ok else 'DIFFERENT'}  {fa.name}: max |Δ| {worst:.3g}" + (f"; {note}" if note else ""))
    for fb in sorted(outs[1].iterdir()):
        if fb.suffix != ".log" and not (outs[0] / fb.name).exists():
            print(f"{fb.name}: only in the new tree's outputs")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
