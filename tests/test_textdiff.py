"""The token-level text view (forgetlab.analysis.textdiff, `forgetlab textdiff`): every token scored under two
models, checked against log_softmax and kl_div computed directly, against the scorecard's general loss, and on
bad input (exit 2, nothing saved)."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from forgetlab.analysis import textdiff as T
from forgetlab.cli import main
from forgetlab.core.errors import ForgetlabError

LINES = ["The river flows through the old town and past the mill.", "Ships carried wool and salt, 42 of them!"]


@pytest.fixture()
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("FORGETLAB_HOME", str(h))
    return h


def _text(tmp_path, lines=LINES):
    p = tmp_path / "text.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_a_model_against_itself_loses_nothing_anywhere(pool):
    r = T.textdiff(pool, "ft0", against="ft0", lines=LINES)
    s = r.scored()
    assert len(s) == len(r.tokens) - len(LINES) > 10
    assert (s["rise"] == 0).all() and (s["kl"] == 0).all()
    assert (s["top1_base"] == s["top1_model"]).all()
    # the WiSE-FT point α = 0 is the base bit for bit
    r0 = T.textdiff(pool, "ft0", alpha=0.0, lines=LINES, lens=False)
    assert (r0.scored()["rise"] == 0).all() and (r0.scored()["kl"] == 0).all()
    assert r0.model == "ft0@alpha=0"


def test_logp_kl_and_top3_match_a_direct_computation(pool):
    r = T.textdiff(pool, "ft1", lines=LINES)
    tok = pool.tokenizer
    for doc, line in enumerate(LINES):
        ids = tok(line)["input_ids"]
        rows = r.tokens[r.tokens["doc"] == doc]
        assert list(rows["token_id"]) == ids and list(rows["position"]) == list(range(len(ids)))
        assert rows.iloc[0][["logp_base", "logp_model", "rise", "kl"]].isna().all()   # row 0 predicts nothing
        x = torch.tensor([ids])
        lp = {name: F.log_softmax(pool.load(name)(input_ids=x).logits[0].float(), -1).detach()
              for name in ("base", "ft1")}
        target = torch.tensor(ids[1:])
        for side, name in (("base", "base"), ("model", "ft1")):
            want = lp[name][:-1].gather(1, target[:, None]).squeeze(1).double().numpy()
            assert rows[f"logp_{side}"].iloc[1:].to_numpy() == pytest.approx(want, abs=2e-5)
        assert rows["rise"].iloc[1:].to_numpy() == pytest.approx(
            (rows["logp_base"] - rows["logp_model"]).iloc[1:].to_numpy(), abs=1e-12)
        # KL at one position, computed by torch's kl_div: KL(p_base ‖ p_model) = kl_div(log p_model, log p_base)
        i = 5
        kl = F.kl_div(lp["ft1"][i - 1], lp["base"][i - 1], log_target=True, reduction="sum")
        assert rows["kl"].iloc[i] == pytest.approx(float(kl), rel=1e-4, abs=1e-7) and float(kl) > 0
        # top-3 of each model at that position, decoded, with their probabilities
        for side, name in (("base", "base"), ("model", "ft1")):
            p, top = lp[name][i - 1].exp().topk(3)
            assert [rows[f"top{k}_{side}"].iloc[i] for k in (1, 2, 3)] == [T.shown(tok.decode([int(t)])) for t in top]
            assert [rows[f"p{k}_{side}"].iloc[i] for k in (1, 2, 3)] == pytest.approx(p.tolist(), rel=1e-4)


def test_vocabulary_chunks_do_not_change_the_scores():
    g = torch.Generator().manual_seed(0)
    lb, lm = torch.randn(6, 50, generator=g) * 3, torch.randn(6, 50, generator=g) * 3
    t = torch.randint(0, 50, (6,), generator=g)
    whole, chunked = T.token_scores(lb, lm, t, chunk=1000), T.token_scores(lb, lm, t, chunk=7)
    for k in whole:
        torch.testing.assert_close(whole[k], chunked[k], rtol=1e-5, atol=1e-6)
    want = (F.softmax(lb, -1) * (F.log_softmax(lb, -1) - F.log_softmax(lm, -1))).sum(-1)
    torch.testing.assert_close(chunked["kl"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["blocks", "documents"])
def test_heldout_mean_rise_is_the_scorecards_general_loss_rise(pool, mode):
    from forgetlab.core.evaluate import evaluate

    r = T.textdiff(pool, "ft0", max_general=3, block_size=32, general_mode=mode, lens=False)
    cards = {n: evaluate(pool.load(n), pool.tokenizer, pool.probes, tasks=[], max_general=3, block_size=32,
                         general_mode=mode) for n in ("base", "ft0")}
    s = r.summary()
    assert s["tokens"] == cards["ft0"].general_tokens
    assert s["loss_base"] == pytest.approx(cards["base"].general_loss, abs=1e-5)
    assert s["loss_model"] == pytest.approx(cards["ft0"].general_loss, abs=1e-5)
    assert r.scored()["rise"].mean() == pytest.approx(cards["ft0"].general_loss - cards["base"].general_loss,
                                                      abs=1e-5)
    assert r.source == "heldout" and len(r.docs) == 3


def test_logit_lens_ends_at_the_models_own_loss(pool):
    r = T.textdiff(pool, "ft0", max_general=2)
    lens, s = r.lens_frame(), r.summary()
    assert list(lens["depth"]) == [0, 1, 2]                                  # embeddings + 2 layers
    assert lens["loss_base"].iloc[-1] == pytest.approx(s["loss_base"], abs=1e-5)
    assert lens["loss_model"].iloc[-1] == pytest.approx(s["loss_model"], abs=1e-5)
    assert (lens["rise"] == lens["loss_model"] - lens["loss_base"]).all()
    # depth 0 is the embeddings read through the final norm and head
    m = pool.load("ft0")
    total, count = 0.0, 0
    for seq in T.heldout_sequences(pool, max_general=2):
        x = torch.tensor([seq.ids])
        with torch.no_grad():
            logits = m.lm_head(m.model.norm(m.model.embed_tokens(x)))[0, :-1]
        total += float(F.cross_entropy(logits, x[0, 1:], reduction="sum"))
        count += len(seq.ids) - 1
    assert lens["loss_model"].iloc[0] == pytest.approx(total / count, abs=1e-5)


def test_control_characters_are_shown_as_escapes():
    assert T.shown("a\rb") == "a\\rb" and T.shown("\x1c") == "\\x1c"
    assert T.shown(" line\n\t") == " line\n\t" and T.shown("é") == "é"


def test_token_classes():
    assert [T.token_class(t) for t in ["hello", " The", "é", " 42", "3", "1.5", ",", " !", "+", "�", " ", "\n", "",
                                       "a1"]] == \
        ["word", "word", "word", "number", "number", "number", "punctuation", "punctuation", "punctuation",
         "punctuation", "whitespace", "whitespace", "whitespace", "word"]
    assert T.token_class("</s>", special=True) == "special"


def test_token_classes_in_the_table_and_by_class(pool):
    tok = pool.tokenizer
    r = T.textdiff(pool, "ft0", lines=["red, blue 42!", "snow\tsalt"], lens=False)
    for _, row in r.tokens.iterrows():
        assert row["token"] == T.shown(tok.decode([row["token_id"]]))
        assert row["token_class"] == T.token_class(row["token"], row["token_id"] in tok.all_special_ids)
    classes = set(r.tokens["token_class"])
    assert {"word", "punctuation", "number"} <= classes
    by = r.by_class().set_index("token_class")
    s = r.scored()
    assert list(by.index) == list(T.CLASSES)
    assert by["tokens"].sum() == len(s)
    assert by["total_rise"].sum() == pytest.approx(s["rise"].sum())
    assert by.loc["word", "mean_rise"] == pytest.approx(s[s["token_class"] == "word"]["rise"].mean())


def test_summaries_contexts_and_positions(pool):
    r = T.textdiff(pool, "ft1", lines=LINES, lens=False)
    top = r.top_contexts("rise", 3)
    s = r.scored()
    assert list(top["rise"]) == sorted(s["rise"], reverse=True)[:3]
    row = top.iloc[0]
    seq = r.tokens[r.tokens["doc"] == row["doc"]]
    before = "".join(seq[(seq["position"] > row["position"] - 8) & (seq["position"] < row["position"])]["token"])
    assert row["context"] == before + f"[{row['token']}]"
    assert list(r.top_contexts("kl", 2)["kl"]) == sorted(s["kl"], reverse=True)[:2]
    pos = r.by_position(bins=4)
    assert pos["tokens"].sum() == len(s)
    assert (pos["position_from"] <= pos["position_to"]).all()
    words = r.top_tokens("rise", n=50, min_count=1)
    assert words["count"].sum() == len(s) or len(words) == 50
    with pytest.raises(ForgetlabError, match="rise or kl"):
        r.top_contexts("loss")


def test_a_line_longer_than_the_context_is_split_and_said_so(pool, tmp_path):
    long_line = " ".join(["river salt wool snow"] * 120)
    n = len(pool.tokenizer(long_line)["input_ids"])
    assert n > 256                                                   # the tiny models' context
    r = T.textdiff(pool, "ft0", text=_text(tmp_path, [long_line, "red"]), lens=False)
    pieces = -(-n // 256)
    assert len(r.docs) == pieces + 1 and r.docs[0] == f"line 1, piece 1/{pieces}" and r.docs[-1] == "line 2"
    assert any(f"line 1 has {n} tokens" in note and f"split into {pieces} pieces" in note for note in r.notes)
    assert r.tokens.groupby("doc")["position"].max().max() == 255


def test_merge_folder_sweep_point_and_adapter_models(pool, tiny_llama, tmp_path, home):
    from forgetlab.core.pool import ModelPool

    shutil.copytree(tiny_llama.finetuned["ft1"], home / "merges" / "my-merge")
    via_merge = T.textdiff(pool, "my-merge", lines=LINES, lens=False)
    direct = T.textdiff(pool, "ft1", lines=LINES, lens=False)
    pd.testing.assert_series_equal(via_merge.tokens["rise"], direct.tokens["rise"], atol=1e-6)
    assert via_merge.recipe["model"] == "my-merge"
    # a folder path, against another pool model
    r = T.textdiff(pool, str(tiny_llama.finetuned["ft1"]), against="ft0", lines=LINES, lens=False)
    assert r.scored()["kl"].gt(0).all()
    # the sweep point at α = 1 is the fine-tune
    one = T.textdiff(pool, "ft1", alpha=1.0, lines=LINES, lens=False)
    pd.testing.assert_series_equal(one.tokens["logp_model"], direct.tokens["logp_model"], atol=1e-5)
    half = T.textdiff(pool, "ft1", alpha=0.5, lines=LINES, lens=False)
    assert 0 < half.scored()["kl"].mean() < direct.scored()["kl"].mean()
    # a PEFT adapter in the pool is scored on the pool's base
    from tests.test_fapm_rules import _lora

    lora = _lora(tiny_llama, tmp_path / "lora")
    spec = tiny_llama.pool_yaml.read_text().replace("models:\n", f"models:\n  lora: {{adapter: {lora}}}\n")
    (tiny_llama.root / "pool-lora.yaml").write_text(spec)
    with_adapter = ModelPool.from_yaml(tiny_llama.root / "pool-lora.yaml")
    ra = T.textdiff(with_adapter, "lora", lines=LINES, lens=False)
    s = ra.scored()
    assert s["kl"].max() > 1e-7
    # the adapter changes q_proj only: the prediction from the first token alone (one key) cannot change
    assert (s[s["position"] == 1]["kl"] == 0).all() and (s[s["position"] == 1]["rise"] == 0).all()
    (tiny_llama.root / "pool-lora.yaml").unlink()


def test_save_load_and_list_round_trip(pool, home):
    r = T.textdiff(pool, "ft0", lines=LINES + ["nan", "NA null ''"], lens=True)
    path = T.ANALYSIS.save(r)
    again = T.ANALYSIS.load(path)
    pd.testing.assert_frame_equal(again.tokens, r.tokens)
    assert again.docs == r.docs and again.lens == r.lens and again.model == r.model
    assert [x.path for x in T.ANALYSIS.list(model="ft0")] == [path]
    assert T.ANALYSIS.list(model="ft1") == []
    saved = pd.read_csv(path / "results.csv")
    assert list(saved.columns) == T.COLUMNS and len(saved) == len(r.tokens)
    # the table is saved once, as CSV (its JSON lists cost ~1.7 kB a token on a long text); the former format
    # (the table inside results.json) still reads back
    assert json.loads((path / "results.json").read_text())["tokens"] == T.TABLE_FILE
    pd.testing.assert_frame_equal(T.TextDiffResult.from_dict(r.to_dict()).tokens, r.tokens)
    from forgetlab.analysis.base import ANALYSES

    a = ANALYSES.get("textdiff")
    res = a.run(pool, a.settings(model="ft0", lines=LINES, lens=False))
    assert res.summary()["tokens"] == T.textdiff(pool, "ft0", lines=LINES, lens=False).summary()["tokens"]


def test_cli_writes_the_table_prints_summaries_and_saves(tiny_llama, tmp_path, home, capsys):
    out = tmp_path / "tokens.csv"
    assert main(["textdiff", str(tiny_llama.pool_yaml), "--model", "ft0", "--split", "heldout", "--max-general", "2",
                 "--out", str(out), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "rise per token class" in text and "logit lens" in text and "contexts with the largest kl" in text
    frame = pd.read_csv(out)
    assert list(frame.columns) == T.COLUMNS
    runs = list((home / "runs").iterdir())
    assert len(runs) == 1 and json.loads((runs[0] / "recipe.json").read_text())["kind"] == "textdiff"
    assert main(["textdiff", str(tiny_llama.pool_yaml), "--model", "ft1", "--alpha", "0.5", "--text",
                 str(_text(tmp_path)), "--no-save", "--no-lens"]) == 0
    assert "ft1@alpha=0.5" in capsys.readouterr().out
    assert len(list((home / "runs").iterdir())) == 1


def _adapter_without_base(tiny_llama, tmp_path):
    from tests.test_fapm_rules import _lora

    lora = _lora(tiny_llama, tmp_path / "orphan")
    cfg = json.loads((lora / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "no-such-base")
    (lora / "adapter_config.json").write_text(json.dumps(cfg))
    return lora


@pytest.mark.parametrize("case", ["empty", "blank", "model", "alpha-range", "alpha-base", "against", "adapter",
                                  "both", "no-text-file", "out-exists"])
def test_bad_input_exits_2_and_saves_nothing(case, tiny_llama, tmp_path, home, capsys):
    out = tmp_path / "tokens.csv"
    argv = ["textdiff", str(tiny_llama.pool_yaml), "--model", "ft0", "--out", str(out)]
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    extra, message = {
        "empty": (lambda: ["--text", str(empty)], "is empty"),
        "blank": (lambda: ["--text", str(_text(tmp_path, ["", "   ", "\t"]))], "is empty"),
        "model": (lambda: ["--model", "nope"], "'nope' is not a model of the pool"),
        "alpha-range": (lambda: ["--alpha", "1.5"], "[0, 1]"),
        "alpha-base": (lambda: ["--model", "base", "--alpha", "0.5"], "WiSE-FT point"),
        "against": (lambda: ["--against", "ft9"], "--against 'ft9'"),
        "adapter": (lambda: ["--model", str(_adapter_without_base(tiny_llama, tmp_path))], "LoRA adapter"),
        "both": (lambda: ["--text", str(_text(tmp_path)), "--split", "heldout"], "not allowed with"),
        "no-text-file": (lambda: ["--text", str(tmp_path / "missing.txt")], "does not exist"),
        "out-exists": (lambda: [], "exists"),
    }[case]
    extra = extra()
    if case == "out-exists":
        out.write_text("keep me")
    with pytest.raises(SystemExit) if case == "both" else _nothing():
        assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())
    assert (out.read_text() == "keep me") if case == "out-exists" else not out.exists()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
