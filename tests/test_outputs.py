"""Nothing of the user's is ever deleted or overwritten: `--overwrite` replaces only forgetlab's own outputs,
never an input, a link, the working folder or a foreign folder; killed writes are cleaned up; two writers of
one output cannot both "succeed"; a full disk is a message; `--out FILE` never silently replaces a file."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from forgetlab.cli import main
from forgetlab.errors import OutputExistsError, ParameterError, WorkspaceError
from forgetlab.merge import run
from forgetlab.outputs import MARKER, PARTIAL, atomic_output_dir, check_name, clean_stale, write_text_file


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path below `root` (links not followed) with its bytes: a snapshot to compare before/after."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = ("link:" + os.readlink(p)).encode() if p.is_symlink() else (None if p.is_dir() else p.read_bytes())
    return out


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def recipe(tiny_llama, tmp_path) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"method": "ties", "base": str(tiny_llama.base),
                                    "models": [str(p) for p in tiny_llama.finetuned.values()],
                                    "params": {"keep": 0.5}}))
    return path


def _merge_cli(recipe, out, *extra) -> int:
    return main(["merge", str(recipe), str(out), *extra])


def test_overwrite_refuses_a_folder_forgetlab_did_not_write(recipe, tmp_path, capsys):
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "chapter1.tex").write_text("precious")
    before = tree(tmp_path)
    assert _merge_cli(recipe, thesis, "--overwrite") == 2
    assert "not written by forgetlab" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_overwrite_refuses_the_folder_holding_the_inputs(tmp_path, capsys):
    """The user's project folder holds base/, ft0/ and notes: the merge's own inputs."""
    from tests.conftest import make_tiny_pool

    proj = tmp_path / "proj"
    pool = make_tiny_pool(proj, n_finetuned=1)
    (proj / "notes.md").write_text("mine")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"method": "task_arithmetic", "base": str(pool.base),
                                      "models": [str(pool.finetuned["ft0"])]}))
    before = tree(tmp_path)
    assert _merge_cli(recipe, proj, "--overwrite") == 2
    assert tree(tmp_path) == before
    # even a folder carrying forgetlab's marker is not replaced while it holds an input
    (proj / MARKER).write_text("{}")
    before = tree(tmp_path)
    assert _merge_cli(recipe, proj, "--overwrite") == 2
    assert "an input of this job" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_overwrite_refuses_the_current_folder(recipe, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.csv").write_text("1,2")
    monkeypatch.chdir(work)
    before = tree(tmp_path)
    assert _merge_cli(recipe, ".", "--overwrite") == 2
    assert tree(tmp_path) == before
    (work / MARKER).write_text("{}")                     # not even when it looks like an output of ours
    before = tree(tmp_path)
    assert _merge_cli(recipe, ".", "--overwrite") == 2
    assert "current working folder" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_overwrite_refuses_a_link_and_keeps_its_target(recipe, tmp_path, capsys):
    real = tmp_path / "real-merge"
    assert _merge_cli(recipe, real) == 0
    link = tmp_path / "link"
    link.symlink_to(real)
    before = tree(tmp_path)
    assert _merge_cli(recipe, link, "--overwrite") == 2
    assert "symbolic link" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_overwrite_refuses_a_file(recipe, tmp_path, capsys):
    f = tmp_path / "model.bin"
    f.write_bytes(b"weights")
    assert _merge_cli(recipe, f, "--overwrite") == 2
    assert f.read_bytes() == b"weights" and sorted(p.name for p in tmp_path.iterdir()) == ["model.bin",
                                                                                          "recipe.yaml"]


def test_overwrite_replaces_forgetlab_own_merge(recipe, tmp_path):
    out = tmp_path / "merged"
    assert _merge_cli(recipe, out) == 0
    marker = json.loads((out / MARKER).read_text())
    assert marker["kind"] == "merge" and marker["written_by"] == "forgetlab"
    assert marker["files"] == sorted(p.name for p in out.iterdir() if p.name != MARKER)
    (out / "recipe.yaml").write_text("edited by hand")      # forgetlab's own file, changed: still forgetlab's
    assert _merge_cli(recipe, out, "--overwrite") == 0
    assert (out / "recipe.yaml").read_text() != "edited by hand"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged", "recipe.yaml"]   # no lock, temp or old copy


def test_overwrite_keeps_what_the_user_added_inside_an_earlier_merge(recipe, tmp_path, capsys):
    out = tmp_path / "merged"
    assert _merge_cli(recipe, out) == 0
    (out / "NOTES.md").write_text("what I saw")
    (out / "evals").mkdir()
    (out / "evals" / "mmlu.json").write_text("{}")
    before = tree(tmp_path)
    assert _merge_cli(recipe, out, "--overwrite") == 2
    err = capsys.readouterr().err
    assert "NOTES.md" in err and "evals/mmlu.json" in err and "nothing was changed" in err
    assert tree(tmp_path) == before
    (out / "evals" / "mmlu.json").unlink()                  # an empty folder of the user's is theirs too
    (out / "NOTES.md").unlink()
    assert _merge_cli(recipe, out, "--overwrite") == 2 and "evals/" in capsys.readouterr().err
    (out / "evals").rmdir()
    assert _merge_cli(recipe, out, "--overwrite") == 0


def test_scorecards_written_into_a_finished_merge_count_as_forgetlab_files(tmp_path):
    from forgetlab.outputs import foreign_files, record_file

    out = tmp_path / "m"
    with atomic_output_dir(out, kind="merge") as tmp:
        (tmp / "config.json").write_text("{}")
    (out / "scorecards.json").write_text("{}")
    assert foreign_files(out) == ["scorecards.json"]
    record_file(out, "scorecards.json")
    assert foreign_files(out) == []


def test_an_output_written_before_markers_listed_their_files_is_judged_by_forgetlab_names(tmp_path):
    from forgetlab.outputs import foreign_files

    out = tmp_path / "old-merge"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"written_by": "forgetlab", "kind": "merge"}))
    for f in ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json", "recipe.yaml",
              "tokenizer.json", "tokenizer_config.json", "scorecards.json", "generation_config.json"]:
        (out / f).write_text("x")
    assert foreign_files(out) == []
    (out / "NOTES.md").write_text("mine")
    (out / "my-ft").mkdir()
    (out / "my-ft" / "config.json").write_text("{}")
    assert foreign_files(out) == ["NOTES.md", "my-ft/config.json"]


@pytest.mark.parametrize("out", ["{pool}", "{tmp}/pool/data/general.txt", "{tmp}/pool/base/config.json",
                                 "{recipe}"])
def test_no_output_file_may_be_an_input_of_the_command(out, tmp_path, recipe, capsys):
    from tests.conftest import make_tiny_pool

    tiny = make_tiny_pool(tmp_path / "pool", n_finetuned=1)
    assert (tmp_path / "pool" / "data" / "general.txt").is_file()
    out = out.format(pool=tiny.pool_yaml, tmp=tmp_path, recipe=recipe)
    before = tree(tmp_path)
    argv = (["merge-export", str(recipe), "--out", out, "--overwrite"] if out == str(recipe)
            else ["eval", str(tiny.pool_yaml), "--out", out, "--overwrite"])
    assert main(argv) == 2
    assert "an input of this command" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_save_as_through_a_linked_pool_file_edits_the_shared_file(tmp_path):
    from tests.conftest import make_tiny_pool

    from forgetlab.pool import ModelPool
    from forgetlab.train.runs import save_finetuned

    tiny = make_tiny_pool(tmp_path / "p", n_finetuned=1)
    link = tmp_path / "p" / "mine.yaml"                     # beside the shared file: relative paths still hold
    link.symlink_to(tiny.pool_yaml.name)
    pool = ModelPool.from_yaml(link)
    save_finetuned(pool, pool.load("ft0"), "ft-new")
    assert link.is_symlink() and os.readlink(link) == tiny.pool_yaml.name
    assert yaml.safe_load(tiny.pool_yaml.read_text())["models"]["ft-new"] == "finetuned/ft-new"
    assert "ft-new" in ModelPool.from_yaml(tiny.pool_yaml).model_names

    elsewhere = tmp_path / "elsewhere"                      # a link from another folder: written absolute
    elsewhere.mkdir()
    far = elsewhere / "pool.yaml"
    far.symlink_to(tiny.pool_yaml)
    shutil_text = tiny.pool_yaml.read_text()
    pool = ModelPool.from_yaml(tiny.pool_yaml)
    pool.source = far
    pool.add("ft-far", str(tiny.finetuned["ft0"]))
    pool.add_to_yaml("ft-far")
    assert far.is_symlink()
    added = yaml.safe_load(tiny.pool_yaml.read_text())["models"]["ft-far"]
    assert Path(added).is_absolute() and Path(added) == tiny.finetuned["ft0"].resolve()
    assert tiny.pool_yaml.read_text().startswith(shutil_text.rstrip("\n").split("\n")[0])


def test_save_as_into_a_linked_pool_file_in_an_unwritable_folder_is_a_message(tmp_path, monkeypatch):
    import tempfile

    from tests.conftest import make_tiny_pool

    from forgetlab.pool import ModelPool

    tiny = make_tiny_pool(tmp_path / "p", n_finetuned=1)
    link = tmp_path / "p" / "link.yaml"
    link.symlink_to(tiny.pool_yaml)
    before = tiny.pool_yaml.read_text()
    pool = ModelPool.from_yaml(link)
    pool.add("ft-x", str(tiny.finetuned["ft0"]))

    def denied(*a, **k):                                    # what a folder the user may not write gives (not root)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(WorkspaceError, match=r"links to\).*Nothing was changed"):
        pool.add_to_yaml("ft-x")
    assert link.is_symlink() and tiny.pool_yaml.read_text() == before
