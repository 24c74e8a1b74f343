"""What a job needs in memory, known before it starts, and what it used, measured while it ran.

DESIGN.md: "a dtype on every job; peak memory estimated before a job starts and recorded after; the app refuses
a job that will not fit, naming the flags that make it fit". This module holds the pieces every job shares:

- `job_dtype(name, device)`: the precision a job runs in (`--dtype`; bfloat16 by default on CUDA, float32 else);
- `ModelSize`: the sizes an estimate needs (parameters, layers, hidden width, vocabulary, the largest layer),
  read from a checkpoint's header without loading its weights;
- `MemoryEstimate`: an estimate's parts in bytes, the device's free memory, whether it fits, and the flags that
  shrink it; `check()` raises `MemoryBudgetError` naming those flags;
- `register_estimator` / `estimate`: each job registers a function `(…the job's own keyword arguments…) ->
  MemoryEstimate` under its job name, so the CLI's `--dry-run` and the app's "needs ≈ X GiB" ask one place;
- `PeakMeter`: the measured peak of a block of code above what the process held when it started (CUDA's
  allocator peak on a GPU, the anonymous resident memory sampled every 2 ms on the CPU).
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import re
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil
import torch

from forgetlab.core.errors import ForgetlabError, ParameterError
from forgetlab.core.registry import Registry

DTYPES = ("float32", "bfloat16", "float16")
GIB = 1024 ** 3


class MemoryBudgetError(ForgetlabError):
    """A job's estimated peak exceeds the memory free on its device (the message names the flags that help)."""


def job_dtype(name: str | torch.dtype | None, device: Any = None) -> torch.dtype:
    """The dtype a job runs in: `name` ("float32", "bfloat16", "float16"), or for None the default of the
    device — bfloat16 on CUDA, float32 elsewhere (CPU matmuls in bf16 are slower and less exact)."""
    if isinstance(name, torch.dtype):
        if name not in (torch.float32, torch.bfloat16, torch.float16):
            raise ParameterError(f"dtype {name} is not one a job runs in; use one of {', '.join(DTYPES)}.")
        return name
    if name is None or str(name).strip() == "":
        return torch.bfloat16 if str(device or "").startswith("cuda") else torch.float32
    key = str(name).strip().lower()
    if key not in DTYPES:
        raise ParameterError(f"Unknown dtype {name!r}; use one of {', '.join(DTYPES)}.")
    return getattr(torch, key)


def dtype_name(dtype: torch.dtype) -> str:
    """"float32", "bfloat16" or "float16" for a torch dtype (str(dtype) without the "torch." prefix)."""
    return str(dtype).removeprefix("torch.")


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element of a floating dtype (4 for float32, 2 for bfloat16/float16)."""
    dt = job_dtype(dtype) if isinstance(dtype, str) else dtype
    return torch.empty((), dtype=dt).element_size()


def gib(n_bytes: float) -> str:
    """A byte count as "12.3 GiB" (three significant digits below 10 GiB, one decimal above; "45.6 MiB" below
    1 GiB)."""
    g = n_bytes / GIB
    if g < 1:
        return f"{n_bytes / 1024 ** 2:.3g} MiB"
    return f"{g:.3g} GiB" if g < 10 else f"{g:.1f} GiB"


_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.|(?:^|\.)h\.(\d+)\.|(?:^|\.)blocks?\.(\d+)\.")


def in_decoder_layer(name: str) -> bool:
    """Whether tensor `name` belongs to a numbered transformer layer (`layers.3.`, `h.3.`, `blocks.3.`)."""
    return _LAYER.search(name) is not None


@dataclass(frozen=True)
class ModelSize:
    """The sizes a memory estimate needs, read from a checkpoint's tensor headers and config.

    `parameters`: every parameter (a tied head once); `layer_parameters`: the largest transformer layer's;
    `embedding_parameters`: the input embedding's (and the head's when untied); `hidden`, `layers`, `vocab`,
    `intermediate`, `heads`: from the config (0 where the config does not say).
    """

    parameters: int
    layer_parameters: int
    embedding_parameters: int
    hidden: int = 0
    layers: int = 0
    vocab: int = 0
    intermediate: int = 0
    heads: int = 0

    def bytes(self, dtype: torch.dtype | str = torch.float32) -> int:
        """The weights' bytes in `dtype`."""
        return self.parameters * dtype_bytes(dtype)

    def layer_bytes(self, dtype: torch.dtype | str = torch.float32) -> int:
        """The largest layer's weights in `dtype`."""
        return self.layer_parameters * dtype_bytes(dtype)

    @classmethod
    def of(cls, ckpt) -> "ModelSize":
        """The sizes of a `forgetlab.core.checkpoints.Checkpoint` (headers only, no weights read)."""
        infos = ckpt.infos()
        per_layer: dict[int, int] = {}
        embedding = 0
        for name, info in infos.items():
            m = _LAYER.search(name)
            if m:
                idx = int(next(g for g in m.groups() if g is not None))
                per_layer[idx] = per_layer.get(idx, 0) + info.numel
            elif "embed" in name or name.endswith("wte.weight") or name == "lm_head.weight":
                embedding += info.numel
        try:
            cfg = ckpt.config
        except ForgetlabError:
            cfg = None

        def get(*keys: str) -> int:
            for k in keys:
                v = getattr(cfg, k, None) if cfg is not None else None
                if isinstance(v, int):
                    return v
            return 0

        params = ckpt.num_parameters
        if "lm_head.weight" in infos and getattr(cfg, "tie_word_embeddings", False):
            embedding -= infos["lm_head.weight"].numel
        return cls(parameters=params, layer_parameters=max(per_layer.values(), default=params),
                   embedding_parameters=embedding, hidden=get("hidden_size", "n_embd", "d_model"),
                   layers=get("num_hidden_layers", "n_layer") or len(per_layer), vocab=get("vocab_size"),
                   intermediate=get("intermediate_size", "n_inner", "ffn_dim"),
                   heads=get("num_attention_heads", "n_head"))


def free_bytes(device: Any = "cpu") -> int | None:
    """Memory free for a job on `device`: CUDA's free memory (`torch.cuda.mem_get_info`), the CPU's available
    memory (psutil); None where it cannot be known (other devices)."""
    dev = torch.device(str(device) if device is not None else "cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _total = torch.cuda.mem_get_info(dev.index if dev.index is not None else torch.cuda.current_device())
        return int(free)
    if dev.type == "cpu":
        return int(psutil.virtual_memory().available)
    return None


# the per-process limits a shell (`ulimit`), `prlimit` or a cluster's job (Slurm, PBS) sets: name → (what it limits,
# the shell command that lifts it)
PROCESS_LIMITS = {"RLIMIT_AS": ("address space (prlimit --as)", "ulimit -v unlimited"),
                  "RLIMIT_DATA": ("data and private mappings (prlimit --data)", "ulimit -d unlimited")}


def process_limits() -> dict[str, int]:
    """The memory limits set on this process (`PROCESS_LIMITS`: RLIMIT_AS, RLIMIT_DATA), in bytes, by name; the
    unlimited ones left out."""
    out = {}
    for name in PROCESS_LIMITS:
        soft, _hard = resource.getrlimit(getattr(resource, name))
        if soft != resource.RLIM_INFINITY and soft >= 0:
            out[name] = int(soft)
    return out


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is a failure to get memory — a MemoryError, ENOMEM, a memory map refused — rather than bad data
    (torch and safetensors report a refused mmap as a RuntimeError or their own error carrying "Cannot allocate
    memory (12)")."""
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        return True
    text = str(exc)
    return any(s in text for s in ("Cannot allocate memory", "ENOMEM", "os error 12", "unable to mmap"))


def out_of_memory_text(what: str, need: int | None = None) -> str:
    """The message for `what` (e.g. "Opening model.safetensors") failing for want of memory (`need` bytes, if known):
    the limits set on this process and the commands that lift them, or, with none set, the memory free."""
    limits = process_limits()
    size = f" ({gib(need)})" if need else ""
    if limits:
        named = "; ".join(f"{n} = {gib(v)}, {PROCESS_LIMITS[n][0]}" for n, v in limits.items())
        lift = " / ".join(f"`{PROCESS_LIMITS[n][1]}`" for n in limits)
        return (f"{what}{size} failed for want of memory under this process's limit ({named}); the file is not "
                f"damaged. Raise the limit ({lift} in the shell, or ask the cluster's scheduler for more memory, e.g. "
                "a larger --mem), or work on a smaller model.")
    free = free_bytes("cpu")
    return (f"{what}{size} failed for want of memory ({gib(free) if free is not None else 'unknown'} free; no "
            "per-process limit is set); the file is not damaged. Free memory (other jobs), or work on a smaller "
            "model.")


DTYPE_FIX = "--dtype bfloat16 (sidebar: Dtype)"


def dtype_fixes(dtype: torch.dtype | str) -> list[str]:
    """[DTYPE_FIX] for a 4-byte job dtype (halving the weights is then the first fix to name), else []."""
    return [DTYPE_FIX] if dtype_bytes(dtype) == 4 else []


def host_shortfall(need: int, what: str = "") -> dict[str, int]:
    """The part a GPU job's estimate adds when the CPU cannot hold the `need` bytes the job keeps on the host
    ("host memory short`what` (needs X, Y free)": need), so that the estimate does not fit; {} when it can or the
    free memory is unknown."""
    free = free_bytes("cpu")
    if free is None or need <= free:
        return {}
    return {f"host memory short{what} (needs {gib(need)}, {gib(free)} free)": need}


@dataclass
class MemoryEstimate:
    """A job's estimated peak on its device: `parts` maps what holds memory ("weights", "gradients",
    "optimizer state", "activations", …) to bytes; `free` is the device's free memory when estimated (None:
    unknown); `fixes` are the flags that shrink the job, in the order to try them ("--dtype bfloat16", "--lora 16",
    "--gradient-checkpointing", "--batch-size 4", …). `enforced` False: a job that a device map spreads over
    devices and disk by design, whose estimate is shown but never stops it (`check` passes)."""

    job: str
    device: str
    dtype: str
    parts: dict[str, int] = field(default_factory=dict)
    free: int | None = None
    fixes: list[str] = field(default_factory=list)
    enforced: bool = True

    @property
    def total(self) -> int:
        """The estimated peak in bytes: the sum of the parts."""
        return int(sum(self.parts.values()))

    @property
    def fits(self) -> bool:
        """Whether the peak fits the free memory (True when the free memory is unknown)."""
        return self.free is None or self.total <= self.free

    def describe(self) -> str:
        """"needs ≈ 3.1 GiB, 12.4 GiB free on cpu" (the line the CLI's --dry-run and the app show)."""
        free = f", {gib(self.free)} free on {self.device}" if self.free is not None else f" on {self.device}"
        return f"{self.job} in {self.dtype} needs ≈ {gib(self.total)}{free}"

    def breakdown(self) -> str:
        """The parts, largest first: "weights 1.2 GiB · optimizer state 2.4 GiB · …"."""
        parts = sorted(self.parts.items(), key=lambda kv: -kv[1])
        return " · ".join(f"{k} {gib(v)}" for k, v in parts)

    def check(self) -> "MemoryEstimate":
        """This estimate if it fits (or is not `enforced`); else `MemoryBudgetError` with the figures and the flags
        that shrink the job."""
        if self.fits or not self.enforced:
            return self
        hint = (" To make it fit, try " + ", then ".join(self.fixes) + ".") if self.fixes else \
            " Use a smaller model or a device with more memory."
        raise MemoryBudgetError(f"This job will not fit: {self.describe()} ({self.breakdown()}).{hint}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (with `total` and `fits`)."""
        return {"job": self.job, "device": self.device, "dtype": self.dtype, "parts": dict(self.parts),
                "free": self.free, "fixes": list(self.fixes), "total": self.total, "fits": self.fits}


ESTIMATORS: Registry[Callable[..., MemoryEstimate]] = Registry(
    "memory estimate", ("forgetlab.core", "forgetlab.merge", "forgetlab.train", "forgetlab.analysis"))
"""Every job's estimator by job name ("linearity", "finetune", "eval", "merge", …), declared with
`register_estimator` beside the job. Like the CLI's commands, they are found by looking through the job packages'
modules on the first lookup of a name not declared yet, so `estimate("eval", …)` needs no import "to register" it.
Pages and commands that hold the job's own estimator call it directly (`with_free(estimate_eval(…))`)."""


def register_estimator(job: str) -> Callable[[Callable[..., MemoryEstimate]], Callable[..., MemoryEstimate]]:
    """Decorator: register `fn(**job_kwargs) -> MemoryEstimate` as the estimator of `job` ("linearity",
    "finetune", …). It takes the same keyword arguments as the job's own function and reads no weights."""
    def wrap(fn: Callable[..., MemoryEstimate]) -> Callable[..., MemoryEstimate]:
        ESTIMATORS.add(job, fn)
        return fn
    return wrap


def estimators() -> list[str]:
    """The jobs that have an estimator."""
    return ESTIMATORS.names()


def with_free(est: MemoryEstimate) -> MemoryEstimate:
    """`est` with the free memory of its device filled in where its estimator left it empty."""
    if est.free is None:
        est.free = free_bytes(est.device)
    return est


def estimate(job: str, **kwargs: Any) -> MemoryEstimate:
    """The estimate of `job` for these arguments (the job's keyword arguments), its `free` filled in for its
    device when the estimator left it empty."""
    if ESTIMATORS.find(job) is None:
        raise ParameterError(f"No memory estimate is known for job {job!r}; jobs with one: "
                             f"{', '.join(estimators()) or 'none'}.")
    return with_free(ESTIMATORS.get(job)(**kwargs))


def _rss() -> int:
    """The memory this process holds: its anonymous resident memory on Linux (RssAnon: heap, tensors),
    else the whole resident set (psutil). File pages that safetensors maps are page cache the kernel can drop
    at any time — they are not what a job needs, and a GPU never sees them — so they are left out."""
    try:
        m = re.search(r"RssAnon:\s+(\d+)\s+kB", _STATUS.read_text())
        if m:
            return int(m.group(1)) * 1024
    except OSError:
        pass

    return int(psutil.Process().memory_info().rss)


_STATUS = Path("/proc/self/status")


def _release_free_heap() -> None:
    """Give the heap's freed pages back to the system (glibc's malloc_trim; nothing elsewhere), so that a block's
    new allocations raise the resident memory instead of silently reusing pages freed before it began."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# glibc's mallopt parameter number and its largest default (the threshold grows up to it as big blocks are freed)
_M_MMAP_THRESHOLD = -3
_GLIBC_MMAP_THRESHOLD_MAX = 32 << 20


@contextlib.contextmanager
def large_frees_to_os(device: Any = "cpu", threshold: int = 4 << 20):
    """For the block, when `device` is the CPU (nothing otherwise): every allocation of ≥ `threshold` bytes gets its own mapping, so freeing a tensor that size
    gives its pages back to the system at once (glibc's mallopt M_MMAP_THRESHOLD; nothing elsewhere).

    glibc raises that threshold each time a mapped block is freed (up to 32 MiB), after which a job's many
    few-MiB tensors (a layer's gradients, activations, evaluation logits) come from the heap and their freed
    pages stay resident and fragment: a training loop's resident memory then creeps up from step to step. After
    the block the threshold is set to glibc's largest default (the dynamic adjustment stays off)."""
    libc = None
    if str(device).split(":")[0] != "cpu":
        yield
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, int(threshold))
    except (OSError, AttributeError):
        libc = None
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, _GLIBC_MMAP_THRESHOLD_MAX)
            libc.malloc_trim(0)


class PeakMeter:
    """Context manager measuring a block's peak memory above what the process held when it began.

    On CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (allocator bytes, the figure
    that decides an out-of-memory). On the CPU: the process's anonymous resident memory (`_rss`: tensors and
    heap, not the page cache of mapped files) sampled every `interval` seconds on a thread, plus a reading at
    the end, minus the reading at entry. Meters may nest and run in several threads (each samples the whole
    process). After the block, `.peak` holds the bytes and `.seconds` the duration.
    """

    def __init__(self, device: Any = "cpu", interval: float = 0.002):
        self.device = torch.device(str(device) if device is not None else "cpu")
        self.interval = float(interval)
        self.peak = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_rss = 0
        self._max_rss = 0

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._max_rss = max(self._max_rss, _rss())

    def __enter__(self) -> "PeakMeter":
        self._t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start_cuda = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        _release_free_heap()
        self._start_rss = self._max_rss = _rss()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="forgetlab-peak-meter")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = int(torch.cuda.max_memory_allocated(self.device) - self._start_cuda)
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self.peak = self.peak_so_far()
        self.seconds = time.perf_counter() - self._t0

    def peak_so_far(self) -> int:
        """The peak from entry until now (what a run saved inside the block records)."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device) - self._start_cuda)
        self._max_rss = max(self._max_rss, _rss())
        return max(0, self._max_rss - self._start_rss)

    def to_dict(self) -> dict[str, Any]:
        """{"device", "peak_bytes", "seconds"}: what a saved run records as its measured peak."""
        return {"device": str(self.device), "peak_bytes": int(self.peak), "seconds": round(self.seconds, 3)}


_RECORDING: contextvars.ContextVar[PeakMeter | None] = contextvars.ContextVar("forgetlab_peak", default=None)


@contextlib.contextmanager
def recording(device: Any = None):
    """Measure the enclosed job's peak (`PeakMeter` on `device`, default: the machine's default device) so
    that a run saved inside the block records it (`recorded_peak`, read by `core.workspace.save_run`). The CLI
    wraps every command in it and the app every job."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    meter = PeakMeter(device)
    token = _RECORDING.set(meter)
    try:
        with meter:
            yield meter
    finally:
        _RECORDING.reset(token)


def recorded_peak() -> dict[str, Any] | None:
    """The peak measured so far by the innermost `recording` block ({"device", "peak_bytes", "seconds"}), or
    None outside one."""
    meter = _RECORDING.get()
    if meter is None:
        return None
    return {"device": str(meter.device), "peak_bytes": int(meter.peak_so_far()),
            "seconds": round(time.perf_counter() - meter._t0, 3)}
