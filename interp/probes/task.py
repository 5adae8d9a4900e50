"""Task probes: pairs of prompts that differ in one fact, with the answers a metric compares.

A :class:`TaskProbe` holds ``pairs`` of (clean, corrupted) token sequences of one length, and per
pair the answer token(s) and wrong-answer token(s) the metric compares at ``position`` (the
position whose next-token logits the metric reads). It is the input of activation patching
(:mod:`interp.patching`): run one prompt of each pair, patch a head's activation in from the other.

Made three ways, all seeded:

- :meth:`TaskProbe.from_pairs`: from Python lists (texts or token ids);
- :func:`read_task`: from a JSONL or CSV file with the columns ``clean``, ``corrupted``, ``answer``,
  ``wrong``;
- a bundled generator of :data:`TASKS`: ``repeat`` (repeated random tokens, the corrupted prompt
  resamples the first half: any model, the toy included), ``ioi`` (Wang et al. 2022's indirect
  object identification templates) and ``greater-than`` (Hanna et al. 2023).

Refused, with one line: a pair whose two prompts have different lengths (naming the pair and both
lengths), pairs of different lengths from each other, and an answer that is not one token (showing
how the tokenizer splits it).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from interp.adapters import HookedModel
from interp.errors import UsageError
from interp.models import describe
from interp.probes.draw import draw_blocks, drop_given_prefix, frame_tokens
from interp.probes.probe import TokenProbe
from interp.probes.user import text_ids
from interp.registry import Registry
from interp.results import plural
from interp.texts import decode_file, token_list

COLUMNS = ("clean", "corrupted", "answer", "wrong")
FRAMED_HINT = "pass framed=True if the prompts carry all of the model's framing"
DIRECTIONS: Registry[str] = Registry("direction")  # which prompt of a pair runs, and which one donates
DIRECTIONS.add("denoise", "run the corrupted prompt, patch in the clean run's head output (what restores the answer)")
DIRECTIONS.add("noise", "run the clean prompt, patch in the corrupted run's head output (what destroys it)")
DEFAULT_DIRECTION = "denoise"  # every patching entry point (library and command line) reads this one default


def check_direction(direction: str) -> None:
    """Refuse a patching direction that is not one of :data:`DIRECTIONS`."""
    if direction not in DIRECTIONS:
        raise UsageError(f"unknown direction {direction!r}: choose from {list(DIRECTIONS)}")


@dataclass
class PairedProbe(TokenProbe):
    """A :class:`TokenProbe` of the prompts a patched run reads, and each one's paired prompt
    (``donor``, ``[batch, pos]``): where a patched head's activation comes from."""

    donor: Int[Tensor, "batch pos"] | None = None

    def select(self, rows: Sequence[int] | Tensor) -> PairedProbe:
        picked = super().select(rows)
        index = torch.as_tensor(list(rows) if not isinstance(rows, Tensor) else rows, dtype=torch.long)
        donor = None if self.donor is None else self.donor[index.to(self.donor.device)]
        return replace(picked, donor=donor)  # type: ignore[return-value]


@dataclass
class TaskProbe:
    """Pairs of (clean, corrupted) prompts and what the metric compares.

    ``answer`` and ``wrong`` are ``[pair, k]`` token ids (``-1`` pads a pair with fewer): the metric
    compares the answer tokens' logits or probabilities with the wrong ones' at ``position`` (the
    position whose next-token prediction is read; negative counts from the end). ``metric`` is the
    name of the task's own metric (:data:`interp.patching.METRICS`).
    """

    clean: Int[Tensor, "pair pos"]
    corrupted: Int[Tensor, "pair pos"]
    answer: Int[Tensor, "pair k"]
    wrong: Int[Tensor, "pair k"]
    position: int = -1
    causal: bool = True
    name: str = "task"
    metric: str = "logit-diff"
    seed: int | None = None
    special_token_ids: frozenset[int] = frozenset()
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.clean.shape != self.corrupted.shape:
            raise UsageError(
                f"clean and corrupted tokens must have one shape, got {list(self.clean.shape)} and "
                f"{list(self.corrupted.shape)}"
            )
        n = self.clean.shape[0]
        for what, ids in (("answer", self.answer), ("wrong", self.wrong)):
            if ids.ndim != 2 or ids.shape[0] != n:
                raise UsageError(f"{what} must be [pairs, k] ids for {n} pairs, got shape {list(ids.shape)}")
            if not bool((ids >= 0).any(-1).all()):
                raise UsageError(f"every pair needs at least one {what} token")
        if not -self.seq_len <= self.position < self.seq_len:
            raise UsageError(f"position {self.position} is outside the prompts of {self.seq_len} tokens")

    @property
    def n_pairs(self) -> int:
        return self.clean.shape[0]

    @property
    def seq_len(self) -> int:
        return self.clean.shape[1]

    @property
    def read_position(self) -> int:
        """:attr:`position` counted from the start."""
        return self.position % self.seq_len

    def run_probe(self, direction: str = DEFAULT_DIRECTION) -> PairedProbe:
        """The prompts a patched run reads, each with its donor: ``denoise`` runs the corrupted prompt
        and patches in the clean run's activations; ``noise`` runs the clean one, patching in the
        corrupted run's."""
        check_direction(direction)
        run, donor = (self.corrupted, self.clean) if direction == "denoise" else (self.clean, self.corrupted)
        return PairedProbe(
            tokens=run,
            body_start=0,
            body_end=self.seq_len,
            causal=self.causal,
            special_token_ids=self.special_token_ids,
            seed=self.seed,
            meta={"kind": f"task:{self.name}", "batch": self.n_pairs, "seq_len": self.seq_len, "direction": direction},
            donor=donor,
        )

    def select(self, rows: Sequence[int]) -> TaskProbe:
        index = torch.as_tensor(list(rows), dtype=torch.long)
        return replace(
            self,
            clean=self.clean[index],
            corrupted=self.corrupted[index],
            answer=self.answer[index],
            wrong=self.wrong[index],
            meta=dict(self.meta),
        )

    def to(self, device: torch.device | str) -> TaskProbe:
        self.clean, self.corrupted = self.clean.to(device), self.corrupted.to(device)
        return self

    # ---- construction ---------------------------------------------------------------------------

    @classmethod
    def from_pairs(
        cls,
        model: HookedModel,
        clean: Sequence[Any],
        corrupted: Sequence[Any],
        answer: Sequence[Any],
        wrong: Sequence[Any],
        *,
        position: int = -1,
        framed: bool = False,
        name: str = "task",
        metric: str = "logit-diff",
        seed: int | None = None,
    ) -> TaskProbe:
        """Pairs from Python lists. A prompt is a text (tokenized with the model's tokenizer, no
        special tokens; a model without one, the toy, reads its UTF-8 bytes, one token a byte) or a
        list of token ids; the model's framing (a BOS for decoders that expect one, ``[CLS] ... [SEP]``
        for encoders) is added unless ``framed`` (the prompts are then taken as they are). A prompt
        that already starts with the BOS (its text or id) gets no second one, with a warning. An
        answer or wrong answer is a text that must be one token, an id, or a list of texts or ids
        (``"|"`` separates several in one text: ``" 52| 53"``, as ``[" 52", " 53"]``)."""
        info = describe(model)
        lengths = {len(clean), len(corrupted), len(answer), len(wrong)}
        if len(lengths) != 1:
            raise UsageError(
                f"clean, corrupted, answer and wrong must have one entry per pair, got {len(clean)}, "
                f"{len(corrupted)}, {len(answer)} and {len(wrong)}"
            )
        if not clean:
            raise UsageError("a task needs at least one pair")
        prefix, suffix, _ = ([], [], []) if framed else frame_tokens(info)
        prompts = [_ids(model, p, "prompt") for p in [*clean, *corrupted]]
        if not framed:  # a prompt that already starts with the BOS gets no second one
            prompts = drop_given_prefix(info, prompts, "prompt", FRAMED_HINT)
        rows_c, rows_k = [], []
        for i, (ca, cb) in enumerate(zip(prompts[: len(clean)], prompts[len(clean) :])):
            if len(ca) != len(cb):
                raise UsageError(
                    f"pair {i}: the clean prompt is {len(ca)} tokens and the corrupted one {len(cb)}: "
                    "patching needs the two prompts of a pair to line up position by position; "
                    "reword one of them"
                )
            rows_c.append(prefix + ca + suffix)
            rows_k.append(prefix + cb + suffix)
        n = len(rows_c[0])
        for i, row in enumerate(rows_c):
            if len(row) != n:
                raise UsageError(
                    f"pair {i} is {len(row)} tokens long but pair 0 is {n}: every pair of a task must have "
                    "one length (split the task by length)"
                )
        if n > info.n_ctx:
            raise UsageError(f"the prompts are {n} tokens, longer than the model's context of {info.n_ctx}")
        ans = [_answer_ids(model, a, i, "answer") for i, a in enumerate(answer)]
        bad = [(i, x) for i, ids in enumerate(ans) for x in ids if not 0 <= x < info.d_vocab]
        wr = [_answer_ids(model, w, i, "wrong answer") for i, w in enumerate(wrong)]
        bad += [(i, x) for i, ids in enumerate(wr) for x in ids if not 0 <= x < info.d_vocab]
        if bad:
            raise UsageError(
                f"pair {bad[0][0]}: token id {bad[0][1]} is outside the model's vocabulary of {info.d_vocab}"
            )
        same = [(i, sorted(set(a) & set(w))) for i, (a, w) in enumerate(zip(ans, wr)) if set(a) & set(w)]
        if same:
            i, ids = same[0]
            raise UsageError(
                f"pair {i}: the answer {answer[i]!r} and the wrong answer {wrong[i]!r} share token id "
                f"{', '.join(map(str, ids))}: the logit difference would cancel it, whatever the model does; "
                f"give a wrong answer other than the answer ({plural(len(same), 'pair')} of {len(ans)} like this)"
            )
        tokens = torch.tensor(rows_c + rows_k, dtype=torch.long)
        if bool(((tokens < 0) | (tokens >= info.d_vocab)).any()):
            raise UsageError(f"a prompt holds a token id outside the model's vocabulary of {info.d_vocab}")
        p = position if position >= 0 else position - len(suffix)
        return cls(
            clean=tokens[: len(rows_c)],
            corrupted=tokens[len(rows_c) :],
            answer=_pad(ans),
            wrong=_pad(wr),
            position=p,
            causal=info.is_causal,
            name=name,
            metric=metric,
            seed=seed,
            special_token_ids=info.special_token_ids,
        )


def _ids(model: HookedModel, value: Any, what: str) -> list[int]:
    """Token ids of a prompt or an answer: a text read by :func:`~interp.probes.user.text_ids` (the
    tokenizer, or the toy's UTF-8 bytes), else ids as they are."""
    if isinstance(value, str):
        return text_ids(model, value)
    if isinstance(value, int):
        return [value]
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        raise UsageError(f"cannot read the {what} {value!r}: give a text or a list of token ids") from None


def _answer_ids(model: HookedModel, value: Any, pair: int, what: str) -> list[int]:
    """An answer (or wrong answer): one token, or several: a list of texts or ids, or texts separated
    by ``"|"`` (``" 52| 53"``); each text must be one token."""
    if isinstance(value, str):
        parts: list[Any] = value.split("|")
    elif isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
        parts = list(value)
    else:
        ids = _ids(model, value, what)
        if not ids:
            raise UsageError(f"pair {pair}: the {what} is empty")
        return ids
    out = []
    for part in parts:
        ids = _ids(model, part, what)
        if isinstance(part, str) and len(ids) != 1:
            tokenizer = getattr(model, "tokenizer", None)
            split = (
                f"the tokenizer splits it as {token_list(tokenizer, ids)}; choose an "
                "answer the tokenizer keeps whole (often with a leading space)"
                if tokenizer is not None
                else "a model without a tokenizer reads a text as its UTF-8 bytes, one token a byte; choose a "
                "one-byte (ASCII) answer"
            )
            raise UsageError(f"pair {pair}: the {what} {part!r} is {len(ids)} tokens, not one: {split}")
        out += ids
    return out


def _pad(rows: list[list[int]]) -> Int[Tensor, "pair k"]:
    k = max(len(r) for r in rows)
    return torch.tensor([r + [-1] * (k - len(r)) for r in rows], dtype=torch.long)


# ---- files ---------------------------------------------------------------------------------------


def read_task(
    model: HookedModel, path: str | Path, *, position: int = -1, framed: bool = False, n_pairs: int | None = None
) -> TaskProbe:
    """A task from a JSONL file (one object per line) or a CSV file with the columns ``clean``,
    ``corrupted``, ``answer`` and ``wrong``. In JSONL a prompt may be a text or a list of token ids;
    an answer a text, an id or a list of them. In CSV every cell is a text (``"|"`` separates several
    answers). ``n_pairs``: the first that many pairs (default every pair; more than the file holds
    is refused); ``framed`` as for :meth:`TaskProbe.from_pairs`."""
    path = Path(path)
    every = check_task_file(path)
    rows = first_pairs(every, n_pairs, path)
    cols = {c: [row[c] for row in rows] for c in COLUMNS}
    task = TaskProbe.from_pairs(model, **cols, position=position, framed=framed, name=path.stem)
    task.meta.update(kind="file", file_pairs=len(every))
    return task


def first_pairs(
    rows: list[dict[str, Any]], n_pairs: int | None, path: str | Path, flag: str = "n_pairs"
) -> list[dict[str, Any]]:
    """The first ``n_pairs`` rows of a task file (all of them for None); more than it holds is refused
    (``flag`` names the setting in the message)."""
    if n_pairs is None:
        return rows
    if n_pairs > len(rows):
        raise UsageError(
            f"{path} holds {len(rows)} pair{'s' if len(rows) != 1 else ''}, fewer than the {n_pairs} asked for "
            f"({flag}): ask for at most {len(rows)}, or leave {flag} out to use every pair"
        )
    return rows[:n_pairs]


def check_task_file(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a task file, refused (one line) when it is missing, empty or lacks a column; needs
    no model (the command checks this before loading one)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no task file at {path}: give a .jsonl or .csv file, or a bundled task {list(TASKS)}")
    rows = _read_rows(path)
    if not rows:
        raise UsageError(f"{path} holds no pairs")
    csv_file = path.suffix.lower() == ".csv"
    for i, row in enumerate(rows):
        missing = [c for c in COLUMNS if c not in row or row[c] in (None, "")]
        if missing:
            where = ("the header" if i == 0 else f"row {i + 1}") if csv_file else f"line {i + 1}"
            raise UsageError(
                f"{path}: {where} lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}: a task "
                f"file needs {', '.join(COLUMNS)}"
            )
    return rows


def _read_rows(path: Path) -> list[dict[str, Any]]:
    text = decode_file(path, kind="task file")
    if path.suffix.lower() == ".csv":
        return list(csv.DictReader(text.splitlines()))
    rows = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}: line {i + 1} is not JSON ({e.msg}): one object per line") from None
        if not isinstance(row, dict):
            raise UsageError(f"{path}: line {i + 1} is not a JSON object: one object per line")
        rows.append(row)
    return rows


# ---- bundled tasks -------------------------------------------------------------------------------

TASKS: Registry[Callable[..., TaskProbe]] = Registry("task")


N_PAIRS = 20  # the pairs of a bundled task unless asked otherwise


def task_probe(
    model: HookedModel,
    task: str | Path,
    *,
    n_pairs: int | None = None,
    seed: int = 0,
    framed: bool = False,
    **kw: Any,
) -> TaskProbe:
    """A bundled task of :data:`TASKS` by name (``n_pairs`` pairs, default :data:`N_PAIRS`), or a
    task file, JSONL or CSV (its first ``n_pairs`` pairs, default every pair; ``framed``: its prompts
    carry the model's framing, see :meth:`TaskProbe.from_pairs`)."""
    if isinstance(task, str) and task in TASKS:
        if framed:
            raise UsageError(f"framed applies to a task file: the bundled task {task!r} frames its own prompts")
        return TASKS.get(task)(model, n_pairs=N_PAIRS if n_pairs is None else n_pairs, seed=seed, **kw)
    if isinstance(task, Path) or Path(str(task)).suffix.lower() in (".jsonl", ".json", ".csv"):
        return read_task(model, task, framed=framed, n_pairs=n_pairs)
    raise UsageError(f"unknown task {task!r}: choose from {list(TASKS)} or give a .jsonl/.csv file")


@TASKS.register("repeat", "repeated random tokens; the corrupted prompt resamples the first half (any model)")
def repeat_task(model: HookedModel, *, n_pairs: int = 20, seed: int = 0, block_len: int = 10) -> TaskProbe:
    """``b_1 .. b_n b_1 .. b_n`` (framed); the corrupted prompt draws the first half afresh. The metric
    reads the last body token ``b_n``: the answer is ``b_1`` (what followed ``b_n`` the first time),
    the wrong answer ``b_2`` (an off-by-one copy)."""
    info = describe(model)
    if not info.is_causal:
        raise UsageError("the repeat task predicts the next token: it needs a causal (decoder) model")
    if block_len < 3:
        raise UsageError(f"the repeat task needs blocks of at least 3 tokens, got {block_len}")
    first = draw_blocks(model, info, n_pairs, block_len, seed)
    fresh = draw_blocks(model, info, n_pairs, block_len, seed + 1_000_003)
    clean = torch.cat([first, first], 1)
    corrupted = torch.cat([fresh, first], 1)
    task = TaskProbe.from_pairs(
        model,
        clean.tolist(),
        corrupted.tolist(),
        first[:, :1].tolist(),
        first[:, 1:2].tolist(),
        name="repeat",
        seed=seed,
    )
    task.meta.update(kind="repeat", n_pairs=n_pairs, block_len=block_len, seed=seed)
    return task


# Wang et al. (2022)'s BABA templates (a selection): [A] and [B] are names, [PLACE] and [OBJECT] nouns
IOI_TEMPLATES = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to",
    "Friends [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
)
IOI_NAMES = (
    "Mary John Tom James Dan Sid Martin Amy Paul Kate Lisa Anna Mark Sarah Michael Jessica David Laura "
    "Rachel Emma George Lucy Alex Jack Ryan Adam Sam Ben Max Kevin Brian Eric Chris Steve Jane Linda"
).split()
IOI_PLACES = "store garden restaurant school hospital office house station park church".split()
IOI_OBJECTS = "ring kiss bone basketball computer necklace drink snack apple book".split()
MIN_NAMES = 3


def _one_token(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` if the tokenizer keeps it as one token that reads back as ``text`` (an
    unknown word mapped to an unknown-token id does not count), else None."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1 or tokenizer.decode(ids) != text:
        return None
    return int(ids[0])


def _single_tokens(tokenizer: Any, words: Sequence[str], lead: str = " ") -> list[tuple[str, int]]:
    found = [(w, _one_token(tokenizer, lead + w)) for w in words]
    return [(w, i) for w, i in found if i is not None]


def _need_tokenizer(model: HookedModel, task: str) -> Any:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise UsageError(f"the {task} task is made of words: it needs a model with a tokenizer (the toy has none)")
    if not describe(model).is_causal:
        raise UsageError(f"the {task} task predicts the next token: it needs a causal (decoder) model")
    return tokenizer


@TASKS.register("ioi", "indirect object identification (Wang et al. 2022); corrupted: three other names (ABC)")
def ioi_task(model: HookedModel, *, n_pairs: int = 20, seed: int = 0, template: int = 0) -> TaskProbe:
    """``"Then, B and A went to the store. B gave a ring to"`` -> `` A`` (the indirect object), the
    wrong answer `` B`` (the subject). The corrupted prompt puts three other names in (Wang et al.'s
    ABC distribution), so neither answer is favoured. Names, places and objects are the ones the
    model's tokenizer keeps as one token (after a space); one ``template`` per task (its prompts
    then have one length)."""
    tokenizer = _need_tokenizer(model, "ioi")
    if not 0 <= template < len(IOI_TEMPLATES):
        raise UsageError(f"ioi template {template} does not exist: choose 0..{len(IOI_TEMPLATES) - 1}")
    names = _single_tokens(tokenizer, IOI_NAMES)
    places = _single_tokens(tokenizer, IOI_PLACES)
    objects = _single_tokens(tokenizer, IOI_OBJECTS)
    if len(names) < 2 * MIN_NAMES or not places or not objects:
        raise UsageError(
            f"the ioi task needs {2 * MIN_NAMES} names and a place and an object that the tokenizer keeps as one "
            f"token: it keeps {len(names)} of {len(IOI_NAMES)} names, {len(places)} places, {len(objects)} objects"
        )
    gen = torch.Generator().manual_seed(seed)
    pick = lambda seq: seq[int(torch.randint(len(seq), (1,), generator=gen))]  # noqa: E731
    text = IOI_TEMPLATES[template]
    clean, corrupted, answer, wrong = [], [], [], []
    for _ in range(n_pairs):
        order = torch.randperm(len(names), generator=gen)[:5].tolist()
        a, b, c, d, e = (names[i][0] for i in order)
        place, obj = pick(places)[0], pick(objects)[0]
        # the corrupted prompt: three other names, the subject's second mention a third one (ABC)
        clean.append(_abc(text, a, b, b, place, obj))
        corrupted.append(_abc(text, c, d, e, place, obj))
        answer.append(" " + a)
        wrong.append(" " + b)
    task = TaskProbe.from_pairs(model, clean, corrupted, answer, wrong, name="ioi", seed=seed)
    task.meta.update(kind="ioi", n_pairs=n_pairs, seed=seed, template=text, names=len(names))
    return task


def _abc(text: str, a: str, b: str, c: str, place: str, obj: str) -> str:
    first = text.replace("[A]", a).replace("[B]", b, 1).replace("[B]", c, 1)
    return first.replace("[PLACE]", place).replace("[OBJECT]", obj)


GT_NOUNS = "war expedition project campaign reign strike journey dispute siege drought".split()
GT_TEMPLATE = "The {noun} lasted from the year {century}{yy} to the year {century}"


@TASKS.register(
    "greater-than",
    "Hanna et al. 2023: 'The war lasted from the year 17YY to the year 17'; metric: P(year > YY) - P(year <= YY)",
)
def greater_than_task(model: HookedModel, *, n_pairs: int = 20, seed: int = 0, century: int = 17) -> TaskProbe:
    """Hanna et al.'s greater-than task. The answers are the two-digit year tokens above ``YY``, the
    wrong ones those at or below it (the metric is the probability difference); the corrupted prompt
    starts the war in ``CC01``, so no year is favoured. Only ``YY`` whose ``CCYY`` the tokenizer splits
    into ``CC`` + ``YY``, and nouns it keeps whole, are drawn."""
    tokenizer = _need_tokenizer(model, "greater-than")
    two = {f"{y:02d}": _one_token(tokenizer, f"{y:02d}") for y in range(100)}
    digits = {k: v for k, v in two.items() if v is not None}
    if len(digits) < 100:
        raise UsageError(
            f"the greater-than task needs every two-digit year 00..99 as one token: the tokenizer keeps "
            f"{len(digits)} of them whole"
        )
    cent = _ids(model, f" {century}", "century")
    years = [y for y in range(2, 99) if _ids(model, f" {century}{y:02d}", "year") == cent + [digits[f"{y:02d}"]]]
    nouns = _single_tokens(tokenizer, GT_NOUNS)
    if len(years) < 10 or not nouns:
        raise UsageError(
            f"the greater-than task needs years {century}YY that the tokenizer splits as '{century}' + 'YY' "
            f"and nouns it keeps whole: {len(years)} years and {len(nouns)} nouns qualify"
        )
    gen = torch.Generator().manual_seed(seed)
    clean, corrupted, answer, wrong = [], [], [], []
    for _ in range(n_pairs):
        yy = years[int(torch.randint(len(years), (1,), generator=gen))]
        noun = nouns[int(torch.randint(len(nouns), (1,), generator=gen))][0]
        clean.append(GT_TEMPLATE.format(noun=noun, century=century, yy=f"{yy:02d}"))
        corrupted.append(GT_TEMPLATE.format(noun=noun, century=century, yy="01"))
        answer.append([digits[f"{y:02d}"] for y in range(yy + 1, 100)])
        wrong.append([digits[f"{y:02d}"] for y in range(0, yy + 1)])
    task = TaskProbe.from_pairs(
        model, clean, corrupted, answer, wrong, name="greater-than", metric="prob-diff", seed=seed
    )
    task.meta.update(kind="greater-than", n_pairs=n_pairs, seed=seed, century=century, years=len(years))
    return task


__all__ = [
    "COLUMNS",
    "DIRECTIONS",
    "TASKS",
    "PairedProbe",
    "TaskProbe",
    "check_task_file",
    "first_pairs",
    "greater_than_task",
    "ioi_task",
    "read_task",
    "repeat_task",
    "task_probe",
]
