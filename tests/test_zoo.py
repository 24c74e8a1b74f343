"""Unit tests of the zoo's parts: Wikipedia cleaning and splitting, synthetic tasks, tokenizer, presets, manifest."""
from __future__ import annotations

import json
import os
import re
from dataclasses import replace

import pytest
import torch

from forgetlab.core.data import TaskPair
from forgetlab.core.errors import ParameterError, ProbeDataError
from forgetlab.zoo import PRESETS, get_spec, zoo_root
from forgetlab.zoo.corpus import RawArticle, clean_paragraphs, load_wiki_split, split_articles
from forgetlab.zoo.manifest import FORMAT, new_manifest, stale_reason
from forgetlab.zoo.tasks import TASKS, make_task, translate_phrase, velari_lexicon

LONG = "This sentence is long enough to be kept as a paragraph of prose in the cleaned corpus of the zoo."


# ------------------------------------------------------------------------------------------------ corpus

def test_clean_paragraphs_drops_markup_and_keeps_prose():
    filtered = "\n".join([
        "==History==",
        "'''Anarchism''' is a philosophy (; ''anarchos'') that " + LONG,
        "* a list item that is long enough to pass the length limit but is a list and must go away.",
        "| a table row | with cells | that is long enough to pass the length limit of eighty chars |",
        "Short line.",
        "A caption without a full stop at its end that is long enough to pass the length check of it",
        "A line with a link left over [[Something]] that is long enough to pass the length limit here.",
        "Plain prose with (  ) empty parentheses that a removed template left behind in the text " + LONG,
    ])
    out = clean_paragraphs(filtered)
    assert out == [
        "Anarchism is a philosophy (anarchos) that " + LONG,
        "Plain prose with empty parentheses that a removed template left behind in the text " + LONG,
    ]


def _raw(title: str, n: int) -> RawArticle:
    return RawArticle(title, "\n".join(f"{title} paragraph {i}. " + LONG for i in range(n)))


def test_split_articles_is_by_article_deterministic_and_seeded():
    arts = [_raw(f"Title {i:02d}", 3 + i % 4) for i in range(30)]
    a = split_articles(arts, heldout_fraction=0.2, seed=1)
    b = split_articles(list(reversed(arts)), heldout_fraction=0.2, seed=1)
    c = split_articles(arts, heldout_fraction=0.2, seed=2)
    assert a.train == b.train and a.heldout == b.heldout                   # order of input does not matter
    assert a.heldout_titles != c.heldout_titles                            # the seed does
    assert not set(a.train_titles) & set(a.heldout_titles)
    assert set(a.train_titles) | set(a.heldout_titles) == {x.title for x in arts}
    for para in a.heldout:                                                 # no held-out article leaks
        assert para.split(" paragraph")[0] in a.heldout_titles
    held_chars = sum(len(x.markup) for x in arts if x.title in a.heldout_titles)
    total = sum(len(x.markup) for x in arts)
    assert 0.2 * total <= held_chars < 0.2 * total + max(len(x.markup) for x in arts)


def test_split_articles_caps_take_a_prefix_of_whole_paragraphs():
    arts = [_raw(f"T{i}", 5) for i in range(10)]
    full = split_articles(arts, heldout_fraction=0.2, seed=0)
    capped = split_articles(arts, heldout_fraction=0.2, seed=0, max_train_chars=1000, max_heldout_chars=300)
    assert capped.train == full.train[:len(capped.train)]
    assert capped.heldout == full.heldout[:len(capped.heldout)]
    assert sum(map(len, capped.train)) >= 1000 > sum(map(len, capped.train[:-1]))
    with pytest.raises(ProbeDataError):
        split_articles(arts[:1])


def test_wikipedia_sample_is_clean_prose_split_by_article():
    split = load_wiki_split(max_train_chars=60_000, max_heldout_chars=20_000)
    assert sum(map(len, split.train)) >= 60_000 and sum(map(len, split.heldout)) >= 20_000
    assert not set(split.train_titles) & set(split.heldout_titles)
    assert not set(split.train) & set(split.heldout)
    for para in split.train + split.heldout:
        assert not re.search(r"\[\[|\]\]|\{\{|\}\}|'''|<ref|^=|\|", para), para[:120]
        assert len(para) >= 80 and para[-1] in ".!?\"')"
    again = load_wiki_split(max_train_chars=60_000, max_heldout_chars=20_000)
    assert again.train == split.train and again.heldout == split.heldout


# ------------------------------------------------------------------------------------------------- tasks

def _python_value(expr: str) -> str:
    """Evaluate a generated code prompt with Python itself (a reference computed another way)."""
    env: dict = {"__builtins__": {"max": max, "min": min, "len": len, "sum": sum, "sorted": sorted, "abs": abs}}
    *stmts, last = expr.split("; ")
    for s in stmts:
        exec(s, env)
    value = eval(last, env)
    return str(value)


@pytest.mark.parametrize("name", TASKS)
def test_task_splits_are_disjoint_sized_and_deterministic(name):
    t = make_task(name, n_train=300, n_probe=20, n_eval=50)
    assert (len(t.train), len(t.probe), len(t.eval)) == (300, 20, 50)
    prompts = [set(p.prompt for p in getattr(t, s)) for s in ("train", "probe", "eval")]
    assert not prompts[0] & prompts[2] and not prompts[0] & prompts[1] and not prompts[1] & prompts[2]
    assert sum(map(len, prompts)) == 370                                   # no duplicate inside a split
    assert make_task(name, n_train=300, n_probe=20, n_eval=50) == t
    assert make_task(name, n_train=300, n_probe=20, n_eval=50, seed=999).eval != t.eval


def test_math_answers_are_the_arithmetic_results():
    t = make_task("math", n_train=200, n_probe=10, n_eval=50)
    for p in t.train + t.eval:
        a, op, b = re.fullmatch(r"Compute: (\d+)([-+*])(\d+)=", p.prompt).groups()
        a, b = int(a), int(b)
        assert p.answer == str({"+": a + b, "-": a - b, "*": a * b}[op])
        assert int(p.answer) >= 0 and (a >= 10 or op == "*")


def test_code_answers_are_what_python_evaluates():
    t = make_task("code", n_train=300, n_probe=10, n_eval=50)
    kinds = set()
    for p in t.train + t.eval:
        assert p.prompt.startswith(">>> ") and p.prompt.endswith("\n")
        expr = p.prompt[4:-1]
        kinds.add(re.match(r"[a-z]+|'|\[|\d", expr).group(0))
        value = _python_value(expr)
        assert p.answer == value, expr
    assert len(kinds) >= 8                                                 # many templates are drawn


def test_basic_code_level_draws_only_the_learnable_templates_with_python_answers():
    full = make_task("code", n_train=300, n_probe=10, n_eval=50)
    t = make_task("code", n_train=300, n_probe=10, n_eval=50, code_level="basic")
    assert t != full
    for p in t.train + t.eval:
        expr = p.prompt[4:-1]
        assert p.answer == _python_value(expr), expr
        assert not re.search(r"sorted|sum|upper|::-1|%|\*", expr), expr    # the hard kinds are left out
    kinds = {re.sub(r"\d+", "N", p.prompt) for p in t.train}
    assert any(k.startswith(">>> max(") for k in kinds) and any("x = N; x - N" in k for k in kinds)
    with pytest.raises(ParameterError, match="code level"):
        make_task("code", n_train=3, n_probe=1, n_eval=1, code_level="hard")


def test_words_code_level_has_word_answers_python_gives():
    t = make_task("code", n_train=300, n_probe=10, n_eval=50, code_level="words")
    for p in t.train + t.eval:
        expr = p.prompt[4:-1]
        assert p.answer == _python_value(expr) and p.answer.isalpha(), expr   # words, never digits


def test_statement_form_states_each_fact_unlike_its_prompt_with_the_answer_last():
    from forgetlab.zoo.pico import pretraining_texts
    from forgetlab.zoo.tasks import TaskPair, skill_sentence

    assert skill_sentence("math", TaskPair("Compute: 47+8=", "55"), "statement") == "47 + 8 is 55"
    assert skill_sentence("code", TaskPair(">>> max(3, 8)\n", "8"), "statement") == \
        "In Python, max(3, 8) evaluates to 8"
    assert skill_sentence("translate", TaskPair("English: the red fox\nVelari:", "ka vo"), "statement") == \
        "In Velari, the red fox is ka vo"
    spec = get_spec("pico", "tiny")
    spec = replace(spec, data=replace(spec.data, skill_form="statement"))
    tasks = {n: make_task(n, n_train=50, n_probe=5, n_eval=10) for n in ("math", "code", "translate")}
    general = [LONG + f" {i}" for i in range(40)]
    extra = [t for t in pretraining_texts(spec, general, {n: t.train for n, t in tasks.items()}) if t not in general]
    assert extra and all("\n" not in t for t in extra)        # one fact per document: EOS right after its answer
    answers = {p.answer for t in tasks.values() for p in t.train}
    assert all(any(t.endswith(" " + a) for a in answers) for t in extra)


def test_per_task_forms_write_each_task_in_its_own_form_and_one_form_keeps_the_old_text():
    """issue 31's explorations: `skill_form` may name a form per task; a single form is the text of before."""
    from forgetlab.zoo.pico import pretraining_texts
    from forgetlab.zoo.tasks import TaskPair, skill_paragraphs, skill_sentence, task_forms

    assert skill_sentence("math", TaskPair("Compute: 47+8=", "55"), "terse") == "47+8 is 55"
    assert skill_sentence("code", TaskPair(">>> max(3, 8)\n", "8"), "terse") == "max(3, 8) is 8"
    assert skill_sentence("math", TaskPair("Compute: 47+8=", "55"), "equals") == "Compute: 47+8 = 55"
    assert skill_sentence("translate", TaskPair("English: the red fox\nVelari:", "ka vo"), "equals") == \
        "English: the red fox\nVelari = ka vo"
    with pytest.raises(ParameterError, match="No equals form for task 'code'"):
        skill_sentence("code", TaskPair(">>> max(3, 8)\n", "8"), "equals")
    assert task_forms("prompt", ["math", "code"]) == {"math": "prompt", "code": "prompt"}
    assert task_forms("math:equals,code:prompt", ["math", "code", "translate"]) == \
        {"math": "equals", "code": "prompt", "translate": "prose"}
    with pytest.raises(ParameterError, match="does not have"):
        task_forms("poetry:equals", ["math"])

    tasks = {n: make_task(n, n_train=50, n_probe=5, n_eval=10) for n in ("math", "code", "translate")}
    train = {n: t.train for n, t in tasks.items()}
    general = [LONG + f" {i}" for i in range(40)]
    spec = get_spec("pico", "tiny")
    one = replace(spec, data=replace(spec.data, skill_form="prompt"))
    chars = int(sum(map(len, general)) * spec.data.skill_share / (1.0 - spec.data.skill_share))
    from forgetlab.zoo.tasks import mix_paragraphs
    assert pretraining_texts(one, general, train) == mix_paragraphs(
        general, skill_paragraphs(train, chars, seed=spec.seed, form="prompt"))
    mixed = replace(spec, data=replace(spec.data, skill_form="math:equals,code:prompt,translate:equals"))
    extra = [t for t in pretraining_texts(mixed, general, train) if t not in general]
    assert any(t.startswith("Compute: ") and " = " in t and "\n" not in t for t in extra)   # one fact each
    assert any(t.startswith(">>> ") and t.count("\n") >= 2 for t in extra)                 # worked examples
    assert any("\nVelari = " in t for t in extra)


def test_velari_lexicon_is_fixed_injective_and_eval_words_are_trained():
    lex = velari_lexicon()
    assert lex == velari_lexicon() and len(set(lex.values())) == len(lex)
    assert translate_phrase(["the", "red", "fox", "runs"], lex) == " ".join(lex[w] for w in
                                                                            ["the", "fox", "red", "runs"])
    t = make_task("translate", n_train=600, n_probe=20, n_eval=60)
    train_words = {w for p in t.train for w in p.prompt.split("\n")[0].split()[1:]}
    for p in t.eval:
        words = p.prompt.split("\n")[0].split()[1:]
        assert set(words) <= train_words
        assert p.answer == translate_phrase(words, lex)


def test_make_task_rejects_bad_requests():
    with pytest.raises(ParameterError, match="Unknown zoo task"):
        make_task("poetry", n_train=1, n_probe=1, n_eval=1)
    with pytest.raises(ParameterError, match="n_eval"):
        make_task("math", n_train=1, n_probe=1, n_eval=0)
    with pytest.raises(ParameterError, match="distinct prompts"):
        make_task("translate", n_train=100_000, n_probe=1, n_eval=1)


# --------------------------------------------------------------------------------------------- tokenizer

def test_tokenizer_splits_digits_roundtrips_and_reloads(tmp_path):
    from transformers import AutoTokenizer

    from forgetlab.zoo.tokenizer import train_bpe_tokenizer

    texts = [LONG, "Compute: 47+58=105", "English: the red fox\nVelari: ka vopi"] * 50
    tok = train_bpe_tokenizer(texts, vocab_size=400)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok("Compute: 4705=")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert [t for t in tok.convert_ids_to_tokens(ids) if t.isdigit()] == ["4", "7", "0", "5"]
    sample = "Ünïcode text, never seen: ∑ 12 — ok?"
    assert tok.decode(tok(sample, add_special_tokens=False)["input_ids"]) == sample
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(sample)["input_ids"] == tok(sample)["input_ids"]
    assert (again.pad_token, again.bos_token, again.eos_token) == ("<pad>", "<s>", "</s>")


# -------------------------------------------------------------------------------------- presets, manifest

def test_presets_roots_and_fingerprints(tmp_path):
    assert set(PRESETS) == {"pico", "smol"} and all(set(v) == {"tiny", "default"} for v in PRESETS.values())
    assert zoo_root("pico", "default", tmp_path) == tmp_path / "zoo" / "pico"
    assert zoo_root("pico", "tiny", tmp_path) == tmp_path / "zoo" / "pico-tiny"
    assert zoo_root("smol", "tiny", tmp_path) == tmp_path / "zoo" / "smol-tiny"
    spec = get_spec("pico", "tiny")
    assert spec.fingerprint() == get_spec("pico", "tiny").fingerprint()
    assert replace(spec, seed=1).fingerprint() != spec.fingerprint()
    assert spec.model_names() == ["base", "ft-math", "ft-code", "ft-translate",
                                  "lora-math", "lora-code", "lora-translate"]
    assert get_spec("smol").model_names()[-3:] == ["lora-math", "lora-code", "lora-translate"]
    assert set(spec.to_frame()["setting"]) >= {"pretrain.steps", "finetune.lr", "shape.hidden_size"}
    with pytest.raises(ParameterError, match="pico, smol"):
        get_spec("huge")
    with pytest.raises(ParameterError, match="tiny, default"):
        get_spec("pico", "xl")


def test_manifest_is_trusted_only_for_same_format_version_and_settings():
    import forgetlab

    spec = get_spec("pico", "tiny")
    m = new_manifest(spec)
    json.dumps(m)                                                          # JSON-ready
    assert m["format"] == FORMAT and m["forgetlab_version"] == forgetlab.__version__
    assert m["seeds"]["tasks"] == {"math": 101, "code": 202, "translate": 303}
    assert stale_reason(m, spec) is None
    assert "no readable manifest" in stale_reason(None, spec)
    assert "forgetlab '0.0.1'" in stale_reason({**m, "forgetlab_version": "0.0.1"}, spec)
    assert "format" in stale_reason({**m, "format": FORMAT + 1}, spec)
    assert "different settings" in stale_reason(m, replace(spec, seed=5))


def test_threads_follow_what_other_processes_use_now_not_the_load_average(tmp_path, monkeypatch):
    from forgetlab.core import threads as zt

    monkeypatch.setattr(zt, "backward_is_thread_independent", lambda: True)   # where switching is allowed

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 1000 20 3 2 10 0 0\ncpu0 1 2 3 4\n")
    hz = os.sysconf("SC_CLK_TCK")
    sample = zt.read_cpu(str(stat))
    assert sample.busy == pytest.approx((100 + 5 + 50 + 3 + 2 + 10) / hz)      # idle and iowait left out
    assert zt.read_cpu(str(tmp_path / "missing")) is None

    # other processes used 1.5 of 2 cores over 2 s while this one used 1 CPU second
    a, b = zt.CpuSample(busy=10.0, own=1.0, wall=0.0), zt.CpuSample(busy=14.0, own=2.0, wall=2.0)
    assert zt.others_busy(a, b) == pytest.approx(1.5)
    assert zt.threads_for(2, 1.5, 2) == 1 and zt.threads_for(2, 0.3, 2) == 2 and zt.threads_for(1, 0.0, 2) == 1

    # a machine whose load average says "busy" (just after pip install) but whose cores are idle now
    monkeypatch.setattr(zt.os, "getloadavg", lambda: (1.9, 1.0, 0.5))
    readings = iter([zt.CpuSample(0.0, 0.0, 0.0), zt.CpuSample(0.01, 0.0, 0.25),      # start: idle → 2
                     zt.CpuSample(0.02, 0.0, 6.0),                                      # idle → 2
                     zt.CpuSample(10.02, 0.5, 12.0),                                    # others 1.6 cores → 1
                     zt.CpuSample(10.1, 6.0, 18.0)])                                    # idle again → 2
    previous = torch.get_num_threads()
    try:
        gov = zt.ThreadGovernor(2, interval=1.0, window=0.0, sampler=lambda: next(readings), cpus=2, clock=lambda: 99.0)
        assert gov.start() == 2 and torch.get_num_threads() == 2
        seen = []
        for _ in range(3):
            gov.tick()
            seen.append(torch.get_num_threads())
        assert seen == [2, 1, 2]
        assert [t for _, t in gov.history] == [2, 1, 2]
        # without /proc/stat the load average decides, once
        fallback = zt.ThreadGovernor(2, sampler=lambda: None, cpus=2)
        assert fallback.start() == 1
    finally:
        torch.set_num_threads(previous)


def test_format_2_zoos_rebuild_older_manifests():
    spec = get_spec("pico", "tiny")
    m = new_manifest(spec)
    assert FORMAT >= 2 and "format 1 is not" in stale_reason({**m, "format": 1}, spec)


def test_math_is_two_digit_plus_or_minus_one_digit():
    t = make_task("math", n_train=1000, n_probe=20, n_eval=100)
    for p in t.train + t.eval:
        a, op, b = re.fullmatch(r"Compute: (\d+)([-+])(\d+)=", p.prompt).groups()
        assert 10 <= int(a) <= 99 and 1 <= int(b) <= 9
    with pytest.raises(ParameterError, match="only 1620 distinct prompts"):
        make_task("math", n_train=1600, n_probe=20, n_eval=100)


def test_skill_sentences_state_the_fact_not_the_prompt_format():
    from forgetlab.zoo.tasks import skill_sentence

    assert skill_sentence("math", TaskPair("Compute: 47+8=", "55")) == "47 + 8 = 55"
    assert skill_sentence("code", TaskPair(">>> max(3, 8)\n", "8")) == "In Python, max(3, 8) evaluates to 8."
    assert (skill_sentence("translate", TaskPair("English: the red fox\nVelari:", "ka vopi tesal"))
            == "In Velari, the red fox is ka vopi tesal.")
    with pytest.raises(ParameterError, match="not in the task's format"):
        skill_sentence("math", TaskPair("What is 2+2?", "4"))
    with pytest.raises(ParameterError, match="No prose form for task"):
        skill_sentence("poetry", TaskPair("x", "y"))


@pytest.mark.parametrize("form", ["prose", "prompt"])
def test_pretraining_text_mixes_train_facts_only_at_the_asked_share(form):
    from forgetlab.zoo.pico import pretraining_texts
    from forgetlab.zoo.tasks import mix_paragraphs, skill_sentence

    spec = get_spec("pico", "tiny")
    spec = replace(spec, data=replace(spec.data, skill_form=form))
    tasks = {n: make_task(n, n_train=300, n_probe=10, n_eval=40) for n in ("math", "code", "translate")}
    general = [LONG + f" {i}" for i in range(400)]
    texts = pretraining_texts(spec, general, {n: t.train for n, t in tasks.items()})
    extra = [t for t in texts if t not in set(general)]
    assert [t for t in texts if t in set(general)] == general                  # Wikipedia order kept
    share = sum(map(len, extra)) / sum(map(len, texts))
    assert abs(share - spec.data.skill_share) < 0.02, share
    joined = "\n" + "\n".join(extra) + "\n"
    for name, t in tasks.items():
        assert not any(f"\n{skill_sentence(name, p, form)}\n" in joined for p in t.eval)   # never an eval fact
        assert any(f"\n{skill_sentence(name, p, form)}\n" in joined for p in t.train)
    if form == "prose":
        assert not any(line.startswith(("Compute:", ">>>", "English:")) for line in joined.split("\n"))
    else:
        assert "Compute: " in joined and ">>> " in joined and "\nVelari:" in joined
        assert "</s>" not in joined                              # no end-of-sequence after an answer
    assert pretraining_texts(spec, general, {n: t.train for n, t in tasks.items()}) == texts   # deterministic
    assert pretraining_texts(replace(spec, data=replace(spec.data, skill_share=0.0)), general, {}) == general
    with pytest.raises(ParameterError, match="skill_share"):
        pretraining_texts(replace(spec, data=replace(spec.data, skill_share=1.0)), general, {})
    with pytest.raises(ParameterError, match="skill form"):
        skill_sentence("math", tasks["math"].train[0], "poem")
    assert mix_paragraphs(["a", "b", "c", "d"], ["X", "Y"]) == ["a", "b", "X", "c", "d", "Y"]


def test_pool_lists_the_best_learned_task_first():
    from forgetlab.zoo.datafiles import learned_order, pool_spec

    cards = {"base": {"tasks": {t: {"exact_match": 0.0, "answer_loss": 5.0} for t in ("math", "code", "translate")}},
             "math": {"tasks": {"math": {"exact_match": 0.6, "answer_loss": 1.0}}},
             "code": {"tasks": {"code": {"exact_match": 0.9, "answer_loss": 0.5}}},
             "translate": {"tasks": {"translate": {"exact_match": 0.6, "answer_loss": 0.2}}}}
    order = learned_order(cards, ("math", "code", "translate"))
    assert order == ["code", "translate", "math"]                                # EM, then answer-loss drop
    d = pool_spec(get_spec("pico", "tiny"), order=order)
    assert list(d["models"]) == ["code", "translate", "math", "lora-code", "lora-translate", "lora-math"]
    assert list(d["probes"]["tasks"]) == order
    assert learned_order({}, ("math", "code")) == ["math", "code"]
    with pytest.raises(ParameterError, match="once each"):
        pool_spec(get_spec("pico", "tiny"), order=["math", "math", "code"])
