#!/usr/bin/env bash
# Issue 28's GPU measurements as one prepared run, from the repository root on a CUDA machine (≈ 9 min):
#
#     bash bench/gpu_issue28.sh          # logs under $OUT (the device tool's folder) or /tmp/gpu28
#
# 1. bench/gpu_smoke.py: every job on cuda against CPU float32, with each estimate beside CUDA's peak;
# 2. bench/merge_limit.py: PCB (global), TIES and task arithmetic on cuda against the read+write limit (aim: PCB
#    at ≥ 0.3 of it);
# 3. bench/sweep_point_cost.py: a FAPM sweep point against a WiSE-FT point on cuda (aim: ≤ 1.5×);
# 4. bench/memory.py: each job's CUDA peak as a multiple of the model's bytes, beside its estimate.
# The pools are random Llamas with the tiny tokenizer and probe data of gpu_smoke's `tiny_pool` (no zoo to build).
# The machine needs torch with CUDA, transformers, safetensors, peft, pandas, PyYAML and tqdm (the device image has
# them). cma (the λ search) and ray are not there: a job that needs them is reported as skipped (`--allow-skip`),
# or they travel as wheels: here, `echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps
# --only-binary=:all: -d .whl cma` (a pure-Python wheel), then carry `.whl`; this script installs what it finds.
set -u -o pipefail
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
OUT=${OUT:-/tmp/gpu28}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PY:-python3}
POOL=$(mktemp -d)
export FORGETLAB_HOME="$POOL/home"
"$PY" -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; from gpu_smoke import tiny_pool; \
tiny_pool(Path('$POOL'))" || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 | tee "$OUT/device.txt"
timeout 180 "$PY" bench/gpu_smoke.py --pool "$POOL/pool.yaml" --allow-skip 2>&1 | tee "$OUT/gpu_smoke.txt"
timeout 150 "$PY" bench/merge_limit.py --sizes 27M,100M --device cuda --no-mergekit \
    --only pcb,ties,task_arithmetic 2>&1 | tee "$OUT/merge_limit.txt"
timeout 90 "$PY" bench/sweep_point_cost.py --size 100M --device cuda --zoo "$POOL" 2>&1 | tee "$OUT/sweep_point_cost.txt"
# every job but features (the tiny pool has 6 probe pairs per task, features asks 8; gpu_smoke measures features)
JOBS=finetune-adamw,finetune-mofo,finetune-adamw-bf16,finetune-lora-bf16-ckpt,sweep-alpha,sweep-alpha-bf16
JOBS=$JOBS,sweep-pruning-fapm,textdiff,textdiff-bf16,search,search-bf16,eval,eval-bf16
timeout 150 "$PY" bench/memory.py --size 100M --device cuda --zoo "$POOL" --jobs "$JOBS" 2>&1 | tee "$OUT/memory.txt"
