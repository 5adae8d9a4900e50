"""Prompts to attribute, as rows: ``{"prompt": "...", "answer": " Mary", "wrong": " John"}`` (a text,
its answer and an optional wrong answer, each a single token of the model's tokenizer), ``{"tokens":
[ids], "answer": id, "wrong": id}``, or ``{"text": "..."}`` (a text's last token, predicted at the
position before it). :func:`check_prompt_rows` checks their shape without a model;
:func:`prompt_ids` reads them into the token ids, answers and wrong answers that
:func:`interp.roles.logit_attribution` takes.
"""

from __future__ import annotations

from typing import Any

from interp.adapters import HookedModel
from interp.errors import UsageError
from interp.models import describe
from interp.probes.draw import drop_given_prefix
from interp.probes.user import text_ids


def check_prompt_rows(rows: Any) -> None:
    """``rows`` a non-empty list of objects, each a ``text`` or an ``answer`` with one of ``prompt``
    (a text) or ``tokens`` (ids); a :class:`UsageError` naming ``prompts=`` otherwise."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise UsageError("prompts= must hold a non-empty list of objects, one per prompt", params="prompts")
    for i, r in enumerate(rows):
        if "text" not in r and (("prompt" in r) == ("tokens" in r) or "answer" not in r):
            raise UsageError(
                f'prompts=: prompt {i} needs "answer" and one of "prompt" (text) or "tokens" (ids)', params="prompts"
            )


def prompt_ids(model: HookedModel, rows: list[dict]) -> tuple[list[list[int]], list[int], list[int] | None]:
    """Token ids, answer ids and wrong ids (``None`` when no prompt gives one) of the prompt ``rows``.
    Texts are read by :func:`~interp.probes.user.text_ids` (a model without a tokenizer reads UTF-8
    bytes); a text prompt gets the model's BOS unless it starts with one (:func:`drop_given_prefix`)."""
    info = describe(model)

    def one(value: Any, i: int, what: str) -> int:
        if isinstance(value, int):
            return value
        ids = text_ids(model, str(value))
        if len(ids) != 1:
            raise UsageError(
                f"prompts=: prompt {i}'s {what} {value!r} is {len(ids)} tokens; give a single-token {what}",
                params="prompts",
            )
        return int(ids[0])

    bos = [] if info.bos_token_id is None else [info.bos_token_id]
    texts = {
        i: text_ids(model, r["text"] if "text" in r else r["prompt"]) for i, r in enumerate(rows) if "tokens" not in r
    }
    given = dict(zip(texts, drop_given_prefix(info, list(texts.values()), "prompt"))) if bos else texts
    tokens, answers, wrongs = [], [], []
    for i, r in enumerate(rows):
        if "text" in r:  # the text's last token, predicted at the position before it
            ids = given[i]
            if len(bos + ids) < 2:
                raise UsageError(
                    f"text= {i}: {r['text']!r} has fewer than two tokens: nothing to predict its last from",
                    params="text",
                )
            tokens.append((bos + ids)[:-1])
            answers.append(ids[-1])
            wrongs.append(None)
            continue
        tokens.append([int(t) for t in r["tokens"]] if "tokens" in r else bos + given[i])
        answers.append(one(r["answer"], i, "answer"))
        wrongs.append(one(r["wrong"], i, "wrong") if "wrong" in r else None)
    if any(w is None for w in wrongs) and not all(w is None for w in wrongs):
        raise UsageError('prompts=: give "wrong" for every prompt or for none', params="prompts")
    return tokens, answers, None if wrongs[0] is None else wrongs


__all__ = ["check_prompt_rows", "prompt_ids"]
