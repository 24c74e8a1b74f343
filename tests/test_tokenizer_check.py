"""A model whose tokenizer is another BPE of the same size as the base's (issue 41): the pool, textdiff, a merge
without a recipe tokenizer and the merge's evaluation used to take it (the vocabulary sizes agree) and score or
merge it with the base's token ids. They refuse it, naming both tokenizers; a recipe tokenizer
(`tokenizer_source: union`) still merges it, and fine-tunes that only add or rename tokens still pass."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from forgetlab.core.errors import IncompatibleModelsError
from tests.conftest import GENERAL

OTHER_TEXT = [" ".join(reversed(line.split())).upper() for line in GENERAL] + [
    "zebra quartz jukebox vixen wyvern gazebo kayak oxygen pyjamas jackdaw", "0 1 2 3 4 5 6 7 8 9 %%% ### @@@ &&&"]


def _other_bpe(size: int, folder: Path):
    """A byte-level BPE with the base's special tokens and `size` tokens, trained on other text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(OTHER_TEXT * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    assert len(fast) == size
    fast.save_pretrained(str(folder))


@pytest.fixture(scope="module")
def other_bpe(tiny_llama, tmp_path_factory):
    """A copy of ft0 (same weights, same vocab_size) with a tokenizer of its own."""
    from transformers import AutoTokenizer

    size = len(AutoTokenizer.from_pretrained(str(tiny_llama.base)))
    folder = tmp_path_factory.mktemp("other-bpe") / "ft-other"
    shutil.copytree(tiny_llama.finetuned["ft0"], folder)
    for f in folder.glob("tokenizer*"):
        f.unlink()
    _other_bpe(size, folder)
    return folder


def test_the_pool_refuses_another_bpe_of_the_same_size_naming_both(tiny_llama, other_bpe):
    from forgetlab.core.pool import ModelPool

    with pytest.raises(IncompatibleModelsError) as err:
        ModelPool(tiny_llama.base, {"other": str(other_bpe)})
    msg = str(err.value)
    assert "another tokenizer" in msg and str(other_bpe) in msg and str(tiny_llama.base) in msg
    assert "tokenizer_source" in msg


def test_textdiff_refuses_a_folder_with_another_bpe(pool, other_bpe):
    from forgetlab.analysis.textdiff import resolve_model

    with pytest.raises(IncompatibleModelsError, match="another tokenizer"):
        resolve_model(pool, str(other_bpe))


def test_merge_refuses_it_without_a_recipe_tokenizer_and_aligns_it_with_one(tiny_llama, other_bpe, tmp_path):
    from forgetlab.merge import run

    recipe = {"merge_method": "task_arithmetic", "base_model": str(tiny_llama.base), "dtype": "float32",
              "models": [{"model": str(tiny_llama.finetuned["ft1"]), "parameters": {"weight": 0.5}},
                         {"model": str(other_bpe), "parameters": {"weight": 0.5}}]}
    with pytest.raises(IncompatibleModelsError, match="tokenizer_source"):
        run(recipe, tmp_path / "plain")
    assert not (tmp_path / "plain").exists()
    out = run({**recipe, "tokenizer_source": "union"}, tmp_path / "union").out_dir   # rows aligned token by token
    assert (out / "tokenizer.json").is_file()


def test_cli_merge_dry_run_refuses_it_with_exit_2(tiny_llama, other_bpe, tmp_path, capsys):
    from forgetlab.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"method": "task_arithmetic", "base": str(tiny_llama.base),
                                      "models": [str(other_bpe)]}))
    assert main(["merge", str(recipe), str(tmp_path / "o"), "--dry-run"]) == 2
    assert "another tokenizer" in capsys.readouterr().err


def test_the_merges_evaluation_refuses_a_folder_with_another_tokenizer(pool, other_bpe):
    from forgetlab.merge.workflow import evaluate_merge

    with pytest.raises(IncompatibleModelsError, match="another tokenizer"):
        evaluate_merge(pool, other_bpe, [])
    assert not (other_bpe / "scorecards.json").exists()


def test_added_and_renamed_special_tokens_are_the_same_tokenizer(tiny_llama, tmp_path):
    """A fine-tune that adds tokens (beyond the base's ids) or renames a special one keeps every vocabulary token's
    id and encodes text alike: nothing to refuse."""
    from transformers import AutoTokenizer

    from forgetlab.core.checkpoints import open_checkpoint
    from forgetlab.core.tokenization import tokenizer_difference

    tok = AutoTokenizer.from_pretrained(str(tiny_llama.base))
    tok.add_tokens(["<tool>", "<calc>"])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    folder = tmp_path / "added"
    shutil.copytree(tiny_llama.finetuned["ft0"], folder)
    tok.save_pretrained(str(folder))
    base = open_checkpoint(tiny_llama.base)
    assert tokenizer_difference(base, open_checkpoint(folder)) is None
    assert tokenizer_difference(base, open_checkpoint(tiny_llama.finetuned["ft1"])) is None
    (folder / "tokenizer.json").write_text("{not json")       # unreadable: left to the job that loads it
    assert tokenizer_difference(base, open_checkpoint(folder)) is None
