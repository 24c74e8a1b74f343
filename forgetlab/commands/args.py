"""CLI arguments that several commands share, each declared once here: one function per argument or group.

The checks live in `forgetlab.cli._check_arguments` and go by `dest`: counts (`--max-general`, `--batch-size`,
`--samples`, `--limit`, `--workers`) must be ≥ 1, `--device` must be usable on this machine, and a parser
with an output file (a dest in `OUTPUT_FILES`) gets `--overwrite` (`add_overwrite`) when it has none.
An argument whose meaning differs from command to command (`--model`, `--task`, `--seed`, …) stays in its
command; so does the help of `--out`, which names what each command writes.
"""
from __future__ import annotations

POOL_HELP = "pool.yaml"
DEVICE_HELP = "cpu or cuda (default: cuda when available)"
# Commands that load their models through ModelPool.load, which puts a model without a device on the CPU.
DEVICE_CPU_HELP = "cpu or cuda (default: cpu)"
OVERWRITE_HELP = "replace output files that exist already"
EVAL_BATCH_HELP = "evaluation batch size"

# Dests of the options that name an output file: checked before the command runs (cli._check_output_files).
OUTPUT_FILES = ("out", "curves", "distances", "save_recipe")


def add_pool(p, *, flag: bool = False, required: bool = True, help: str = POOL_HELP) -> None:
    """The pool file (dest `pool`): the positional POOL, or with `flag` the option `--pool` (`required` or not;
    `help` then says what the command uses the pool for)."""
    if not flag:
        if not required:
            raise ValueError("a positional pool is always required; use flag=True for an optional --pool")
        p.add_argument("pool", help=help)
    else:
        p.add_argument("--pool", required=required, help=help)


def add_device(p, *, default: str | None = None, help: str = DEVICE_HELP) -> None:
    """`--device D` (dest `device`; checked against this machine's devices by cli._check_arguments).
    Default None: the command's own default device, which `help` states."""
    p.add_argument("--device", default=default, help=help)


def add_device_map(p) -> None:
    """`--device-map auto|balanced|sequential [--max-memory 0=20GiB,cpu=64GiB]` for models larger than a device
    (read by `forgetlab.commands._executor.device_from_args`)."""
    p.add_argument("--device-map", default=None, choices=["auto", "balanced", "sequential"],
                   help="spread a model that does not fit one device over the GPUs, then CPU, then disk "
                        "(accelerate); overrides --device")
    p.add_argument("--max-memory", default=None, metavar="DEV=SIZE,…",
                   help="memory per device for --device-map, e.g. 0=70GiB,1=70GiB,cpu=200GiB")


def add_out(p, help: str, *, flag: str = "--out", metavar: str | None = None) -> None:
    """An output file option, `--out` unless `flag` names another (`--curves`, `--distances`); `help` says what
    the command writes there. Its dest must be one of OUTPUT_FILES, so that the file is checked before any
    work and the parser gets `--overwrite`."""
    dest = flag.lstrip("-").replace("-", "_")
    if dest not in OUTPUT_FILES:
        raise ValueError(f"{flag} is not among the output files that forgetlab.cli checks: {OUTPUT_FILES}")
    p.add_argument(flag, help=help, **({"metavar": metavar} if metavar else {}))


def add_overwrite(p, help: str = OVERWRITE_HELP) -> None:
    """`--overwrite` (dest `overwrite`): replace outputs that exist. cli._check_arguments adds it, with this help,
    to every parser that has an output file; a command calls it only to say what else it replaces (`help`)."""
    p.add_argument("--overwrite", action="store_true", help=help)


def add_no_save(p) -> None:
    """`--no-save`: do not save the run under the workspace's runs/."""
    p.add_argument("--no-save", action="store_true", help="do not save the run under the workspace's runs/")


def add_max_general(p, *, prefix: str = "") -> None:
    """`--max-general N`: how many general-text blocks an evaluation reads (default: all)."""
    p.add_argument("--max-general", type=int, default=None, help=f"{prefix}at most this many general-text blocks")


def add_eval_limits(p, *, pairs: str = "eval", prefix: str = "") -> None:
    """`--max-general N` and `--max-task N`: how many general-text blocks and task pairs (of the `pairs` split)
    an evaluation reads (default: all). `prefix` tells when they apply (e.g. "--eval: ")."""
    add_max_general(p, prefix=prefix)
    p.add_argument("--max-task", type=int, default=None, help=f"{prefix}at most this many {pairs} pairs per task")


def add_batch_size(p, *, default: int = 16, help: str = EVAL_BATCH_HELP) -> None:
    """`--batch-size N` (a count ≥ 1): by default the evaluation batch size, 16; `default` and `help` for a
    command whose batches are something else (training, forward passes)."""
    p.add_argument("--batch-size", type=int, default=default, help=help)


def add_samples(p, *, default: int | None = 30) -> None:
    """`--samples N` (a count ≥ 1): probe samples per task; `default` None means all of them."""
    shown = "default: all" if default is None else f"default {default}"
    p.add_argument("--samples", type=int, default=default, help=f"probe samples per task ({shown})")


def add_measure(p, *, when: str = "at every point") -> None:
    """`--measure M`: the speciality measure (read by `forgetlab.analysis.sweeps.check_measure`); `when` says
    when a benchmark measure runs ("at every point", "at every record", "on every candidate")."""
    p.add_argument("--measure", default="exact_match",
                   help="speciality measure: exact_match (higher is better, default), answer_loss (lower is "
                        "better), or an lm-eval metric TASK/METRIC (e.g. zoo_math/acc), run " + when)


def add_general_measure(p, *, when: str = "at every point") -> None:
    """`--general-measure M`: the generality measure (read by `forgetlab.analysis.sweeps.check_general_measure`);
    `when` as for `add_measure`."""
    p.add_argument("--general-measure", default="general_loss",
                   help="generality measure: general_loss (held-out loss, default) or an lm-eval metric "
                        "TASK/METRIC (e.g. zoo_wiki_cloze/acc), run " + when)


def add_lm_eval(p) -> None:
    """`--lm-eval-include DIR` and `--limit N`: where a benchmark measure's lm-eval tasks are, and how many
    examples each runs (read by `forgetlab.commands.sweep.measure_benchmarks` and
    `forgetlab.commands.models.benchmark_spec`)."""
    p.add_argument("--lm-eval-include", metavar="DIR", help="folder of local lm-eval task YAMLs "
                   "(default: the pool's probes.benchmarks.include)")
    p.add_argument("--limit", type=int, default=None, help="at most this many examples per lm-eval task")


def add_benchmarks(p, what: str = "each model") -> None:
    """`--lm-eval TASK[,TASK…]`, `--lm-eval-include DIR`, `--limit N` and `--no-lm-eval`: the lm-eval benchmarks
    run on `what` (read by `forgetlab.commands.models.benchmark_spec`)."""
    p.add_argument("--lm-eval", metavar="TASK[,TASK…]", help=f"also run these lm-evaluation-harness tasks on {what} "
                   "(standard names such as arc_easy need their dataset online or cached; local tasks "
                   "work offline); default: the pool's probes.benchmarks, if any")
    add_lm_eval(p)
    p.add_argument("--no-lm-eval", action="store_true", help="skip the pool's lm-eval benchmarks")


def add_executor(p) -> None:
    """`--executor local|ray [--ray-address ADDR] [--workers N] [--gpus-per-worker G]`, in a group "where the
    points run" (see `forgetlab.executors`; read by `forgetlab.commands._executor.executor_from_args`)."""
    g = p.add_argument_group("where the points run")
    g.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: one after another in this process (default); ray: on Ray actors, each keeping "
                        "the base and task vectors resident")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="an existing Ray cluster (auto, host:port or ray://host:port); default: start a local "
                        "Ray instance on this machine")
    g.add_argument("--workers", type=int, default=None,
                   help="Ray workers (default: as many as the cluster has room for)")
    g.add_argument("--gpus-per-worker", type=float, default=None, metavar="G",
                   help="GPUs per Ray worker (default 1 when the cluster has GPUs, else 0)")


def add_dtype(p, *, what: str = "the models") -> None:
    """`--dtype float32|bfloat16|float16` (dest `dtype`, default None = bfloat16 on CUDA, float32 on the CPU;
    resolved by `forgetlab.core.memory.job_dtype`). `what` says what runs in that precision."""
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help=f"precision of {what} (default: bfloat16 on cuda, float32 on cpu); scores are reduced "
                        "in float32 either way")


def add_dry_run(p) -> None:
    """`--dry-run`: print the job's memory estimate and the device's free memory, then stop (read through
    `forgetlab.commands.io.emit_estimate`)."""
    p.add_argument("--dry-run", action="store_true",
                   help="print the estimated peak memory and the device's free memory, run nothing")
