#!/usr/bin/env bash
# Create .venv-mergekit (idempotent): mergekit 0.1.5 in its own venv, so that its pins never touch the
# project's venv. Used by tests/test_merge_mergekit_parity.py and bench/merge_vs_mergekit.py.
#   bash tools/mergekit_env.sh            # creates <repo>/.venv-mergekit
#   MERGEKIT_VENV=/path bash tools/mergekit_env.sh
# torch is pinned to the 2.13.0 CPU wheel that lies on this machine's disk (pip finds it through
# find-links); mergekit 0.1.5 only asks torch>=2.0, so that pin resolves without a download of torch.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MERGEKIT_VENV:-$here/.venv-mergekit}"
python="${PYTHON:-python3}"
if [ -x "$venv/bin/mergekit-yaml" ] && "$venv/bin/python" -c "import mergekit, importlib.metadata as m; assert m.version('mergekit') == '0.1.5'" 2>/dev/null; then
    echo "mergekit 0.1.5 already in $venv"
    exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "mergekit==0.1.5" "torch==2.13.0"
"$venv/bin/mergekit-yaml" --help >/dev/null
echo "mergekit 0.1.5 installed in $venv"
