"""CLI arguments that several commands share, each declared once here: one function per argument or group.

The checks live in `forgetlab.cli._check_arguments` and go by `dest` and type: counts (`--max-general`,
`--batch-size`, `--samples`, `--limit`, `--workers`) must be ≥ 1, every other whole number must fit in 64 bits
(`whole_number`), every decimal number must be finite (`finite_number`: `nan` and `inf` are refused), `--device`
must be usable on this machine, and a parser with an output file (a dest in `OUTPUT_FILES`) gets `--overwrite`
(`add_overwrite`) when it has none. `--seed` (`add_seed`) is a whole number in the range of the generator it
seeds. An argument whose meaning differs from command to command (`--model`, `--task`, …) stays in its command;
so does the help of `--out`, which names what each command writes.
"""
from __future__ import annotations

import argparse
import math

from forgetlab.analysis.measures import LIMIT_HELP, LM_EVAL_INCLUDE_HELP, general_measure_help, measure_help
from forgetlab.core.devicemap import DEVICE_MAP_HELP, MAX_MEMORY_HELP, PLACEMENTS
from forgetlab.core.settings import TORCH_SEED_MAX, bound_text

POOL_HELP = "pool.yaml"
DEVICE_HELP = "cpu or cuda (default: cuda when available)"
# Commands that load their models through ModelPool.load, which puts a model without a device on the CPU.
DEVICE_CPU_HELP = "cpu or cuda (default: cpu)"
OVERWRITE_HELP = "replace output files that exist already"
EVAL_BATCH_HELP = "evaluation batch size"

# Dests of the options that name an output file: checked before the command runs (cli._check_output_files).
OUTPUT_FILES = ("out", "curves", "distances", "save_recipe")
# Dests of the options that name an output folder (`--out DIR` of an analysis whose output is several files).
OUTPUT_FOLDERS = ("out_folder",)

INT64_MAX = 2**63 - 1          # the largest whole number torch and numpy take as an index, size or count
NUMPY_SEED_MAX = 2**32 - 1     # numpy's legacy seeding, used by scikit-learn, openTSNE and cma
FLOAT32_MAX = 3.4028234663852886e38   # torch.finfo(torch.float32).max: settings become float32 tensor scalars


def whole_number(minimum: int | None = None, maximum: int = INT64_MAX, name: str = "integer"):
    """An argparse type: a whole number in [`minimum`, `maximum`] (default: what fits in 64 bits, the range torch
    and numpy accept), so that argparse exits 2 with a message naming the argument instead of a traceback from
    deep inside a library. `name` is the type's name in argparse's messages ("count", "seed", …)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}; got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {bound_text(maximum)} ({maximum:,}); got {value}")
        if minimum is None and value < -maximum - 1:
            raise argparse.ArgumentTypeError(f"must be at least {-maximum - 1:,}; got {value}")
        return value
    parse.__name__ = name
    return parse


def finite_number(text: str) -> float:
    """An argparse type: a finite decimal number within float32's range (`nan`, `inf` and `1e300` are refused: no
    setting forgetlab takes means anything there, and torch would fail or compute garbage with them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number; got {text!r}")
    if abs(value) > FLOAT32_MAX:
        raise argparse.ArgumentTypeError(f"must lie within ±{FLOAT32_MAX:.4g} (the float32 range torch computes "
                                         f"in); got {text!r}")
    return value


finite_number.__name__ = "finite"


def add_seed(p, *, help: str, maximum: int = TORCH_SEED_MAX, default: int = 0) -> None:
    """`--seed N` (dest `seed`): a whole number from 0 to `maximum`, the range of the generator it seeds
    (TORCH_SEED_MAX for torch's, NUMPY_SEED_MAX for numpy's legacy seeding; less where the command derives
    further seeds from it). `help` says what it seeds."""
    p.add_argument("--seed", type=whole_number(0, maximum, "seed"), default=default,
                   help=f"{help} (a whole number from 0 to {bound_text(maximum)}; default {default})")


def lora_rank(text: str) -> int:
    """A CLI reader (its name in argparse's messages: "rank"): a LoRA rank, a whole number ≥ 1 (`--lora R`; left
    out: a full fine-tune)."""
    value = whole_number(None)(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"LoRA rank must be ≥ 1; got {value}. Leave --lora out for a full "
                                         "fine-tune")
    return value


lora_rank.__name__ = "rank"


def module_names(text: str) -> list[str]:
    """A CLI reader (its name: "names"): module names written comma-separated in one argument (`--lora-targets
    q_proj,v_proj`), read into a non-empty list without empty names."""
    names = [t.strip() for t in text.split(",")]
    if not any(names):
        raise argparse.ArgumentTypeError(f"names no module (got {text!r}); give names such as q_proj,v_proj, or "
                                         "leave --lora-targets out for every linear layer of the blocks")
    if not all(names):
        raise argparse.ArgumentTypeError(f"has an empty name in {text!r}; separate module names with single "
                                         "commas, e.g. q_proj,v_proj")
    return names


module_names.__name__ = "names"

READERS = {"rank": lora_rank, "names": module_names}
"""CLI readers a settings field may name as its `cli_type` (forgetlab.core.settings.Setting), by name."""


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
    (read by `forgetlab.commands.executor_args.device_from_args`)."""
    p.add_argument("--device-map", default=None, choices=list(PLACEMENTS), help=DEVICE_MAP_HELP)
    p.add_argument("--max-memory", default=None, metavar="DEV=SIZE,…", help=MAX_MEMORY_HELP)


def add_out(p, help: str, *, flag: str = "--out", metavar: str | None = None) -> None:
    """An output file option, `--out` unless `flag` names another (`--curves`, `--distances`); `help` says what
    the command writes there. Its dest must be one of OUTPUT_FILES, so that the file is checked before any
    work and the parser gets `--overwrite`."""
    dest = flag.lstrip("-").replace("-", "_")
    if dest not in OUTPUT_FILES:
        raise ValueError(f"{flag} is not among the output files that forgetlab.cli checks: {OUTPUT_FILES}")
    p.add_argument(flag, help=help, **({"metavar": metavar} if metavar else {}))


def add_out_folder(p, help: str, *, flag: str = "--out", metavar: str = "DIR") -> None:
    """An output folder option (`--out DIR`, dest `out_folder`): checked before any work like an output file
    (cli._check_output_files), and the parser gets `--overwrite` to replace the files it holds."""
    dest = flag.lstrip("-").replace("-", "_") + "_folder"
    if dest not in OUTPUT_FOLDERS:
        raise ValueError(f"{flag} is not among the output folders that forgetlab.cli checks: {OUTPUT_FOLDERS}")
    p.add_argument(flag, dest=dest, help=help, metavar=metavar)


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
    """`--measure M`: the speciality measure (read by `forgetlab.analysis.measures.check_measure`); `when` says
    when a benchmark measure runs ("at every point", "at every record", "on every candidate")."""
    p.add_argument("--measure", default="exact_match", help=measure_help(when))


def add_general_measure(p, *, when: str = "at every point") -> None:
    """`--general-measure M`: the generality measure (read by `forgetlab.analysis.measures.check_general_measure`);
    `when` as for `add_measure`."""
    p.add_argument("--general-measure", default="general_loss", help=general_measure_help(when))


def add_lm_eval(p) -> None:
    """`--lm-eval-include DIR` and `--limit N`: where a benchmark measure's lm-eval tasks are, and how many
    examples each runs (read by `forgetlab.analysis.measures.measure_benchmarks` and
    `forgetlab.commands.models.benchmark_spec`)."""
    p.add_argument("--lm-eval-include", metavar="DIR", help=LM_EVAL_INCLUDE_HELP)
    p.add_argument("--limit", type=int, default=None, help=LIMIT_HELP)


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
    points run" (see `forgetlab.executors`; read by `forgetlab.commands.executor_args.executor_from_args`)."""
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
