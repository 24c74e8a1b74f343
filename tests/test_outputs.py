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
from forgetlab.core.errors import OutputExistsError, ParameterError, WorkspaceError
from forgetlab.core.outputs import MARKER, PARTIAL, atomic_output_dir, check_name, clean_stale, write_text_file


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
    assert _merge_cli(recipe, out, "--overwrite") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged", "recipe.yaml"]   # no lock, temp or old copy
    # issue 41: a file of forgetlab's that the user changed is theirs now (it was replaced before)
    (out / "recipe.yaml").write_text("edited by hand")
    assert _merge_cli(recipe, out, "--overwrite") == 2
    assert (out / "recipe.yaml").read_text() == "edited by hand"


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
    from forgetlab.core.outputs import foreign_files, record_file

    out = tmp_path / "m"
    with atomic_output_dir(out, kind="merge") as tmp:
        (tmp / "config.json").write_text("{}")
    (out / "scorecards.json").write_text("{}")
    assert foreign_files(out) == ["scorecards.json"]
    record_file(out, "scorecards.json")
    assert foreign_files(out) == []


def test_an_output_written_before_markers_listed_their_files_is_judged_by_forgetlab_names(tmp_path):
    from forgetlab.core.outputs import foreign_files

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

    from forgetlab.core.pool import ModelPool
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

    from forgetlab.core.pool import ModelPool

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



def test_stale_temporaries_of_a_killed_merge_are_removed_and_an_interrupted_swap_is_undone(recipe, tmp_path):
    pid = dead_pid()
    stale = tmp_path / f".merged.tmp-{pid}-x1"           # what SIGKILL leaves behind
    stale.mkdir()
    (stale / PARTIAL).write_text("")
    (stale / "model.safetensors").write_bytes(b"0" * 1000)
    foreign = tmp_path / f".notes.tmp-{pid}-x2"          # same shape of name, but not marked as ours
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    unmarked = tmp_path / f".merged.tmp-{pid}-x5"        # killed between creating it and marking it: empty
    unmarked.mkdir()
    alive = tmp_path / f".other.tmp-{os.getpid()}-x3"    # a job still running
    alive.mkdir()
    (alive / PARTIAL).write_text("")
    prev = tmp_path / "prev"                             # killed between moving the old output away and renaming
    assert _merge_cli(recipe, prev) == 0
    prev.rename(tmp_path / f".prev.old-{pid}-x4")
    assert _merge_cli(recipe, tmp_path / "merged") == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([foreign.name, alive.name, "merged", "prev", "recipe.yaml"])
    assert (tmp_path / "prev" / "recipe.yaml").is_file()


def test_sigterm_during_a_merge_leaves_nothing(recipe, tmp_path):
    """SIGTERM is handled like Ctrl-C: the temporary folder is removed and the exit status says so."""
    out = tmp_path / "merged"
    code = (
        "import sys, time\n"
        "import forgetlab.core.checkpoints.writing as c\n"
        "orig = c._ShardStream.write\n"
        "def slow(self, n, t):\n"
        "    time.sleep(0.3)\n"
        "    return orig(self, n, t)\n"
        "c._ShardStream.write = slow\n"
        "from forgetlab.cli import main\n"
        f"sys.exit(main(['merge', {str(recipe)!r}, {str(out)!r}]))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob(".merged.tmp-*/*.safetensors")):
        time.sleep(0.05)
    assert list(tmp_path.glob(".merged.tmp-*")), "the merge never started writing"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "nothing half-written was kept" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]


def test_two_writers_of_one_output_cannot_both_succeed(tmp_path):
    out = tmp_path / "out"
    with atomic_output_dir(out) as tmp:
        (tmp / "a").write_text("first")
        with pytest.raises(OutputExistsError, match="Another forgetlab job is writing"):
            with atomic_output_dir(out, overwrite=True):
                pass
    assert (out / "a").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_users_file_named_like_the_lock_is_kept_and_a_link_there_refused(tmp_path):
    """Found by bench/hostile_inputs.py: the writer's lock `.<name>.lock` was removed after the job even when it
    was the user's own file (a link there was followed when the lock was opened)."""
    mine = tmp_path / ".out.lock"
    mine.write_text("my notes\n")
    with atomic_output_dir(tmp_path / "out") as tmp:
        (tmp / "a").write_text("1")
    assert mine.read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]
    # forgetlab's own lock files (also an empty one left by a killed job) go away afterwards
    (tmp_path / ".out2.lock").write_text("")
    with atomic_output_dir(tmp_path / "out2") as tmp:
        (tmp / "a").write_text("1")
    with atomic_output_dir(tmp_path / "out3") as tmp:
        (tmp / "a").write_text("1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out", "out2", "out3"]
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".out4.lock").symlink_to(tmp_path / "elsewhere" / "target")
    with pytest.raises(WorkspaceError, match="in the way of forgetlab's lock file"):
        with atomic_output_dir(tmp_path / "out4"):
            pass
    assert list((tmp_path / "elsewhere").iterdir()) == [] and not (tmp_path / "out4").exists()


def test_two_overwrite_merges_at_once_one_is_refused(recipe, tmp_path):
    """Two processes merge into one output with --overwrite: one result, and the other process says so."""
    out = tmp_path / "merged"
    assert _merge_cli(recipe, out) == 0
    code = (
        "import sys, time\n"
        "import forgetlab.core.checkpoints.writing as c\n"
        "orig = c._ShardStream.write\n"
        "def slow(self, n, t):\n"
        "    time.sleep(0.1)\n"
        "    return orig(self, n, t)\n"
        "c._ShardStream.write = slow\n"
        "from forgetlab.cli import main\n"
        f"sys.exit(main(['merge', {str(recipe)!r}, {str(out)!r}, '--overwrite']))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(r for r, _ in results)
    assert codes == [0, 2], results
    assert any("Another forgetlab job is writing" in err for _, err in results)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged", "recipe.yaml"]


def test_disk_full_is_a_message_and_the_existing_output_is_untouched(recipe, tmp_path, monkeypatch, capsys):
    import forgetlab.core.checkpoints.writing as ck

    out = tmp_path / "merged"
    assert _merge_cli(recipe, out) == 0
    before = tree(tmp_path)
    orig = ck._ShardStream.write
    state = {"n": 0}

    def full(self, name, tensor):
        state["n"] += 1
        if state["n"] == 3:
            raise OSError(28, "No space left on device")
        return orig(self, name, tensor)

    monkeypatch.setattr(ck._ShardStream, "write", full)
    assert _merge_cli(recipe, out, "--overwrite") == 2
    err = capsys.readouterr().err
    assert "No space left" in err and "existing output is untouched" in err and "Traceback" not in err
    assert tree(tmp_path) == before


def test_disk_full_on_a_real_small_filesystem(recipe, small_disk, capsys):
    """A 64 KiB tmpfs, smaller than the merge."""
    mnt = small_disk("64k")
    assert _merge_cli(recipe, mnt / "merged") == 2
    err = capsys.readouterr().err
    assert "No space left" in err and "Traceback" not in err
    assert list(mnt.iterdir()) == []


@pytest.mark.parametrize("name", ["abc\n", "a\x01b", "a\x00b", "x" * 300, "../up", ".hidden", "", "a/b"])
def test_names_with_control_characters_or_paths_are_refused(name):
    with pytest.raises(ParameterError):
        check_name(name)


@pytest.mark.parametrize("name", ["abc\n", "a\x01b", "a\x00b", "x" * 300, "../up"])
def test_merge_names_are_checked(name):
    from forgetlab.merge.workflow import check_merge_name

    with pytest.raises(ParameterError):
        check_merge_name(name)


def test_write_text_file_refuses_existing_folders_and_missing_parents(tmp_path):
    f = tmp_path / "a.csv"
    write_text_file(f, "x\n")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        write_text_file(f, "y\n")
    assert f.read_text() == "x\n"
    write_text_file(f, "y\n", overwrite=True)
    assert f.read_text() == "y\n"
    with pytest.raises(OutputExistsError, match="is a folder"):
        write_text_file(tmp_path, "z")
    with pytest.raises(WorkspaceError, match="does not exist"):
        write_text_file(tmp_path / "nope" / "a.csv", "z")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv"]


def test_clean_stale_ignores_entries_without_our_marker(tmp_path):
    d = tmp_path / f".x.tmp-{dead_pid()}-1"
    d.mkdir()
    (d / "thesis.tex").write_text("mine")
    assert clean_stale(tmp_path) == [] and (d / "thesis.tex").exists()


def test_saving_into_the_pool_keeps_the_users_comments_and_keys(tmp_path):
    from tests.conftest import make_tiny_pool

    from forgetlab.core.pool import ModelPool
    from forgetlab.train.runs import save_finetuned

    tiny = make_tiny_pool(tmp_path / "p", n_finetuned=1)
    text = tiny.pool_yaml.read_text().replace("models:\n", "models:   # fine-tunes of my lab\n", 1)
    tiny.pool_yaml.write_text("# my pool, hand-written\n" + text + "owner: ada   # not a forgetlab key\n")
    pool = ModelPool.from_yaml(tiny.pool_yaml)
    model = pool.load("ft0")
    save_finetuned(pool, model, "ft-new")
    out = tiny.pool_yaml.read_text()
    assert out.startswith("# my pool, hand-written\n")
    assert "models:   # fine-tunes of my lab" in out and "owner: ada   # not a forgetlab key" in out
    assert yaml.safe_load(out)["models"]["ft-new"] == "finetuned/ft-new"
    assert "ft-new" in ModelPool.from_yaml(tiny.pool_yaml).model_names
    with pytest.raises(ParameterError):
        save_finetuned(pool, model, "x" * 300)
    with pytest.raises(ParameterError):
        save_finetuned(pool, model, "bad\nname")
    assert sorted(p.name for p in (tmp_path / "p" / "finetuned").iterdir()) == ["ft-new"]


@pytest.mark.parametrize("argv,message", [
    (["sweep", "alpha", "{pool}", "--model", "ft0", "--batch-size", "0"], "--batch-size: must be at least 1"),
    (["sweep", "alpha", "{pool}", "--model", "ft0", "--device", "tpu9"], "Unknown device 'tpu9'"),
    (["merge", "{recipe}", "{tmp}/m", "--device", "tpu9"], "Unknown device 'tpu9'"),
    (["eval", "{pool}", "--max-general", "0"], "--max-general: must be at least 1"),
    (["eval", "{pool}", "--max-task", "-3"], "--max-task: must be at least 1"),
    (["taskvec", "{pool}", "--out", "{tmp}"], "is a folder"),
    (["taskvec", "{pool}", "--out", "{tmp}/missing/norms.csv"], "does not exist"),
    (["eval", "{pool}", "--out", "{tmp}/existing.csv"], "exists already"),
    (["merge-export", "{recipe}", "--out", "{tmp}/existing.csv"], "exists already"),
    (["merge-export", "{recipe}", "--out", "{tmp}"], "is a folder"),
    (["eval", "{pool}", "--out", ""], "--out is empty"),
])
def test_bad_cli_arguments_exit_2_with_a_message_and_write_nothing(argv, message, tiny_llama, recipe, tmp_path,
                                                                    capsys):
    (tmp_path / "existing.csv").write_text("mine")
    argv = [a.format(pool=tiny_llama.pool_yaml, recipe=recipe, tmp=tmp_path) for a in argv]
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as exit_info:   # argparse's own errors exit 2 …
        raise SystemExit(main(argv))               # … and so do forgetlab's
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert tree(tmp_path) == before


def test_taskvec_cosine_table_sits_beside_the_output_file(tiny_llama, tmp_path):
    folder = tmp_path / "out" / "dir.v2"
    folder.mkdir(parents=True)
    assert main(["taskvec", str(tiny_llama.pool_yaml), "--out", str(folder / "norms")]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["norms", "norms.cosine.csv"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["dir.v2"]
    assert main(["taskvec", str(tiny_llama.pool_yaml), "--out", str(folder / "n.csv")]) == 0
    assert (folder / "n.cosine.csv").is_file()


BOMB = """a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize("kind", ["recipe", "mergekit", "pool"])
def test_yaml_alias_bombs_are_refused_at_once(kind, tmp_path, capsys):
    path = tmp_path / f"{kind}.yaml"
    if kind == "recipe":
        path.write_text(BOMB + "method: linear\nbase: *i\nmodels: [x]\n")
        argv = ["merge", str(path), str(tmp_path / "out")]
    elif kind == "mergekit":
        path.write_text(BOMB + "merge_method: linear\nbase_model: *i\nmodels: [{model: x}]\n")
        argv = ["merge-export", str(path)]
    else:
        path.write_text(BOMB + "base: *i\nmodels: {}\n")
        argv = ["taskvec", str(path)]
    t0 = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert "aliases" in err and "refuses" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_ordinary_anchors_and_aliases_still_work(tmp_path):
    from forgetlab.core.yamlio import safe_load

    d = safe_load("p: &p {keep: 0.2}\nx: *p\ny: [*p, *p]\n")
    assert d["x"] == {"keep": 0.2} and d["y"] == [{"keep": 0.2}] * 2


def test_a_full_disk_while_saving_a_run_is_a_message_and_leaves_nothing(tmp_path, monkeypatch):
    from forgetlab.core import workspace

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(WorkspaceError, match="No space left"):
        workspace.save_run("sweep", {"a": 1}, {"points": []}, home_path=tmp_path)
    monkeypatch.undo()
    assert not (tmp_path / "runs").exists()  # made for this save, removed with it


def test_a_run_saved_onto_a_real_full_disk_is_a_message_and_leaves_no_folder(small_disk):
    """On a full tmpfs the folders still get made (they need no data blocks) and the lock file's first line
    cannot be flushed: the save must still be a WorkspaceError, and the workspace folders it created go again."""
    from forgetlab.core import workspace

    mnt = small_disk("64k")
    with pytest.raises(OSError):
        with open(mnt / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
    before = tree(mnt)
    with pytest.raises(WorkspaceError, match="No space left"):
        workspace.save_run("sweep", {"a": 1}, {"points": [1, 2, 3]}, home_path=mnt / "home")
    assert tree(mnt) == before


def test_a_config_that_disagrees_with_its_weights_is_a_message(tiny_llama, tmp_path, monkeypatch):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama.finetuned["ft0"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2
    (bad / "config.json").write_text(json.dumps(cfg))
    from forgetlab.core.checkpoints import load_model
    from forgetlab.core.errors import IncompatibleModelsError

    import transformers

    # refused before transformers loads it (it would print its own mismatch report first, on the CLI too)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("transformers was asked to load the model"))
    with pytest.raises(IncompatibleModelsError, match=r"disagrees with its weights \(model\.layers\.0\.mlp"):
        load_model(bad, device="cpu")


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(modles=d.pop("models")), "did you mean 'models'"),
    (lambda d: d["probes"].update(template="chatml"), "probes.template"),
    (lambda d: d.update(base=["a", "b"]), "`base:`"),
])
def test_pool_files_with_a_misspelt_key_or_a_bad_template_are_refused(edit, message, tiny_llama, tmp_path):
    import shutil

    from forgetlab.core.errors import ForgetlabError
    from forgetlab.core.pool import ModelPool

    root = tmp_path / "p"
    shutil.copytree(tiny_llama.root, root)
    d = yaml.safe_load((root / "pool.yaml").read_text())
    edit(d)
    d["my_notes"] = "kept, not an error"
    (root / "pool.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(ForgetlabError, match=message):
        ModelPool.from_yaml(root / "pool.yaml")


def test_pool_files_keep_working_with_keys_of_the_users_own(tiny_llama, tmp_path):
    import shutil

    from forgetlab.core.pool import ModelPool

    root = tmp_path / "p"
    shutil.copytree(tiny_llama.root, root)
    (root / "pool.yaml").write_text((root / "pool.yaml").read_text() + "owner: ada\nnotes: [a, b]\n")
    assert ModelPool.from_yaml(root / "pool.yaml").model_names == ["ft0", "ft1"]


@pytest.mark.parametrize("name", ["x" * 300, "bad\nname", "a\x00b", "base", "ft0", ""])
def test_finetune_save_as_refuses_a_bad_name_before_training(name, tiny_llama, tmp_path, capsys):
    import shutil

    root = tmp_path / "p"
    shutil.copytree(tiny_llama.root, root)
    before = tree(root)
    assert main(["finetune", str(root / "pool.yaml"), "--task", "math", "--steps", "50", "--save-as", name]) == 2
    err = capsys.readouterr().err
    assert "name" in err and "Traceback" not in err
    assert tree(root) == before
