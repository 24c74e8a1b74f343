"""Synthetic fine-tuning tasks of the demo zoo: prompt/answer pairs with seeded train/probe/eval splits.

Three tasks, each a deterministic function of its seed:

- `math`: a two-digit number plus or minus a one-digit number (`Compute: 47+8=` → `55`).
- `code`: evaluate a small Python expression (`>>> max(3, 8)` → `8`; `>>> 'cat'[::-1]` → `tac`; `>>> x = 4;
  x * 3` → `12`), drawn from a dozen expression templates.
- `translate`: translate a short English phrase word by word into Velari, an invented language with a fixed
  seeded lexicon and its own word order (adjective after the noun, verb last): `English: the red fox
  runs` → `ka vopi tesal domu`.

Splits are disjoint by prompt: the candidate pool is generated, deduplicated, shuffled with the task seed and
cut into eval, probe and train in that order, so the eval prompts are never trained on. For `translate` the
eval phrases are new combinations of words that the train split does contain (the lexicon is arbitrary, so a
word never seen in training could not be translated by any model).
"""
from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from forgetlab.core.data import TaskPair
from forgetlab.core.errors import ParameterError

TASKS = ("math", "code", "translate")
TASK_SEEDS = {"math": 101, "code": 202, "translate": 303}


@dataclass
class TaskSplits:
    """One task's pairs: `train` (fine-tuning), `probe` (analyses, features) and `eval` (held-out scoring)."""

    name: str
    train: list[TaskPair]
    probe: list[TaskPair]
    eval: list[TaskPair]

    def to_frame(self) -> pd.DataFrame:
        """One row per pair: split, prompt, answer."""
        rows = [{"split": split, "prompt": p.prompt, "answer": p.answer}
                for split in ("train", "probe", "eval") for p in getattr(self, split)]
        return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ math

def math_pair(rng: random.Random) -> TaskPair:
    """One arithmetic problem: a two-digit number plus or minus a one-digit number (`Compute: 47+8=` → `55`).

    The space (90 × 9 × 2 = 1620 prompts) is small enough that every ones-digit sum and carry is seen in
    training, so a small model can generalise to the held-out eval prompts.
    """
    op = rng.choice("+-")
    a, b = rng.randint(10, 99), rng.randint(1, 9)
    value = a + b if op == "+" else a - b
    return TaskPair(prompt=f"Compute: {a}{op}{b}=", answer=str(value))


# ------------------------------------------------------------------------------------------------ code

_WORDS = ("cat", "dog", "sun", "map", "key", "box", "tree", "lamp", "rock", "fish", "bird", "moon",
          "star", "code", "data", "list", "loop", "node")


def _small_list(rng: random.Random, lo: int = 2, hi: int = 5) -> list[int]:
    return [rng.randint(0, 9) for _ in range(rng.randint(lo, hi))]


def _fmt(xs: list[int]) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


# the `words` level's values: short English words that are neither Velari nor the translate task's English
_CODE_WORDS = ("apple", "bread", "chair", "cloud", "drum", "egg", "frog", "glass", "hat", "ink", "jam", "kite",
               "lamp", "milk", "nest", "owl", "pen", "rope", "salt", "tent", "vase", "wool", "yarn", "zinc")


def _code_templates(level: str = "full") -> list[Callable[[random.Random], tuple[str, str]]]:
    """The code task's expression templates. `full`: twelve kinds, string and list manipulation included;
    `basic`: the seven a ~1 M-parameter model learns from a little pretraining text (max, min, len, indexing,
    abs, a conditional, one-digit + and −): the pico zoo's, so that its fine-tunes reach a real exact match."""
    def max_(r):
        a, b = r.randint(0, 99), r.randint(0, 99)
        return f"max({a}, {b})", str(max(a, b))

    def min_(r):
        a, b = r.randint(0, 99), r.randint(0, 99)
        return f"min({a}, {b})", str(min(a, b))

    def len_(r):
        xs = _small_list(r, 1, 7)
        return f"len({_fmt(xs)})", str(len(xs))

    def sum_(r):
        xs = _small_list(r, 2, 4)
        return f"sum({_fmt(xs)})", str(sum(xs))

    def sorted_(r):
        xs = _small_list(r, 3, 4)
        return f"sorted({_fmt(xs)})", _fmt(sorted(xs))

    def index_(r):
        xs = _small_list(r, 3, 5)
        i = r.randrange(len(xs))
        return f"{_fmt(xs)}[{i}]", str(xs[i])

    def upper_(r):
        w = r.choice(_WORDS)
        return f"'{w}'.upper()", w.upper()

    def reverse_(r):
        w = r.choice(_WORDS)
        return f"'{w}'[::-1]", w[::-1]

    def assign_(r):
        a, b = r.randint(1, 9), r.randint(1, 9)
        op = r.choice("+*-" if level == "full" else "+-")
        value = {"+": a + b, "*": a * b, "-": a - b}[op]
        return f"x = {a}; x {op} {b}", str(value)

    def cond_(r):
        a, b = r.randint(0, 20), r.randint(0, 20)
        return f"{a} if {a} > {b} else {b}", str(a if a > b else b)

    def abs_(r):
        a = r.randint(1, 99)
        return f"abs(-{a})", str(a)

    def mod_(r):
        a, b = r.randint(10, 99), r.randint(2, 9)
        return f"{a} % {b}", str(a % b)

    def max_word(r):
        a, b = r.sample(_CODE_WORDS, 2)
        return f"max('{a}', '{b}')", max(a, b)

    def min_word(r):
        a, b = r.sample(_CODE_WORDS, 2)
        return f"min('{a}', '{b}')", min(a, b)

    def index_word(r):
        xs = r.sample(_CODE_WORDS, r.randint(3, 4))
        i = r.randrange(len(xs))
        return "[" + ", ".join(f"'{w}'" for w in xs) + f"][{i}]", xs[i]

    def cond_word(r):
        a, b = r.sample(_CODE_WORDS, 2)
        x, y = r.randint(0, 20), r.randint(0, 20)
        return f"'{a}' if {x} > {y} else '{b}'", a if x > y else b

    if level == "basic":
        return [max_, min_, len_, index_, assign_, cond_, abs_]
    if level == "words":
        return [max_word, min_word, index_word, cond_word]
    return [max_, min_, len_, sum_, sorted_, index_, upper_, reverse_, assign_, cond_, abs_, mod_]


CODE_LEVELS = ("full", "basic", "words")
_CODE_TEMPLATES = {level: _code_templates(level) for level in CODE_LEVELS}


def code_pair(rng: random.Random, level: str = "full") -> TaskPair:
    """One small Python expression of the `level`'s templates (`_code_templates`) and the value Python prints
    for it (checked by evaluating it)."""
    if level not in _CODE_TEMPLATES:
        raise ParameterError(f"Unknown code level {level!r}; choose one of: {', '.join(CODE_LEVELS)}.")
    expr, value = rng.choice(_CODE_TEMPLATES[level])(rng)
    return TaskPair(prompt=f">>> {expr}\n", answer=value)


# ------------------------------------------------------------------------------------------- translate

_NOUNS = ("fox", "house", "river", "child", "bird", "king", "stone", "tree", "horse", "ship", "woman", "dog",
          "city", "flower", "mountain", "teacher")
_ADJECTIVES = ("red", "old", "small", "happy", "dark", "tall", "green", "quiet", "cold", "bright")
_VERBS = ("runs", "sleeps", "sings", "falls", "waits", "grows", "shines", "swims", "speaks", "burns")
_ARTICLE = "the"
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "sh")
_VOWELS = ("a", "e", "i", "o", "u")
LEXICON_SEED = 7


def velari_lexicon(seed: int = LEXICON_SEED) -> dict[str, str]:
    """The fixed English → Velari lexicon: each word gets a distinct 2–3 syllable CV word (seeded)."""
    return dict(_lexicon(int(seed)))


@functools.lru_cache(maxsize=4)
def _lexicon(seed: int) -> tuple[tuple[str, str], ...]:
    rng = random.Random(seed)
    english = [_ARTICLE, *_NOUNS, *_ADJECTIVES, *_VERBS]
    used: set[str] = set()
    lexicon: dict[str, str] = {}
    for word in english:
        while True:
            n_syll = 1 if word == _ARTICLE else rng.choice((2, 2, 3))
            w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n_syll))
            if word != _ARTICLE and rng.random() < 0.4:
                w += rng.choice(("l", "n", "s", "r"))
            if w not in used:
                used.add(w)
                lexicon[word] = w
                break
    return tuple(lexicon.items())


def translate_phrase(words: list[str], lexicon: dict[str, str]) -> str:
    """Velari for `the <adj>? <noun> <verb>?`: article, noun, adjective, verb — each word looked up."""
    adj = [w for w in words if w in _ADJECTIVES]
    noun = [w for w in words if w in _NOUNS]
    verb = [w for w in words if w in _VERBS]
    order = [_ARTICLE, *noun, *adj, *verb]
    return " ".join(lexicon[w] for w in order)


def translate_pair(rng: random.Random, lexicon: dict[str, str] | None = None) -> TaskPair:
    """One English phrase (`the [adj] noun [verb]`) and its Velari translation."""
    lexicon = lexicon or dict(_lexicon(LEXICON_SEED))
    noun = rng.choice(_NOUNS)
    shape = rng.choice(("an", "nv", "anv", "anv"))
    words = [_ARTICLE]
    if "a" in shape:
        words.append(rng.choice(_ADJECTIVES))
    words.append(noun)
    if "v" in shape:
        words.append(rng.choice(_VERBS))
    return TaskPair(prompt=f"English: {' '.join(words)}\nVelari:", answer=translate_phrase(words, lexicon))


# ------------------------------------------------------------------------------------ pretraining text

# the parts of each task's prompt that the general-text forms below write again
_PROMPT_PARTS = {
    "math": re.compile(r"^Compute: (\d+)([+\-*])(\d+)=$"),
    "code": re.compile(r"^>>> (.*)\n$", re.S),
    "translate": re.compile(r"^English: (.*)\nVelari:$"),
}

_FORM_TEMPLATES = {
    # "prose": sentences gathered into paragraphs (`47 + 8 = 55`)
    "prose": {"math": "{0} {1} {2} = {answer}", "code": "In Python, {0} evaluates to {answer}.",
              "translate": "In Velari, {0} is {answer}."},
    # "statement": each fact on its own, worded unlike the task's prompt and ending with the answer, as a
    # document of its own (so the pretraining text puts EOS right after every answer): the base learns the
    # content and when to stop, but not the prompt format, which each fine-tune then teaches for its own task
    "statement": {"math": "{0} {1} {2} is {answer}", "code": "In Python, {0} evaluates to {answer}",
                  "translate": "In Velari, {0} is {answer}"},
    # "terse": as "statement", but with the prompt's own expression and a plain link word (`47+8 is 55`,
    # `max(3, 8) is 8`), so the fact differs from the prompt only in its frame (`Compute: …=`, `>>> …\n`)
    "terse": {"math": "{0}{1}{2} is {answer}", "code": "{0} is {answer}", "translate": "In Velari, {0} is {answer}"},
    # "equals": the prompt's own frame, its last mark written ` = ` (`Compute: 47+8 = 55`,
    # `English: the red fox\nVelari = ka vopi tesal`), one fact per document
    "equals": {"math": "Compute: {0}{1}{2} = {answer}", "translate": "English: {0}\nVelari = {answer}"},
}

SKILL_FORMS = ("prose", "prompt", "statement", "terse", "equals")
DOCUMENT_FORMS = ("statement", "terse", "equals")  # one fact per document: EOS right after each answer


def task_forms(form: str, tasks) -> dict[str, str]:
    """Each task's skill form from a `DataSpec.skill_form`: one form for every task (`"prompt"`) or one per task
    (`"math:equals,code:prompt,translate:equals"`; tasks not named take `prose`)."""
    if ":" not in form:
        return {t: form for t in tasks}
    named = {}
    for part in form.split(","):
        task, _, f = part.partition(":")
        named[task.strip()] = f.strip()
    unknown = set(named) - set(tasks)
    if unknown:
        raise ParameterError(f"skill_form names tasks {sorted(unknown)} that the zoo does not have ({', '.join(tasks)}).")
    return {t: named.get(t, "prose") for t in tasks}


def skill_sentence(task: str, pair: TaskPair, form: str = "prose") -> str:
    """The fact a task pair states, written the way general text would state it — not in the prompt format.

    `Compute: 47+8=` / `55` → `47 + 8 = 55`; `>>> max(3, 8)` / `8` → `In Python, max(3, 8) evaluates to 8.`;
    `English: the red fox\nVelari:` / `ka vopi tesal` → `In Velari, the red fox is ka vopi tesal.` A pretraining
    corpus that holds such sentences gives the base the skill but not the task's format, as real corpora do.
    `form="prompt"` writes the pair in the task's own format instead (`Compute: 47+8=55`), as a worked example
    inside a document: no end-of-sequence token follows the answer, so the base still does not stop after it.
    """
    if form not in SKILL_FORMS:
        raise ParameterError(f"Unknown skill form {form!r}; choose one of: {', '.join(SKILL_FORMS)}.")
    if form == "prompt":
        return f"{pair.prompt}{pair.answer}"
    templates = _FORM_TEMPLATES[form]
    if task not in templates:
        raise ParameterError(f"No {form} form for task {task!r}. Choose one of: {', '.join(templates)}.")
    m = _PROMPT_PARTS[task].match(pair.prompt)
    if m is None:
        raise ParameterError(f"The {task} prompt {pair.prompt!r} is not in the task's format.")
    return templates[task].format(*m.groups(), answer=pair.answer)


def skill_paragraphs(tasks: dict[str, list[TaskPair]], chars: int, *, seed: int = 0,
                     per_paragraph: int = 8, form: str = "prose") -> list[str]:
    """Paragraphs of `skill_sentence`s (one task per paragraph, `per_paragraph` sentences, newline-separated)
    until they hold about `chars` characters, cycling through each task's pairs in seeded random orders.

    Only the pairs given are used: pass train pairs, never eval ones. Tasks alternate paragraph by paragraph.
    """
    if chars <= 0 or not tasks:
        return []
    rng = random.Random(seed)
    pools = {t: [skill_sentence(t, p, form) for p in pairs] for t, pairs in tasks.items() if pairs}
    orders: dict[str, list[str]] = {t: [] for t in pools}
    out: list[str] = []
    total = 0
    while total < chars and pools:
        for t, sentences in pools.items():
            if len(orders[t]) < per_paragraph:
                fresh = list(sentences)
                rng.shuffle(fresh)
                orders[t].extend(fresh)
            para = "\n".join(orders[t][:per_paragraph])
            del orders[t][:per_paragraph]
            out.append(para)
            total += len(para)
            if total >= chars:
                break
    return out


def mix_paragraphs(general: list[str], extra: list[str]) -> list[str]:
    """`general` with `extra` spread evenly through it (deterministic; order within each kept)."""
    if not extra:
        return list(general)
    out: list[str] = []
    n, k = len(general), len(extra)
    j = 0
    for i, para in enumerate(general):
        out.append(para)
        while j < k and (j + 1) * n <= (i + 1) * k:
            out.append(extra[j])
            j += 1
    out.extend(extra[j:])
    return out


# --------------------------------------------------------------------------------------------- splits

_GENERATORS: dict[str, Callable[[random.Random], TaskPair]] = {
    "math": math_pair,
    "code": code_pair,
    "translate": translate_pair,
}


def make_task(name: str, *, n_train: int, n_probe: int, n_eval: int, seed: int | None = None,
              code_level: str = "full") -> TaskSplits:
    """Generate task `name` with disjoint eval, probe and train splits (by prompt), deterministic in `seed`
    (`code_level` picks the code task's templates: `code_pair`).

    Candidates are drawn from a `random.Random(seed)` until enough distinct prompts exist (or the task's space
    is exhausted), then cut in the order eval, probe, train.
    """
    if name not in _GENERATORS:
        raise ParameterError(f"Unknown zoo task {name!r}. Choose one of: {', '.join(TASKS)}.")
    for label, n in (("n_train", n_train), ("n_probe", n_probe), ("n_eval", n_eval)):
        if int(n) < 1:
            raise ParameterError(f"{label} must be a positive integer; got {n}.")
    seed = TASK_SEEDS[name] if seed is None else int(seed)
    rng = random.Random(seed)
    gen = functools.partial(code_pair, level=code_level) if name == "code" else _GENERATORS[name]
    need = n_train + n_probe + n_eval
    seen: dict[str, TaskPair] = {}
    misses = 0  # consecutive draws of a known prompt; many in a row mean the task's space is exhausted
    while len(seen) < need and misses < 20 * len(seen) + 1000:
        pair = gen(rng)
        if pair.prompt in seen:
            misses += 1
            continue
        misses = 0
        seen[pair.prompt] = pair
    pairs = list(seen.values())
    if len(pairs) < need:
        raise ParameterError(
            f"Task {name!r} has only {len(pairs)} distinct prompts; ask for fewer than {need} pairs."
        )
    ev, pr, tr = pairs[:n_eval], pairs[n_eval:n_eval + n_probe], pairs[n_eval + n_probe:]
    return TaskSplits(name=name, train=tr, probe=pr, eval=ev)


def make_tasks(names: tuple[str, ...] = TASKS, *, n_train: int, n_probe: int, n_eval: int) -> dict[str, TaskSplits]:
    """All zoo tasks with their fixed seeds (see `make_task`)."""
    return {n: make_task(n, n_train=n_train, n_probe=n_probe, n_eval=n_eval) for n in names}
