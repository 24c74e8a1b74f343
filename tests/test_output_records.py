"""Issue 41, item 1: an output forgetlab wrote records each file's size and hash (forgetlab.core.filerecords), and
`--overwrite` (or a zoo rebuild) refuses a folder in which the user changed one of those files — a model re-saved
after more training — naming it, and changes nothing."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import xxhash
import yaml

from forgetlab.cli import main
from forgetlab.core import filerecords
from forgetlab.core.errors import WorkspaceError
from forgetlab.core.outputs import MARKER, atomic_output_dir, changed_files, record_file
from tests.test_outputs import tree


@pytest.fixture
def recipe(tiny_llama, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"method": "task_arithmetic", "base": str(tiny_llama.base),
                                    "models": [str(p) for p in tiny_llama.finetuned.values()],
                                    "params": {"lam": 0.5}}))
    return path


def _merge(recipe, out, *extra) -> int:
    return main(["merge", str(recipe), str(out), *extra])


def test_a_merge_whose_model_the_user_re_saved_is_not_overwritten(recipe, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    assert _merge(recipe, out) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    for p in model.parameters():                     # "more training"
        p.data.add_(0.01)
    model.save_pretrained(out)
    before = tree(tmp_path)
    assert _merge(recipe, out, "--overwrite") == 2
    err = capsys.readouterr().err
    assert "changed since forgetlab wrote them: model.safetensors" in err and "nothing was changed" in err
    assert "config.json" not in err.split("them:")[1]     # re-written with the same bytes: still forgetlab's
    assert tree(tmp_path) == before
    (out / "model.safetensors").rename(tmp_path / "mine.safetensors")     # moved away: the rest is replaceable
    assert _merge(recipe, out, "--overwrite") == 0


def test_the_record_holds_each_files_size_and_hash_computed_while_writing(recipe, tmp_path):
    out = tmp_path / "out"
    assert _merge(recipe, out) == 0
    marker = json.loads((out / MARKER).read_text())
    assert marker["hash"] == "xxh3_128" and sorted(marker["records"]) == marker["files"]
    for rel, rec in marker["records"].items():
        data = (out / rel).read_bytes()
        assert rec["size"] == len(data) and rec["xxh3_128"] == xxhash.xxh3_128(data).hexdigest(), rel


def test_an_unchanged_output_is_checked_by_stat_alone_and_a_copy_by_its_bytes(recipe, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert _merge(recipe, out) == 0

    def no_read(*a, **k):
        raise AssertionError("an unchanged file was read")
    with monkeypatch.context() as m:
        m.setattr(filerecords, "file_digest", no_read)
        assert changed_files(out) == []
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, copy_function=shutil.copy2)     # new inodes and ctimes, the same bytes
    filerecords._known.clear()
    assert changed_files(copy) == []
    assert _merge(recipe, copy, "--overwrite") == 0
    os.utime(out / "recipe.yaml")                              # touched, not changed
    assert changed_files(out) == []
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-1] ^= 1                                              # same size, one bit
    (out / "model.safetensors").write_bytes(bytes(data))
    assert changed_files(out) == ["model.safetensors"]


def _old_marker(folder, files: bool) -> None:
    """Rewrite the marker as forgetlab wrote it before records (names only, or nothing), after every file."""
    marker = json.loads((folder / MARKER).read_text())
    old = {"written_by": "forgetlab", "kind": marker["kind"], "version": "0.1.0", "time": marker["time"]}
    if files:
        old["files"] = marker["files"]
    time.sleep(0.01)
    (folder / MARKER).write_text(json.dumps(old) + "\n")


@pytest.mark.parametrize("files", [True, False])
def test_an_old_marker_without_records_is_judged_by_time(files, recipe, tmp_path, capsys):
    out = tmp_path / "out"
    assert _merge(recipe, out) == 0
    _old_marker(out, files)
    assert changed_files(out) == []
    assert _merge(recipe, out, "--overwrite") == 0              # still replaceable as it was written
    _old_marker(out, files)
    time.sleep(0.01)
    (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes())   # re-saved, same bytes
    assert changed_files(out) == ["model.safetensors"]           # no hash to tell: refused, the safe side
    assert _merge(recipe, out, "--overwrite") == 2
    assert "model.safetensors" in capsys.readouterr().err


def test_recording_a_file_into_an_old_output_keeps_the_time_its_other_files_are_judged_by(tmp_path):
    out = tmp_path / "m"
    with atomic_output_dir(out, kind="merge") as tmp:
        (tmp / "model.safetensors").write_bytes(b"weights")
    _old_marker(out, files=True)
    time.sleep(0.01)
    (out / "model.safetensors").write_bytes(b"trained")           # the user's
    time.sleep(0.01)
    (out / "scorecards.json").write_text("{}")
    record_file(out, "scorecards.json")                           # forgetlab's, written into the finished output
    assert changed_files(out) == ["model.safetensors"]


def test_a_zoo_rebuild_keeps_a_step_folder_whose_model_the_user_changed(tmp_path):
    from forgetlab.zoo.build import _clear, _clear_leftovers

    root = tmp_path / "zoo"
    root.mkdir()
    for step in ("base", "ft-math"):
        with atomic_output_dir(root / step) as tmp:
            (tmp / "model.safetensors").write_bytes(b"weights of " + step.encode())
    manifest = {"steps": {"base": {"done": True}, "ft-math": {"done": False}}}
    (root / "ft-math" / "model.safetensors").write_bytes(b"trained further by the user")
    before = tree(root)
    for clear in (lambda: _clear(root, manifest), lambda: _clear_leftovers(root, manifest, keep={"base"})):
        with pytest.raises(WorkspaceError, match=r"ft-math holds files changed since forgetlab wrote them: "
                                                 r"model\.safetensors.*nothing was removed"):
            clear()
        assert tree(root) == before
    (root / "ft-math" / "model.safetensors").unlink()
    _clear(root, manifest)
    assert not (root / "base").exists() and not (root / "ft-math").exists()
