"""Issue 41, item 2: `finetune --save-as NAME` interrupted as its folder lands. The folder and its entry in
pool.yaml appear together (forgetlab.core.poolsaves): Ctrl-C and SIGTERM are held while the folder lands and the
pool file is written, then delivered; after SIGKILL, which cannot be held, the next save into the folder finishes
the entry (the model is complete) and says so. Signals are real, sent by the process to itself from inside the
rename that lands the folder."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys

import pytest
import yaml

from forgetlab.cli import main
from forgetlab.core.errors import WorkspaceError
from forgetlab.core.pool import ModelPool

ARGS = ["--task", "math", "--steps", "1", "--batch-size", "2", "--max-general", "1", "--max-task", "1",
        "--no-save", "--device", "cpu"]


@pytest.fixture
def pool_dir(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    return root


def _listed(root) -> list[str]:
    return list((yaml.safe_load((root / "pool.yaml").read_text()).get("models") or {}))


def _hidden(root) -> list[str]:
    folder = root / "finetuned"
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.is_dir() else []


def _run_with_signal(root, sig: str, *, before: bool = False, extra=()) -> subprocess.CompletedProcess:
    """`forgetlab finetune … --save-as newm` in a subprocess that sends itself `sig` from inside the rename that
    lands finetuned/newm, right after it (the window before pool.yaml is written); or, `before`, as the finished
    temporary folder's files are recorded, the last step before it lands."""
    code = (
        "import os, signal, sys\n"
        # as in a terminal: Ctrl-C raises KeyboardInterrupt even when the test runner was started in the
        # background (a shell's `cmd &` hands its children SIGINT ignored, and Python then keeps it ignored)
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from pathlib import Path\n"
        "import forgetlab.core.filerecords as fr\n"
        "orig, orig_records = Path.rename, fr.file_records\n"
        "def rename(self, target):\n"
        "    result = orig(self, target)\n"
        "    if self.name.startswith('.newm.tmp-') and Path(target).name == 'newm':\n"
        f"        os.kill(os.getpid(), signal.{sig})\n"
        "    return result\n"
        "def records(folder, files):\n"
        "    result = orig_records(folder, files)\n"
        "    if Path(folder).name.startswith('.newm.tmp-'):\n"
        f"        os.kill(os.getpid(), signal.{sig})\n"
        "    return result\n"
        f"if {before!r}:\n"
        "    fr.file_records = records\n"
        "else:\n"
        "    Path.rename = rename\n"
        "from forgetlab.cli import main\n"
        f"sys.exit(main(['finetune', {str(root / 'pool.yaml')!r}, *{ARGS + list(extra)!r}, '--save-as', 'newm']))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("sig, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_or_sigterm_as_the_folder_lands_leaves_the_model_saved_and_listed(sig, status, pool_dir):
    proc = _run_with_signal(pool_dir, sig)
    assert proc.returncode == status, proc.stderr
    assert "newm had been saved into" in proc.stderr and "added to the pool" in proc.stderr
    assert (pool_dir / "finetuned" / "newm" / "model.safetensors").is_file()
    assert "newm" in _listed(pool_dir) and _hidden(pool_dir) == []
    assert "newm" in ModelPool.from_yaml(pool_dir / "pool.yaml").model_names


def test_ctrl_c_just_before_the_folder_lands_leaves_neither_and_a_rerun_saves(pool_dir, capsys):
    proc = _run_with_signal(pool_dir, "SIGINT", before=True)
    assert proc.returncode == 130, proc.stderr
    assert "nothing half-written was kept." in proc.stderr
    assert not (pool_dir / "finetuned" / "newm").exists() and "newm" not in _listed(pool_dir)
    assert _hidden(pool_dir) == []
    assert main(["finetune", str(pool_dir / "pool.yaml"), *ARGS, "--save-as", "newm"]) == 0
    assert "newm" in _listed(pool_dir)


@pytest.mark.parametrize("extra, adapter", [((), False), (("--lora", "2"), True)])
def test_after_sigkill_as_the_folder_lands_the_next_save_finishes_the_entry(extra, adapter, pool_dir, capsys):
    proc = _run_with_signal(pool_dir, "SIGKILL", extra=extra)
    assert proc.returncode == -signal.SIGKILL
    folder = pool_dir / "finetuned" / "newm"
    assert folder.is_dir() and "newm" not in _listed(pool_dir)          # the window SIGKILL cannot close
    assert _hidden(pool_dir) == [".newm.lock", ".newm.pool-entry.json"]     # the journal, and the writer's lock
    assert main(["finetune", str(pool_dir / "pool.yaml"), *ARGS, *extra, "--save-as", "newm"]) == 2
    err = capsys.readouterr().err
    assert "'newm' was saved into" in err and "stopped before it could add it" in err and "added there now" in err
    assert "newm" in _listed(pool_dir) and _hidden(pool_dir) == []
    pool = ModelPool.from_yaml(pool_dir / "pool.yaml")
    assert pool.entries["newm"].adapter is adapter
    assert main(["finetune", str(pool_dir / "pool.yaml"), *ARGS, *extra, "--save-as", "newer"]) == 0


def test_a_folder_whose_entry_the_user_removed_is_not_put_back(pool_dir, capsys):
    assert main(["finetune", str(pool_dir / "pool.yaml"), *ARGS, "--save-as", "newm"]) == 0
    doc = yaml.safe_load((pool_dir / "pool.yaml").read_text())
    del doc["models"]["newm"]
    (pool_dir / "pool.yaml").write_text(yaml.safe_dump(doc))
    assert main(["finetune", str(pool_dir / "pool.yaml"), *ARGS, "--save-as", "newm"]) == 2
    assert "exists already" in capsys.readouterr().err and "newm" not in _listed(pool_dir)


def test_a_pool_file_that_cannot_be_written_takes_the_saved_folder_back(pool_dir, monkeypatch, capsys):
    def refuse(self, name, path=None):
        raise WorkspaceError("Cannot write the pool file (test).")
    monkeypatch.setattr(ModelPool, "add_to_yaml", refuse)
    before = (pool_dir / "pool.yaml").read_text()
    assert main(["finetune", str(pool_dir / "pool.yaml"), *ARGS, "--save-as", "newm"]) == 2
    assert "Cannot write the pool file" in capsys.readouterr().err
    assert not (pool_dir / "finetuned").exists()                        # neither the model nor its folder
    assert (pool_dir / "pool.yaml").read_text() == before
