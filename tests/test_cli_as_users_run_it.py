"""The CLI as users run it: `forgetlab …` in a fresh process with torch's default thread count (no pin, as on
any multi-core machine), its output piped and on a pseudo-terminal.

The first progress report of a CLI job ticks the thread governor (forgetlab.core.threads), whose first tick
checks once per process whether backward passes depend on the thread count. Evaluation and linearity report
progress inside torch.no_grad(): a probe that ran its backward pass in the caller's autograd mode crashed every
one of these commands on machines with two or more cores, while the suite (one pinned thread, an in-process
call) stayed green. These tests run the commands the way users do, so that a crash of this kind shows here.
"""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the pinning a user's shell does not have: every thread count the child would otherwise inherit from a runner
PINNING = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS")
TIMEOUT = 240.0


def commands(pool: Path, out: Path) -> dict[str, list[str]]:
    """One small but complete run of each analysis command on the tiny pico zoo (pool file `pool`)."""
    p = str(pool)
    return {
        "eval": ["eval", p, "--max-general", "4", "--max-task", "4", "--no-lm-eval"],
        "linearity": ["linearity", p, "--task", "math", "--samples", "4", "--alphas", "0,0.5", "--no-save"],
        "sweep": ["sweep", "alpha", p, "--model", "math", "--alphas", "0,1", "--max-general", "4", "--max-task", "4",
                  "--no-save"],
        "textdiff": ["textdiff", p, "--model", "math", "--max-general", "2", "--no-save"],
        "attribution": ["attribution", p, "--model", "math", "--level", "layer", "--max-general", "4",
                        "--max-task", "4", "--no-save"],
        "features": ["features", p, "--tasks", "math", "code", "--samples", "6", "--perplexity", "2",
                     "--out", str(out / "features.csv")],
        "sequence": ["sequence", p, "--order", "math,code", "--compare", "adamw,ewc", "--steps", "3",
                     "--max-train", "8", "--max-general", "2", "--max-task", "4", "--out", str(out / "sequence")],
        "study": ["study", "mofo-lion", p, "--steps", "3", "--max-train", "8", "--max-general", "2", "--max-task", "4",
                  "--no-save", "--out", str(out / "mofo-lion")],
    }


def user_env(home: Path) -> dict[str, str]:
    """The environment of a user's shell: the workspace, offline, and no thread pinning."""
    env = {k: v for k, v in os.environ.items() if k not in PINNING}
    env.update(FORGETLAB_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return env


def forgetlab_command() -> list[str]:
    """The `forgetlab` console script the install puts beside this interpreter (what users type)."""
    exe = Path(sys.executable).with_name("forgetlab")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "forgetlab"]


def run_piped(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """`forgetlab ARGS | cat`: stdout and stderr are pipes."""
    r = subprocess.run([*forgetlab_command(), *args], env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=TIMEOUT)
    return r.returncode, r.stdout + r.stderr


def run_on_terminal(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """`forgetlab ARGS` on a terminal: stdout and stderr are a pseudo-terminal, as in an interactive shell."""
    main, child = pty.openpty()
    proc = subprocess.Popen([*forgetlab_command(), *args], env={**env, "TERM": "xterm"}, cwd=cwd,
                            stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    chunks, deadline = [], time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                try:
                    data = os.read(main, 65536)
                except OSError:          # the child closed the terminal
                    data = b""
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            pytest.fail(f"forgetlab {' '.join(args)} did not end within {TIMEOUT:.0f} s on a terminal")
        return proc.wait(timeout=30), b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(main)


@pytest.fixture(scope="module")
def user_workspace(pico_zoo, tmp_path_factory) -> tuple[Path, Path]:
    """A workspace of its own over the session's tiny pico zoo, and the zoo's pool file."""
    home = tmp_path_factory.mktemp("cli-user-home")
    (home / "zoo").symlink_to(Path(pico_zoo.pool_yaml).parent.parent, target_is_directory=True)
    return home, Path(pico_zoo.pool_yaml)


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
@pytest.mark.parametrize("name", ["eval", "linearity", "sweep", "textdiff", "attribution", "features", "sequence",
                                  "study"])
def test_analysis_commands_run_with_the_users_threads(user_workspace, tmp_path, name, terminal):
    home, pool_yaml = user_workspace
    args = commands(pool_yaml, tmp_path)[name]
    code, output = (run_on_terminal if terminal else run_piped)(args, user_env(home), tmp_path)
    assert code == 0 and "Traceback" not in output, f"forgetlab {' '.join(args)} exited {code}:\n{output[-3000:]}"
    if name == "sequence":       # EWC's Fisher (torch.func) must not flood the user's screen with torch's notes
        assert "Warning" not in output, output[-3000:]
    if terminal:
        assert "\r" in output, "on a terminal, progress is a redrawn bar"
