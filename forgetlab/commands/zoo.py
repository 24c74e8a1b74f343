"""CLI: `forgetlab zoo build` and `forgetlab zoo show` — the embedded demo zoo."""
from __future__ import annotations

import sys

from tqdm import tqdm

from forgetlab.commands import args as shared
from forgetlab.commands.io import emit, emit_frame, tqdm_progress
from forgetlab.core.errors import WorkspaceError
from forgetlab.zoo import build, zoo_root
from forgetlab.zoo.build import POOL_YAML, ZooBuild
from forgetlab.zoo.manifest import read_manifest
from forgetlab.zoo.presets import PRESETS, SIZES


def register(sub) -> None:
    p = sub.add_parser("zoo", help="build or show the demo zoo (real base + fine-tuned models, offline)",
                       description="The demo zoo: a base model and one fine-tune per task (math, code, "
                                   "translate), built offline from data that installed packages ship.")
    zsub = p.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND")

    b = zsub.add_parser("build", help="build (or resume, or confirm) a zoo preset",
                        description="Build the zoo preset into <FORGETLAB_HOME>/zoo/<preset>[-<size>]. A complete "
                                    "zoo is left alone; an interrupted build resumes; a zoo from another "
                                    "forgetlab version or other settings is rebuilt.")
    _common(b)
    b.add_argument("--force", action="store_true", help="rebuild from scratch even if the zoo is complete")
    b.set_defaults(func=cmd_build)

    s = zsub.add_parser("show", help="scorecards, sizes and build times recorded in a zoo's manifest",
                        description="Show a built zoo: its folder, pool file, build time and the scorecard of "
                                    "every model (held-out Wikipedia loss, exact match and answer loss per task).")
    _common(s)
    shared.add_out(s, "CSV or JSON file for the scorecards")
    s.set_defaults(func=cmd_show)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _common(p) -> None:
    p.add_argument("--preset", choices=list(PRESETS), default="pico", help="pico (minutes) or smol (SmolLM2-135M)")
    p.add_argument("--size", choices=list(SIZES), default="default", help="tiny builds in seconds (tests)")
    p.add_argument("--home", default=None, help="workspace folder (default: $FORGETLAB_HOME or ~/.forgetlab)")


def cmd_build(args) -> int:
    update, close = tqdm_progress(f"zoo {args.preset}/{args.size}")

    def said(snapshot) -> None:     # what the base answers while it pre-trains, above the progress bar
        tqdm.write(snapshot.line(), file=sys.stderr)

    try:
        result = build(preset=args.preset, size=args.size, home=args.home, force=args.force, progress=update,
                       on_snapshot=said)
    finally:
        close()
    if not result.built:
        emit(f"zoo {result.root.name} is complete already; nothing to do ({result.pool_yaml}). "
             "Use --force to rebuild it.")
        return 0
    emit(f"built zoo {result.root.name} in {result.manifest.get('last_run_seconds', result.seconds):.1f} s "
         f"(total build time {result.seconds:.1f} s): {result.pool_yaml}")
    emit_frame(result.to_frame())
    _emit_claims(result)
    return 0


def cmd_show(args) -> int:
    root = zoo_root(args.preset, args.size, args.home)
    manifest = read_manifest(root)
    if manifest is None:
        raise WorkspaceError(f"No zoo at {root}. Build it with `forgetlab zoo build --preset {args.preset} "
                             f"--size {args.size}`.")
    state = "complete" if manifest.get("complete") else "incomplete (run `forgetlab zoo build` to resume)"
    emit(f"zoo {root.name}: {state}; forgetlab {manifest.get('forgetlab_version')}, "
         f"build time {float(manifest.get('build_seconds', 0)):.1f} s")
    emit(f"pool file: {root / POOL_YAML}")
    for name, rec in (manifest.get("steps") or {}).items():
        emit(f"  {name:<14} {float(rec.get('seconds', 0)):8.1f} s")
    zoo = ZooBuild(root / POOL_YAML, root, manifest, built=False)
    emit_frame(zoo.to_frame(), out=args.out)
    _emit_claims(zoo)
    return 0


def _emit_claims(zoo) -> None:
    """Print "what this zoo shows" (the claims measured at the end of the build), if the manifest has them."""
    claims = zoo.claims()
    if claims is None:
        return
    frame = claims.to_frame()
    emit("")
    emit(f"What this zoo shows ({int((frame['holds'] == '✓').sum())} of {len(frame)} claims hold; "
         f"{claims.settings.get('measure')} on each model's own task, {claims.settings.get('max_task')} eval "
         f"pairs, {claims.settings.get('max_general')} held-out blocks; measured in {claims.seconds:.1f} s):")
    for _, row in frame.iterrows():          # the words the Models page shows (display names, reasons, papers)
        emit(f"  {row['holds']} {row['key']}: {row['claim']}")
        emit(f"      {row['measured']}")
        if row["why not"]:
            emit(f"      why not: {row['why not']}")
