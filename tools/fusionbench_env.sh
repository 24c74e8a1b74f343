#!/usr/bin/env bash
# Create .venv-fusionbench (idempotent): fusion-bench 0.2.33 in its own venv, the reference for the parity tests
# of TSV-M, Iso-C / Iso-CTS, RegMean and Fisher merging (tests/test_merge_fusionbench_parity.py).
#   bash tools/fusionbench_env.sh                  # creates <repo>/.venv-fusionbench
#   FUSIONBENCH_VENV=/path bash tools/fusionbench_env.sh
#   FUSIONBENCH_WHEEL=/path/fusion_bench-0.2.33-py3-none-any.whl bash tools/fusionbench_env.sh
# torch is pinned to 2.13.0 first (the CPU wheel on this machine's pip index); fusion-bench itself goes in with
# --no-deps, plus only what importing its merge functions needs (its full dependency set pulls tensorboard,
# datasets' extras and more). The list below is what `import fusion_bench.method....` asked for, in order.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FUSIONBENCH_VENV:-$here/.venv-fusionbench}"
python="${PYTHON:-python3}"
wheel="${FUSIONBENCH_WHEEL:-fusion-bench==0.2.33}"
check='import fusion_bench.method.isotropic_merging.iso_utils, fusion_bench.method.task_singular_vector.utils.TSVM_utils, fusion_bench.method.regmean.regmean, fusion_bench.method.fisher_merging.fisher_merging, importlib.metadata as m; assert m.version("fusion_bench") == "0.2.33"'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
    echo "fusion-bench 0.2.33 already in $venv"
    exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "torch==2.13.0"
"$venv/bin/python" -m pip install --quiet --no-deps "$wheel"
"$venv/bin/python" -m pip install --quiet packaging omegaconf numpy bidict hydra-core lightning-utilities rich \
    lightning transformers accelerate datasets peft joblib
"$venv/bin/python" -c "$check"
echo "fusion-bench 0.2.33 installed in $venv"
