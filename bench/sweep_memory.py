"""Peak memory of α sweeps: forgetlab's in-place working copy vs a naive sweep that keeps K models.

Each measurement runs in its own process (peak RSS = getrusage ru_maxrss) and is reported as a multiple of
the model's size (float32 bytes of its parameters), above the process's RSS after imports:

    python bench/sweep_memory.py                       # synthetic ~21M-parameter Llama pool (built in /tmp)
    python bench/sweep_memory.py --pool POOL.yaml --model NAME

The peer is a naive sweep that materialises each θ(α) as its own model and keeps them (what a sweep that
returns K models does); forgetlab's sweep should stay flat from 6 to 11 points.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

GENERAL = ["The river flows through the old town and past the mill where farmers bring grain every week."] * 8


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


class AnonPeak:
    """Samples RssAnon (private memory, without the file pages that mmapped safetensors reads leave mapped)
    every 5 ms in a thread and keeps the maximum."""

    def __init__(self):
        import threading

        self.peak = _status_mb("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _status_mb("RssAnon"))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status_mb("RssAnon"))
        return self.peak


def build_synthetic(root: Path) -> Path:
    """A base and one fine-tune (θ0 + noise) of a ~21M-parameter Llama, a small BPE tokenizer, probe files."""
    import torch
    import yaml
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(GENERAL + ["1+2=3", "copy red: red"], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256,
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(root / "base")
    fast.save_pretrained(root / "base")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(root / "ft-math")
    fast.save_pretrained(root / "ft-math")
    (root / "general.txt").write_text("\n\n".join(GENERAL))
    with open(root / "math.jsonl", "w") as fh:
        for a in range(8):
            fh.write(json.dumps({"prompt": f"{a}+1=", "answer": str(a + 1)}) + "\n")
    spec = {"name": "bench", "base": "base", "models": {"ft-math": "ft-math"},
            "probes": {"general": "general.txt", "tasks": {"math": {"eval": "math.jsonl"}}}}
    (root / "pool.yaml").write_text(yaml.safe_dump(spec))
    return root / "pool.yaml"


def child(mode: str, points: int, pool_path: str, model: str) -> dict:
    """Run one sweep of `points` α values in this process and return its memory figures."""
    import torch

    torch.set_num_threads(1)
    from forgetlab.analysis.sweeps import alpha_curve
    from forgetlab.core.checkpoints import load_model
    from forgetlab.core.evaluate import evaluate
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(pool_path, scan_nonfinite=False)
    model_bytes = sum(pool.checkpoint("base").info(n).numel for n in pool.checkpoint("base").names()) * 4
    start_rss = _rss_mb()
    start_anon = _status_mb("RssAnon")
    sampler = AnonPeak()
    alphas = [i / (points - 1) for i in range(points)]
    if mode == "inplace":
        alpha_curve(pool, model, alphas=alphas, device="cpu", max_general=4, max_task=4)
    else:  # naive peer: one new model per α, all kept (a sweep that returns its K models)
        kept = []
        base, tuned = pool.checkpoint("base"), pool.checkpoint(model)
        for a in alphas:
            m = load_model(base, device="cpu")
            with torch.no_grad():
                for name, p in m.named_parameters():
                    p.copy_((1 - a) * base.read(name) + a * tuned.read(name))
            evaluate(m, pool.tokenizer, pool.probes, name=f"α={a}", max_general=4, max_task=4)
            kept.append(m)
    peak = _peak_mb()
    anon = sampler.stop()
    return {"mode": mode, "points": points, "model_mb": model_bytes / 2**20, "start_rss_mb": start_rss,
            "peak_mb": peak, "extra_x_model": (peak - start_rss) * 2**20 / model_bytes,
            "anon_peak_mb": anon, "anon_x_model": (anon - start_anon) * 2**20 / model_bytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", help="pool.yaml (default: a synthetic ~21M-parameter pool)")
    ap.add_argument("--model", default="ft-math", help="fine-tuned model to sweep")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "POINTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.pool, args.model)))
        return 0
    tmp = None
    pool = args.pool
    if pool is None:
        tmp = tempfile.TemporaryDirectory(prefix="forgetlab-bench-")
        pool = str(build_synthetic(Path(tmp.name)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = []
    for mode in ("inplace", "copies"):
        for points in (6, 11):
            out = subprocess.run([sys.executable, __file__, "--pool", pool, "--model", args.model,
                                  "--child", mode, str(points)], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"torch threads: 1 · model: {rows[0]['model_mb']:.1f} MiB of float32 parameters · pool: {pool}")
    print("peak RSS counts the safetensors pages that reads leave mapped (file-backed, reclaimable); peak anon")
    print("counts private memory only. Both are above the process's memory after imports, in model sizes.")
    print(f"{'sweep':<28}{'points':>7}{'peak RSS MiB':>14}{'RSS / model':>13}{'anon / model':>14}")
    for r in rows:
        name = "forgetlab (in place)" if r["mode"] == "inplace" else "naive peer (K models kept)"
        print(f"{name:<28}{r['points']:>7}{r['peak_mb']:>14.0f}{r['extra_x_model']:>12.2f}x"
              f"{r['anon_x_model']:>13.2f}x")
    ip = {r["points"]: r for r in rows if r["mode"] == "inplace"}
    nv = {r["points"]: r for r in rows if r["mode"] == "copies"}
    print(f"growth 6 → 11 points (RSS): in place {ip[11]['extra_x_model'] - ip[6]['extra_x_model']:+.2f} model "
          f"sizes, naive {nv[11]['extra_x_model'] - nv[6]['extra_x_model']:+.2f} model sizes; "
          f"at 11 points the naive sweep needs {nv[11]['extra_x_model'] / ip[11]['extra_x_model']:.1f}x the memory")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
