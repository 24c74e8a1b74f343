"""Probe data: general text and task prompt/answer pairs, their tokenisation and batching.

Task pairs come from JSONL (`{"prompt": ..., "answer": ...}` per line) or CSV (columns `prompt`, `answer`).
General text comes from a text file (documents separated by blank lines) or JSONL (`{"text": ...}`).
A pair is encoded as prompt tokens followed by answer tokens and EOS; only answer tokens (and EOS) carry
labels, so the loss and the exact-match verdict concern the answer alone.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch

from forgetlab.core.errors import ProbeDataError

if TYPE_CHECKING:  # pragma: no cover
    from forgetlab.core.benchmarks import BenchmarkSpec

IGNORE = -100


@dataclass(frozen=True)
class TaskPair:
    """One task example: the prompt the model sees and the answer it should produce."""

    prompt: str
    answer: str


@dataclass
class TaskData:
    """A task's splits: `train` (fine-tuning), `probe` (analysis samples), `eval` (speciality)."""

    name: str
    train: list[TaskPair] = field(default_factory=list)
    probe: list[TaskPair] = field(default_factory=list)
    eval: list[TaskPair] = field(default_factory=list)

    def split(self, which: str) -> list[TaskPair]:
        """One split by name, with a clear message when it is empty."""
        pairs = getattr(self, which, None)
        if pairs is None:
            raise ProbeDataError(f"Unknown split {which!r}; use train, probe or eval.")
        if not pairs:
            raise ProbeDataError(f"Task {self.name!r} has no {which} samples: add a {which} file to the pool.")
        return pairs


@dataclass
class Probes:
    """Everything a pool evaluates with: held-out general text, task splits, and the prompt template."""

    general: list[str] = field(default_factory=list)
    tasks: dict[str, TaskData] = field(default_factory=dict)
    general_train: list[str] = field(default_factory=list)
    template: str | None = None
    benchmarks: "BenchmarkSpec | None" = None   # lm-eval tasks for generality/speciality (forgetlab.core.benchmarks)

    def task(self, name: str) -> TaskData:
        """A task by name; an unknown name lists the known ones."""
        try:
            return self.tasks[name]
        except KeyError:
            known = ", ".join(self.tasks) or "none"
            raise ProbeDataError(f"The pool has no task {name!r}; its tasks are: {known}.") from None


@dataclass(frozen=True)
class EncodedExample:
    """Token ids and labels (IGNORE where no loss is taken) of one sequence."""

    input_ids: list[int]
    labels: list[int]


def _need_file(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ProbeDataError(f"The {what} file {p} does not exist; check the path in the pool file.")
    return p


def _jsonl_records(p: Path, shape: str):
    """(line number, parsed JSON) for each non-blank line; a bad line names itself and the expected shape."""
    with open(p, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ProbeDataError(f"{p}, line {lineno} is not valid JSON ({exc.msg}); each line must be "
                                     f"{shape}.") from None


def _pair(p: Path, lineno: int, prompt, answer) -> TaskPair:
    """A pair read from line `lineno` of `p`; an empty (or null) answer is refused: it has no token to score,
    so exact match would count it right and the answer loss would be NaN (or EOS alone)."""
    if answer is None or str(answer) == "":
        raise ProbeDataError(f"{p}, line {lineno} has an empty answer: an empty answer has no token to score "
                             "(exact match would count it right, its answer loss would be NaN); give every row an "
                             "answer, or delete that row.")
    return TaskPair("" if prompt is None else str(prompt), str(answer))


def read_task_pairs(path: str | Path) -> list[TaskPair]:
    """Task pairs from JSONL (`prompt`, `answer` keys) or CSV (`prompt`, `answer` columns). A row whose answer
    is empty (or JSON null) is refused, naming the file and its line."""
    p = _need_file(path, "task")
    pairs: list[TaskPair] = []
    if p.suffix.lower() == ".csv":
        with open(p, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if not reader.fieldnames or not {"prompt", "answer"} <= set(reader.fieldnames):
                raise ProbeDataError(f"{p} must have a header with columns 'prompt' and 'answer'; "
                                     f"it has {reader.fieldnames}.")
            for row in reader:   # reader.line_num: the line the row ends on (a quoted field may span lines)
                pairs.append(_pair(p, reader.line_num, row["prompt"], row["answer"]))
    else:
        shape = '{"prompt": "...", "answer": "..."}'
        for lineno, rec in _jsonl_records(p, shape):
            if not isinstance(rec, dict) or "prompt" not in rec or "answer" not in rec:
                raise ProbeDataError(f"{p}, line {lineno} lacks 'prompt' or 'answer'; each line must be {shape}.")
            pairs.append(_pair(p, lineno, rec["prompt"], rec["answer"]))
    if not pairs:
        raise ProbeDataError(f"{p} holds no task pairs; add prompt/answer rows.")
    return pairs


def write_task_pairs(path: str | Path, pairs: Sequence[TaskPair]) -> None:
    """Write task pairs as JSONL."""
    with open(path, "w", encoding="utf-8") as fh:
        for pair in pairs:
            fh.write(json.dumps({"prompt": pair.prompt, "answer": pair.answer}, ensure_ascii=False) + "\n")


def read_general_text(path: str | Path) -> list[str]:
    """General text documents: blank-line separated paragraphs of a text file, or JSONL `text` fields."""
    p = _need_file(path, "general text")
    docs: list[str] = []
    if p.suffix.lower() == ".jsonl":
        for lineno, rec in _jsonl_records(p, '{"text": "..."}'):
            if not isinstance(rec, dict) or "text" not in rec:
                raise ProbeDataError(f'{p}, line {lineno} must be {{"text": "..."}}.')
            docs.append(str(rec["text"]))
    else:
        text = p.read_text(encoding="utf-8", errors="replace")
        docs = [d.strip() for d in text.split("\n\n") if d.strip()]
    if not docs:
        raise ProbeDataError(f"{p} holds no text; add held-out general text (paragraphs separated by blank lines).")
    return docs


def check_template(tokenizer, template: str | None, *, where: str | None = None,
                   tokenizer_of: str | None = None) -> None:
    """ProbeDataError unless the tokenizer can apply the prompt template: `template="chat"` needs a tokenizer
    with a chat template (base models usually have none). `where` names the setting (e.g. the pool file) and
    `tokenizer_of` the model the tokenizer comes from, for the message."""
    if template != "chat" or getattr(tokenizer, "chat_template", None):
        return
    whose = f"the tokenizer of {tokenizer_of}" if tokenizer_of else "the tokenizer"
    raise ProbeDataError(f"{where or 'The prompt template `template: chat`'} wraps every prompt in the tokenizer's "
                         f"chat template, but {whose} has no chat template (usual for a base model): remove "
                         "`template: chat` from the pool file's probes to use the prompts as written, or use a "
                         "tokenizer that has a chat template (`chat_template` in tokenizer_config.json, or a "
                         "chat_template.jinja beside it).")


def format_prompt(tokenizer, prompt: str, template: str | None = None) -> str:
    """The text the model sees for a prompt: as is, or wrapped in the tokenizer's chat template (ProbeDataError,
    from `check_template`, when the tokenizer has none)."""
    if template == "chat":
        check_template(tokenizer, template)
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return prompt


def encode_pairs(tokenizer, pairs: Sequence[TaskPair], max_length: int = 256,
                 template: str | None = None) -> list[EncodedExample]:
    """Encode pairs as prompt + answer + EOS; labels only on answer and EOS. Long prompts lose their start."""
    if not pairs:
        raise ProbeDataError("No task pairs to encode.")
    check_template(tokenizer, template)
    eos = tokenizer.eos_token_id
    out = []
    for pair in pairs:
        text = format_prompt(tokenizer, pair.prompt, template)
        p_ids = tokenizer(text, add_special_tokens=template is None)["input_ids"]
        a_ids = tokenizer(pair.answer, add_special_tokens=False)["input_ids"]
        if eos is not None:
            a_ids = a_ids + [eos]
        a_ids = a_ids[:max_length - 1]
        p_ids = p_ids[-(max_length - len(a_ids)):]
        out.append(EncodedExample(p_ids + a_ids, [IGNORE] * len(p_ids) + a_ids))
    return out


# How far into a long document `leading_ids` tokenizes at first: this many characters per token needed (English
# BPE averages about 4), and never less than _FIRST_CHARS; it reads four times further each time that was short.
_CHARS_PER_TOKEN = 16
_FIRST_CHARS = 4096
# Tokens kept back from the end of a prefix: a token that reaches up to where the text was cut may differ from the
# whole document's tokens there; those this far before the cut do not.
_MARGIN = 32


def _cut(text: str, chars: int) -> int:
    """Where to cut `text` near `chars`: before the last whitespace of its second half (a word boundary, where
    tokenizers split), else at `chars` (a text without spaces)."""
    at = max(text.rfind(space, chars // 2, chars + 1) for space in (" ", "\n", "\t"))
    return at if at > 0 else chars


def leading_ids(tokenizer, text: str, need: int | None = None) -> tuple[list[int], bool]:
    """(token ids, whole): the whole document's ids (`whole` True), or — when `need` tokens are all that is used
    and the document is much longer — its first `need` ids, from tokenizing a prefix (`whole` False).

    The prefix is cut at a word boundary (where tokenizers split words independently) and must give `need` + 32
    tokens, so that the ids kept end well before the cut and are the whole document's (a text without any
    whitespace has no such boundary; there only the 32-token margin separates them from the cut). The characters
    tokenized stay in proportion to `need`: a 10 MB line is never tokenized whole for a few blocks."""
    if need is not None:
        chars = max(_FIRST_CHARS, _CHARS_PER_TOKEN * (need + _MARGIN))
        while chars < len(text):
            ids = tokenizer(text[:_cut(text, chars)], add_special_tokens=False)["input_ids"]
            if len(ids) >= need + _MARGIN:
                return list(ids[:need]), False
            chars *= 4
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]), True


def encode_text(tokenizer, texts: Sequence[str], block_size: int = 128,
                max_blocks: int | None = None) -> list[EncodedExample]:
    """Concatenate documents (EOS between) and cut into blocks of `block_size` tokens; labels = inputs.

    With `max_blocks`, the first `max_blocks` of those blocks, tokenizing only as far as they reach (documents
    after them are not read, a long one only in part): the same blocks as cutting everything and keeping the
    first `max_blocks`."""
    if not texts:
        raise ProbeDataError("No general text to encode.")
    eos = tokenizer.eos_token_id
    limit = None if max_blocks is None else max_blocks * block_size
    stream: list[int] = []
    for t in texts:
        if limit is not None and len(stream) >= limit:
            break
        ids, whole = leading_ids(tokenizer, t, None if limit is None else limit - len(stream))
        stream.extend(ids)
        if whole and eos is not None:
            stream.append(eos)
    blocks = [stream[i:i + block_size] for i in range(0, len(stream), block_size)]
    blocks = [b for b in blocks if len(b) >= 2]
    return [EncodedExample(b, list(b)) for b in blocks[:max_blocks]]


def encode_documents(tokenizer, texts: Sequence[str], block_size: int = 128,
                     max_blocks: int | None = None) -> list[EncodedExample]:
    """One sequence per document: its tokens and EOS, truncated to `block_size` (a document of fewer than two
    tokens is left out); with `max_blocks`, the first `max_blocks` such sequences. Only the first `block_size`
    tokens of a document are tokenized when it is much longer."""
    if not texts:
        raise ProbeDataError("No general text to encode.")
    eos = tokenizer.eos_token_id
    out: list[EncodedExample] = []
    for t in texts:
        if max_blocks is not None and len(out) >= max_blocks:
            break
        ids, whole = leading_ids(tokenizer, t, block_size)
        seq = (ids + [eos] if whole and eos is not None else ids)[:block_size]
        if len(seq) >= 2:
            out.append(EncodedExample(seq, list(seq)))
    return out


def collate(examples: Sequence[EncodedExample], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad a batch: input_ids, attention_mask, and labels (IGNORE on padding)."""
    n = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), n), dtype=torch.long)
    labels = torch.full((len(examples), n), IGNORE, dtype=torch.long)
    for i, e in enumerate(examples):
        k = len(e.input_ids)
        ids[i, :k] = torch.tensor(e.input_ids)
        mask[i, :k] = 1
        labels[i, :k] = torch.tensor(e.labels)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def batches(examples: Sequence[EncodedExample], batch_size: int, pad_id: int = 0):
    """Consecutive batches of `batch_size` examples, collated."""
    for i in range(0, len(examples), batch_size):
        yield collate(examples[i:i + batch_size], pad_id)
