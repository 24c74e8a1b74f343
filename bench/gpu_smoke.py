"""GPU smoke test: every job the app offers, once, on `cuda`, next to the same job on CPU float32.

    python bench/gpu_smoke.py                      # builds (or reuses) the smol zoo under FORGETLAB_HOME
    python bench/gpu_smoke.py --pool POOL.yaml     # any pool (a base, ≥ 2 fine-tuned models, probe data)
    python bench/gpu_smoke.py --dry-run            # the script's own plumbing on a tiny random model, on CPU
    python bench/gpu_smoke.py --device cpu         # every job really run in bfloat16 on CPU, tiny random model
    python bench/gpu_smoke.py --allow-skip         # a job that cannot run is reported, not a failure

Jobs: scorecards (base and a fine-tune, loaded in bfloat16), linearity (layer level), features (captured
submodule features), a WiSE-FT α sweep, a FAPM pruning sweep, a TIES and a PCB merge (in memory, on the
device), the Merge page's path (a TIES merge through the streaming engine into a folder, then scored in the job's
dtype), PCB's λ search (its start point's probe loss), a MoFO fine-tune, a LoRA fine-tune (rank 8, gradient
checkpointing), the attribution map, and an α sweep on Ray with one worker per visible GPU. Each job prints its wall time, peak GPU memory, the largest difference of its
numbers from the CPU float32 run and whether that is within tolerance (bfloat16: 5e-2 relative; jobs whose API
computes in float32 on the GPU: 2e-3 relative, the GPU's reduction order being the only difference). The
`dtype` column says which (the in-memory merges run in float32 on the GPU — merges compute θ0 + f(τ) in
float32 by design —, every other job in bfloat16). The script exits 1 when a job fails or disagrees, or is skipped (unless `--allow-skip`), 0 otherwise.
Memory: each job's estimate (`forgetlab.core.memory.estimate`, for jobs with an estimator) is printed beside
its measured peak (`PeakMeter`: CUDA's allocator peak, the CPU's anonymous RSS) and their ratio.

Without CUDA it says so, runs its plumbing on CPU against itself on a tiny random Llama pool (built in a
temporary folder, well under a minute; Ray is skipped) and exits 0.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from forgetlab.core.errors import MissingDependencyError

GENERAL = [
    "The river flows through the old town and past the mill. Farmers bring grain to the market every week.",
    "A library keeps books, maps and letters. Readers come in the morning and leave in the evening.",
    "The mountain is covered with snow in winter; in summer the meadows are green and full of flowers.",
    "Ships carried wool and salt along the coast. The harbour grew into a busy city over many years.",
]
TASKS = {
    "math": [(f"{a}+{b}=", str(a + b)) for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 8), (9, 9)]],
    "copy": [(f"copy {w}:", w) for w in ["red", "blue", "green", "stone", "river", "salt"]],
}


def tiny_pool(root: Path) -> Path:
    """A tiny random Llama base + two perturbed fine-tunes + probe files + pool.yaml (the dry run's pool)."""
    import yaml
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(GENERAL + [p + " " + a for v in TASKS.values() for p, a in v],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, pad_token_id=fast.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    for i, name in enumerate(["base", "ft0", "ft1"]):
        if i:
            g = torch.Generator().manual_seed(100 + i)
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(base[n] + 0.02 * torch.randn(p.shape, generator=g))
        model.save_pretrained(str(root / name))
        fast.save_pretrained(str(root / name))
    (root / "data").mkdir()
    (root / "data" / "general.txt").write_text("\n\n".join(GENERAL))
    for t, pairs in TASKS.items():
        (root / "data" / f"{t}.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n"
                                                          for p, a in pairs))
    spec = {"name": "smoke", "base": "base", "models": {"ft0": "ft0", "ft1": "ft1"},
            "probes": {"general": "data/general.txt",
                       "tasks": {t: {k: f"data/{t}.jsonl" for k in ("train", "probe", "eval")} for t in TASKS}}}
    (root / "pool.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return root / "pool.yaml"


# ------------------------------------------------------------------------------------------------- jobs
# each job: (pool, models, device, dtype) -> list of numbers that must agree with the CPU float32 run


def job_scorecards(pool, models, device, dtype):
    from forgetlab.core.checkpoints import load_model
    from forgetlab.core.evaluate import evaluate

    out = []
    for name in ("base", models[0]):
        m = load_model(pool.checkpoint(name), device=device, dtype=dtype)
        card = evaluate(m, pool.tokenizer, pool.probes, max_general=8, max_task=16)
        out += [card.general_loss] + [t.answer_loss for t in card.tasks.values()]
        del m
    return out


def job_linearity(pool, models, device, dtype):
    from forgetlab.analysis.linearity import nonlinearity_scores

    res = nonlinearity_scores(pool, pool.task_names[0], model=models[0], levels=("layer",), samples=4, device=device,
                              dtype=dtype)
    return [s.nls_mean for s in res.scores]


def job_features(pool, models, device, dtype):
    from forgetlab.analysis.features import capture_features

    fs = capture_features(pool, pool.task_names[:2], ["base", models[0]], level="layer", layer=-1, samples=4,
                          device=device, dtype=dtype)
    return [float(abs(fs.X).mean()), float(fs.X.std())]


def job_alpha_sweep(pool, models, device, dtype):
    from forgetlab.analysis.sweeps import alpha_curve

    res = alpha_curve(pool, models[0], alphas=[0.0, 0.5, 1.0], device=device, max_general=8, max_task=16,
                      dtype=dtype)
    return [p.general_loss for p in res.points] + [p.distance for p in res.points]


def job_fapm_sweep(pool, models, device, dtype):
    from forgetlab.analysis.sweeps import pruning_curve

    res = pruning_curve(pool, models[0], ratios=[0.5, 0.9], scores=["fapm"], device=device, max_general=8,
                        max_task=16, dtype=dtype)
    return [p.general_loss for p in res.points]


def _merge(method, pool, models, device, **params):
    from forgetlab.merge import merge_state_dicts

    base = pool.checkpoint("base").state_dict()
    fts = [pool.checkpoint(m).state_dict() for m in models[:2]]
    merged = merge_state_dicts(method, base, fts, device=device, **params)
    names = sorted(merged)[:6]
    return [float(merged[n].float().norm()) for n in names]


def job_ties_merge(pool, models, device, dtype):
    return _merge("ties", pool, models, device, keep=0.2)


def job_pcb_merge(pool, models, device, dtype):
    return _merge("pcb", pool, models, device, keep=0.2)


def _recipe(method, pool, models):
    return {"method": method, "base": str(pool.resolve_ref("base")),
            "models": [{"model": str(pool.resolve_ref(m))} for m in models[:2]]}


def job_merge_and_evaluate(pool, models, device, dtype):
    """The Merge page's path: TIES through the streaming engine into a folder, then the base, parents and merge
    scored in the job's dtype."""
    import tempfile

    from forgetlab.merge.workflow import merge_and_evaluate

    with tempfile.TemporaryDirectory() as tmp:
        _, cards = merge_and_evaluate(_recipe("ties", pool, models), Path(tmp) / "m", pool, device=device,
                                      dtype=dtype, max_general=8, max_task=16)
    return [c.general_loss for c in cards] + [t.answer_loss for t in cards[-1].tasks.values()]


def job_pcb_search(pool, models, device, dtype):
    from forgetlab.analysis.lambda_search import pcb_lambda_search
    from forgetlab.merge.recipe_io import load_recipe

    res, _ = pcb_lambda_search(pool, load_recipe({**_recipe("pcb", pool, models), "params": {"scope": "global"}}),
                               budget=1, max_task=16, device=device, dtype=dtype)
    return [res.initial_loss]


def job_mofo_finetune(pool, models, device, dtype):
    from forgetlab.train.runs import FinetuneConfig, finetune

    run = finetune(pool, pool.task_names[0], FinetuneConfig(label="mofo", optimizer="mofo", steps=STEPS, batch_size=4,
                                                          seed=0), max_general=8, max_task=16, device=device,
                   dtype=dtype)
    return [run.final.general_loss]


def job_lora_finetune(pool, models, device, dtype):
    from forgetlab.train.runs import FinetuneConfig, finetune

    run = finetune(pool, pool.task_names[0], FinetuneConfig(label="lora", optimizer="adamw", steps=STEPS, batch_size=4,
                                                          seed=0, lora=8), max_general=8, max_task=16, device=device,
                   dtype=dtype, gradient_checkpointing=True)
    return [run.final.general_loss]


def job_attribution(pool, models, device, dtype):
    from forgetlab.analysis.attribution import attribute

    res = attribute(pool, models[0], task=pool.task_names[0], level="layer", device=device, max_general=8,
                    max_task=8, dtype=dtype)
    frame = res.to_frame()
    cols = ["general_loss", "speciality", "answer_loss", "d_general_loss", "d_speciality", "d_answer_loss"]
    return [float(v) for v in frame[cols].astype(float).to_numpy().ravel()]


def job_ray_sweep(pool, models, device, dtype):
    from forgetlab.analysis.sweeps import alpha_curve
    from forgetlab.executors import RayExecutor

    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    ex = RayExecutor(workers=max(1, gpus) if gpus else 1, gpus_per_worker=1 if gpus else 0)
    res = alpha_curve(pool, models[0], alphas=[0.0, 0.5, 1.0], device=None if gpus else device, max_general=8,
                      max_task=16, executor=ex, dtype=dtype)
    return [p.general_loss for p in res.points] + [p.distance for p in res.points]


def _estimate(job, pool, models, device, dtype):
    """The job's estimated peak in bytes (None when the job has no estimator yet)."""
    from forgetlab.core.errors import ForgetlabError
    from forgetlab.core.memory import estimate

    try:
        if job in ("alpha sweep", "FAPM sweep", "Ray alpha sweep"):
            import forgetlab.analysis.sweeps  # noqa: F401  (registers the estimator)
            return estimate("sweep", pool=pool, model=models[0], kind="alpha" if "alpha" in job else "pruning",
                            device=device, dtype=dtype, max_general=8, max_task=16).total
        if job in ("MoFO fine-tune", "LoRA fine-tune"):
            from forgetlab.train.runs import FinetuneConfig
            lora = job.startswith("LoRA")
            cfg = FinetuneConfig(label=job, optimizer="adamw" if lora else "mofo", steps=STEPS, batch_size=4,
                                 lora=8 if lora else 0)
            return estimate("finetune", pool=pool, task=pool.task_names[0], device=device, dtype=dtype, config=cfg,
                            gradient_checkpointing=lora).total
        if job == "attribution":
            import forgetlab.analysis.attribution  # noqa: F401
            return estimate("attribution", pool=pool, model=models[0], task=pool.task_names[0], level="layer",
                            device=device, dtype=dtype, max_general=8, max_task=8).total
        if job == "merge + evaluate":
            return estimate("merge", recipe=_recipe("ties", pool, models), pool=pool, device=device, dtype=dtype,
                            evaluate=True, max_general=8, max_task=16).total
        if job == "PCB λ search":
            return estimate("pcb_search", pool=pool, recipe=_recipe("pcb", pool, models), device=device,
                            dtype=dtype, max_task=16).total
        if job == "features":
            import forgetlab.analysis.features  # noqa: F401
            return estimate("features", pool=pool, tasks=pool.task_names[:2], models=["base", models[0]],
                            level="layer", layer=-1, samples=4, device=device, dtype=dtype).total
        if job == "linearity":
            import forgetlab.analysis.linearity  # noqa: F401
            return estimate("linearity", pool=pool, task=pool.task_names[0], model=models[0], levels=("layer",),
                            samples=4, device=device, dtype=dtype).total
    except ForgetlabError:
        return None
    return None


STEPS = 10
JOBS = [("scorecards", job_scorecards, True), ("linearity", job_linearity, True),
        ("features", job_features, True), ("alpha sweep", job_alpha_sweep, True),
        ("FAPM sweep", job_fapm_sweep, True), ("TIES merge", job_ties_merge, False),
        ("PCB merge", job_pcb_merge, False), ("merge + evaluate", job_merge_and_evaluate, True),
        ("PCB λ search", job_pcb_search, True), ("MoFO fine-tune", job_mofo_finetune, True),
        ("LoRA fine-tune", job_lora_finetune, True), ("attribution", job_attribution, True),
        ("Ray alpha sweep", job_ray_sweep, True)]
"""(name, job, whether it takes the dtype: the others compute in float32 by their API)."""


def max_rel_diff(a, b) -> float:
    """Largest |a − b| / max(|b|, 0.1·max|b|, 1e-6) over the numbers (inf when the lengths differ; nan-aware).
    The floor keeps a value that should be 0 (D(θ0, θ0), which bfloat16 rounding of θ0 makes ~1e-3) from
    dividing by zero: it is judged against the scale of its series."""
    if len(a) != len(b):
        return float("inf")
    scale = max((abs(y) for y in b if not math.isnan(y)), default=0.0)
    worst = 0.0
    for x, y in zip(a, b):
        if math.isnan(x) and math.isnan(y):
            continue
        worst = max(worst, abs(x - y) / max(abs(y), 0.1 * scale, 1e-6))
    return worst


def run(pool_yaml: Path, device: str, dtype, skip=(), dry=False, allow_skip=False) -> int:
    """Run every job on `device` and on CPU float32, print the table; 1 if a job failed, disagreed or was skipped
    (a skip is allowed with `allow_skip`, and for the jobs in `skip`, which the caller chose to leave out).
    `dry`: the CPU run only, compared with itself (the plumbing: jobs, timing, table)."""
    from forgetlab.core.memory import PeakMeter
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(pool_yaml)
    models = pool.model_names
    rows, failed = [], False
    for name, job, takes_dtype in JOBS:
        if name in skip:
            rows.append((name, "-", float("nan"), float("nan"), float("nan"), "skipped"))
            continue
        jd = dtype if takes_dtype else torch.float32
        try:
            t0 = time.perf_counter()
            ref = job(pool, models, "cpu", torch.float32)
            t_cpu = time.perf_counter() - t0
            if ref is None:
                failed |= not allow_skip
                rows.append((name, "-", float("nan"), float("nan"), float("nan"),
                             "skipped (not available)" + ("" if allow_skip else ": FAILS without --allow-skip")))
                continue
            est = _estimate(name, pool, models, device, jd)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with PeakMeter(device) as meter:
                got = list(ref) if dry else job(pool, models, device, jd)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
            wall = t_cpu if dry else time.perf_counter() - t0
            peak = float("nan") if dry else meter.peak / 2**20
            diff = max_rel_diff(got, ref)
            tol = 5e-2 if jd == torch.bfloat16 else 2e-3
            ok = diff <= tol
            failed |= not ok
            ratio = (f"; estimate {est / 2**20:.0f} MiB = {est / meter.peak:.2f}× peak"
                     if est and not dry and meter.peak > 0 else "")
            rows.append((name, str(jd).replace("torch.", ""), wall, peak, diff,
                         f"{'ok' if ok else 'DISAGREES'} (tol {tol:g}; CPU {t_cpu:.1f} s{ratio})"))
        except MissingDependencyError as exc:      # e.g. cma or ray not installed on the GPU machine
            failed |= not allow_skip
            rows.append((name, "-", float("nan"), float("nan"), float("nan"),
                         f"skipped ({exc})"[:120] + ("" if allow_skip else ": FAILS without --allow-skip")))
        except Exception as exc:  # noqa: BLE001 - the table reports every failure
            failed = True
            rows.append((name, "-", float("nan"), float("nan"), float("nan"), f"FAILED: {type(exc).__name__}: {exc}"[:160]))
            traceback.print_exc(file=sys.stderr)
    print(f"{'job':<16} {'dtype':<9} {'wall s':>8} {'peak MiB':>9} {'max rel diff':>13}  verdict")
    for name, dt, wall, peak, diff, verdict in rows:
        print(f"{name:<16} {dt:<9} {wall:>8.2f} {peak:>9.0f} {diff:>13.2e}  {verdict}")
    return 1 if failed else 0


def main(argv=None) -> int:
    global STEPS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", help="pool.yaml (default: the smol zoo, built when missing)")
    ap.add_argument("--dry-run", action="store_true", help="the plumbing on CPU on a tiny random pool")
    ap.add_argument("--device", default=None, help="cuda (default when visible) or cpu: every job run in bfloat16 "
                                                   "on CPU on a tiny random pool, against float32")
    ap.add_argument("--allow-skip", action="store_true", help="a job that cannot run does not fail the script")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cuda available: {torch.cuda.is_available()}")
    if args.device == "cpu" and not args.dry_run:
        STEPS = 4
        with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
            os.environ.setdefault("FORGETLAB_HOME", str(Path(tmp) / "home"))
            code = run(tiny_pool(Path(tmp)), "cpu", torch.bfloat16, skip=("Ray alpha sweep",),
                       allow_skip=args.allow_skip)
        print("cpu run " + ("passed" if code == 0 else "FAILED"))
        return code
    if args.dry_run or not torch.cuda.is_available():
        if not args.dry_run:
            print("No CUDA device here: nothing to measure on a GPU. Running a CPU dry run of the script's own "
                  "plumbing on a tiny random model (Ray skipped) instead.")
        STEPS = 4
        with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
            os.environ.setdefault("FORGETLAB_HOME", str(Path(tmp) / "home"))
            pool_yaml = tiny_pool(Path(tmp))
            code = run(pool_yaml, "cpu", torch.float32, skip=("Ray alpha sweep",), dry=True,
                       allow_skip=args.allow_skip)
        print("dry run " + ("passed" if code == 0 else "FAILED"))
        return code
    if args.pool:
        pool_yaml = Path(args.pool)
    else:
        from forgetlab.zoo import build

        pool_yaml = build(preset="smol").pool_yaml
    print(f"GPU: {torch.cuda.get_device_name(0)} × {torch.cuda.device_count()}; pool {pool_yaml}")
    return run(pool_yaml, "cuda", torch.bfloat16, allow_skip=args.allow_skip)


if __name__ == "__main__":
    sys.exit(main())
