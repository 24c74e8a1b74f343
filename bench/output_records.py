"""What recording the sizes and hashes of an output's files (forgetlab.core.filerecords) costs, against the same
writes without the record, measured in the same run on a folder of about 100 MB:

- a merge (task arithmetic of two fine-tunes of a ~100 MB model, shards hashed while they are written);
- `write_hf_folder` alone (the streamed shard writer);
- `save_model` (transformers writes the file, which is hashed after);
- the check before an overwrite: a folder as written (stat calls only) and a copy of it (every file hashed).

    .venv/bin/python bench/output_records.py [--mb 100] [--reps 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch


class _PlainWriter:
    """HashingWriter without the hash: the peer."""

    def __init__(self, fh):
        self.fh = fh

    def write(self, data):
        self.fh.write(data)

    def close(self):
        self.fh.close()

    def hexdigest(self):
        return "-"


@contextlib.contextmanager
def recording(on: bool):
    import forgetlab.core.checkpoints.writing as writing
    import forgetlab.core.filerecords as fr

    saved = writing.HashingWriter, fr.file_records
    if not on:
        writing.HashingWriter = _PlainWriter
        fr.file_records = lambda folder, files: {}
    fr._known.clear()
    try:
        yield
    finally:
        writing.HashingWriter, fr.file_records = saved


def timed(fn, reps: int) -> tuple[float, float]:
    """Median seconds of `fn(on)` without and with the record, alternating."""
    out = {False: [], True: []}
    for _ in range(reps):
        for on in (False, True):
            with recording(on):
                t = time.perf_counter()
                fn(on)
                out[on].append(time.perf_counter() - t)
    return statistics.median(out[False]), statistics.median(out[True])


def line(what: str, off: float, on: float) -> None:
    print(f"{what:58s} {off:7.3f} s without  {on:7.3f} s with  ratio {on / off:5.2f}  (+{on - off:.3f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100, help="model size in MiB (default 100)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from forgetlab.core import outputs
    from forgetlab.core.checkpoints.writing import save_model, write_hf_folder
    from forgetlab.merge import run
    from forgetlab.merge.recipes import Recipe

    print(f"torch threads {torch.get_num_threads()}, {args.reps} repetitions, medians")
    root = Path(tempfile.mkdtemp(prefix="forgetlab-bench-"))
    try:
        from transformers import LlamaConfig, LlamaForCausalLM

        layers = max(1, round(args.mb / 135 * 8))       # 8 layers of width 512 and a vocabulary of 8000: 135 MiB
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=layers,
                                             num_attention_heads=8, num_key_value_heads=8, vocab_size=8000,
                                             tie_word_embeddings=False))
        base = {k: v.detach().clone() for k, v in model.state_dict().items()}
        total = sum(t.numel() * t.element_size() for t in base.values())
        with recording(False):
            write_hf_folder(root / "base", base, model.config)
            for k in range(2):
                write_hf_folder(root / f"ft{k}", {name: t + 0.01 * torch.randn_like(t) for name, t in base.items()},
                                model.config)
        recipe = Recipe.from_dict({"method": "task_arithmetic", "base": str(root / "base"),
                                   "models": [str(root / "ft0"), str(root / "ft1")], "params": {"lam": 0.5}})
        count = iter(range(10**6))

        def merge(on):
            out = root / f"m{next(count)}"
            run(recipe, out)
            shutil.rmtree(out)

        line(f"merge of {total / 2**20:.0f} MiB (task arithmetic, 2 models)", *timed(merge, args.reps))

        def write(on):
            out = root / f"w{next(count)}"
            write_hf_folder(out, base, model.config)
            shutil.rmtree(out)

        line(f"write_hf_folder of {total / 2**20:.0f} MiB (hashed while writing)", *timed(write, args.reps))
        size = sum(p.numel() for p in model.parameters()) * 4

        def save(on):
            out = root / f"s{next(count)}"
            save_model(model, None, out)
            shutil.rmtree(out)

        line(f"save_model of {size / 2**20:.0f} MiB (hashed after writing)", *timed(save, args.reps))
        out = root / "check"
        write_hf_folder(out, base, model.config)
        t = time.perf_counter()
        assert outputs.changed_files(out) == []
        as_written = time.perf_counter() - t
        copy = root / "copy"
        shutil.copytree(out, copy, copy_function=shutil.copy2)
        from forgetlab.core import filerecords

        filerecords._known.clear()
        t = time.perf_counter()
        assert outputs.changed_files(copy) == []
        copied = time.perf_counter() - t
        print(f"check before an overwrite: {as_written * 1e3:.1f} ms as written (stat only), {copied * 1e3:.0f} ms "
              f"for a copy made with cp -a (every file hashed)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
