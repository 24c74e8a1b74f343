"""What each paper study costs, against its peer in the same run: the single runs it is made of, each run on its own.

A study declares its single runs (`Analysis.singles(pool, settings)`: (analysis name, settings) pairs — e.g. one
`forgetlab finetune` per run of a fine-tune study, with the study's budget and records — or (label, job) pairs for
a command that is no analysis, e.g. one `forgetlab merge RECIPE OUT --eval` per merge an SLWM study scores). This
script runs each study at its defaults (as `forgetlab study NAME POOL` does, the run not saved), then its singles
one after another (an analysis through the same registry, a command's job as it is), and prints both costs in wall and CPU seconds and their ratio. The issue's aim: ≤ 1.2×
(a study shares the base's scoring and its data; it must not cost more than running its parts by hand).

    FORGETLAB_HOME=… python bench/studies_cost.py [POOL] [--study NAME[,NAME…]] [--skip-peer]

A study without declared singles is listed with its own cost only.
"""
from __future__ import annotations

import argparse
import time

from forgetlab.analysis.base import ANALYSES
from forgetlab.analysis.study import studies
from forgetlab.core.pool import ModelPool
from forgetlab.core.threads import governed_threads
from forgetlab.core.workspace import home


def timed(fn):
    """(wall seconds, CPU seconds of this process, result) of one call."""
    w, c = time.perf_counter(), time.process_time()
    with governed_threads():               # torch threads as the CLI sets them (the machine's free cores)
        out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pool", nargs="?", default=None, help="pool.yaml (default: the workspace's pico demo zoo)")
    ap.add_argument("--study", default=None, help="only these studies (comma-separated; default: every one)")
    ap.add_argument("--skip-peer", action="store_true", help="time the studies only")
    args = ap.parse_args()
    pool = ModelPool.from_yaml(args.pool or home() / "zoo" / "pico" / "pool.yaml")
    wanted = set(args.study.split(",")) if args.study else None
    rows = []
    for analysis in studies():
        name = analysis.study.name
        if wanted is not None and name not in wanted:
            continue
        settings = analysis.make_settings()
        analysis.check(settings, pool)
        wall, cpu, _ = timed(lambda: analysis.run(pool, settings))
        singles = analysis.singles(pool, settings) if analysis.singles is not None else []
        peer_wall = peer_cpu = float("nan")
        if singles and not args.skip_peer:
            peer_wall = peer_cpu = 0.0
            for kind, single in singles:          # an analysis' settings, or a job of a command that is none
                run = (lambda: single(pool)) if callable(single) else (lambda: ANALYSES.get(kind).run(pool, single))
                w, c, _ = timed(run)
                peer_wall, peer_cpu = peer_wall + w, peer_cpu + c
        rows.append((name, len(singles), wall, cpu, peer_wall, peer_cpu))
        print(f"{name:24s} study {wall:7.1f} s wall {cpu:7.1f} s CPU | {len(singles):2d} singles {peer_wall:7.1f} s "
              f"wall {peer_cpu:7.1f} s CPU | ratio {wall / peer_wall:.2f} wall {cpu / peer_cpu:.2f} CPU", flush=True)
    print("\nstudy, singles, study wall s, study CPU s, singles wall s, singles CPU s, ratio (wall)")
    for name, n, wall, cpu, pw, pc in rows:
        print(f"{name}, {n}, {wall:.1f}, {cpu:.1f}, {pw:.1f}, {pc:.1f}, {wall / pw:.2f}")


if __name__ == "__main__":
    main()
