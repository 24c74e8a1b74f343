"""The reference tools the parity tests compare against (mergekit 0.1.5, fusion-bench), each in its own venv made by
tools/mergekit_env.sh and tools/fusionbench_env.sh: where they are, the mark that skips a test without them, and
the environment they run in (offline, one thread, without this checkout on PYTHONPATH)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MERGEKIT_VENV = Path(os.environ.get("MERGEKIT_VENV", ROOT / ".venv-mergekit"))
MERGEKIT_YAML = MERGEKIT_VENV / "bin" / "mergekit-yaml"
MERGEKIT_MULTI = MERGEKIT_VENV / "bin" / "mergekit-multi"
MERGEKIT_PYTHON = MERGEKIT_VENV / "bin" / "python"
FUSIONBENCH_VENV = Path(os.environ.get("FUSIONBENCH_VENV", ROOT / ".venv-fusionbench"))
FUSIONBENCH_PYTHON = FUSIONBENCH_VENV / "bin" / "python"


def skip_without_mergekit(program: Path = MERGEKIT_MULTI) -> pytest.MarkDecorator:
    """Skip unless mergekit's `program` (mergekit-multi by default) is installed."""
    return pytest.mark.skipif(not program.exists(), reason=f"mergekit venv missing at {MERGEKIT_VENV}: create it "
                                                           "with `bash tools/mergekit_env.sh`")


def skip_without_fusionbench() -> pytest.MarkDecorator:
    """Skip unless fusion-bench's venv is installed."""
    return pytest.mark.skipif(not FUSIONBENCH_PYTHON.exists(), reason=f"fusion-bench venv missing at "
                                                                     f"{FUSIONBENCH_VENV}: create it with `bash "
                                                                     "tools/fusionbench_env.sh`")


def reference_env() -> dict[str, str]:
    """The environment a reference tool runs in: offline, one thread, this checkout off PYTHONPATH."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    return env
