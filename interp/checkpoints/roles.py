"""Roles over training: who holds each role at each step, handoffs, first passes, the phase change.

A head *holds* a role at a step when it passes the atlas's role rule there (its CI's lower bound
above the uniform baseline and a score of at least 0.3 or the role's own bar: :func:`interp.parts.table.passes`) and scores
highest among the heads that pass; the holder keeps the role while it passes and the leader's score
stays inside its CI (a near tie between two heads is not a change). A *handoff* is a pair of consecutive steps where the holder
changes from one head to another (steps between where no head holds it lie inside the range). Revisions flagged as duplicates (weights equal to another's) are
left out: they are not a step of training.

The *phase change* (Olsson et al. 2022) is the window of steps where the best induction score
rises from below ``low`` (0.1) to above ``high`` (0.5): from the last step under ``low`` before the
first step over ``high``, to that step. It is reported with how much the in-context learning score
improved over the same window, as a fraction of its final value.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from interp.parts.table import ROLES, THRESHOLD, passes


def holders(heads: pd.DataFrame, baselines: Mapping[str, float], threshold: float = THRESHOLD) -> pd.DataFrame:
    """A row per (step, role): the head holding it (``""`` for none) and its score.

    ``heads``: the sweep's long table (``step``, ``revision``, ``label``, score columns with CIs),
    duplicates already left out. The holder is the passing head with the highest score, except
    that the previous step's holder keeps the role while it still passes and the leader's score is
    inside its CI: a near tie is not a change of holder."""
    rows = []
    steps = list(heads.groupby(["step", "revision"], sort=True))
    for role in ROLES:
        column = ROLES.info(role, "column")
        if column not in heads:
            continue
        previous = ""
        for (step, revision), table in steps:
            ok = table[passes(table, role, baselines, threshold)]
            ok = ok.sort_values([column, "layer", "head"], ascending=[False, True, True])
            holder = ok["label"].iloc[0] if len(ok) else ""
            if previous and previous in set(ok["label"]):
                kept = ok[ok["label"] == previous].iloc[0]
                if ok[column].iloc[0] <= kept[f"{column}_hi"]:
                    holder = previous
            score = float(ok.loc[ok["label"] == holder, column].iloc[0]) if holder else float("nan")
            rows.append({"step": step, "revision": revision, "role": role, "head": holder, "score": score})
            previous = holder or previous
    frame = pd.DataFrame(rows, columns=["step", "revision", "role", "head", "score"])
    return frame.sort_values(["step", "role"], kind="mergesort", key=_role_order).reset_index(drop=True)


def holder_runs(seq: pd.DataFrame) -> list[tuple[str, int, int]]:
    """One role's :func:`holders` rows as runs: ``(head, first step, last step)`` per stretch of
    consecutive steps held by one head (``""``: none), in step order."""
    runs: list[tuple[str, int, int]] = []
    for row in seq.sort_values("step").itertuples():
        if runs and runs[-1][0] == row.head:
            runs[-1] = (row.head, runs[-1][1], row.step)
        else:
            runs.append((row.head, row.step, row.step))
    return runs


def _role_order(column: pd.Series) -> pd.Series:
    order = {role: i for i, role in enumerate(ROLES)}
    return column.map(order) if column.name == "role" else column


def handoffs(heads: pd.DataFrame, held: pd.DataFrame) -> pd.DataFrame:
    """A row per change of a role's holder between consecutive steps, from one head to another:
    the step range and both heads' scores at both ends."""
    rows = []
    for role, seq in held.groupby("role", sort=False):
        score = _score_lookup(heads, ROLES.info(role, "column"))
        seq = seq.sort_values("step")
        previous = None
        for row in seq.itertuples():
            if row.head and previous is not None and previous.head and row.head != previous.head:
                rows.append(
                    {
                        "role": role,
                        "from_step": previous.step,
                        "to_step": row.step,
                        "from_head": previous.head,
                        "to_head": row.head,
                        "from_head_before": score(previous.step, previous.head),
                        "from_head_after": score(row.step, previous.head),
                        "to_head_before": score(previous.step, row.head),
                        "to_head_after": score(row.step, row.head),
                    }
                )
            if row.head:  # steps where nobody holds it lie inside the handoff's range
                previous = row
    return pd.DataFrame(
        rows,
        columns=[
            "role",
            "from_step",
            "to_step",
            "from_head",
            "to_head",
            "from_head_before",
            "from_head_after",
            "to_head_before",
            "to_head_after",
        ],
    )


def _score_lookup(heads: pd.DataFrame, column: str):
    index = heads.set_index(["step", "label"])[column]
    return lambda step, head: float(index.loc[(step, head)])


def first_passes(heads: pd.DataFrame, baselines: Mapping[str, float], threshold: float = THRESHOLD) -> pd.DataFrame:
    """A row per (role, head) that ever passes the role rule: the first step it does, and its score there."""
    rows = []
    for role in ROLES:
        column = ROLES.info(role, "column")
        if column not in heads:
            continue
        ok = heads[passes(heads, role, baselines, threshold)]
        for label, group in ok.sort_values("step").groupby("label", sort=False):
            first = group.iloc[0]
            rows.append({"role": role, "head": label, "step": first["step"], "score": float(first[column])})
    frame = pd.DataFrame(rows, columns=["role", "head", "step", "score"])
    return frame.sort_values(["role", "step", "head"], kind="mergesort").reset_index(drop=True)


def phase_change(
    heads: pd.DataFrame, revisions: pd.DataFrame, *, low: float = 0.1, high: float = 0.5, column: str = "induction"
) -> dict | None:
    """The window where the best ``column`` score rises from < ``low`` to > ``high`` (module
    docstring), with the in-context score's change over it; ``None`` when the scores never do."""
    best = heads.groupby("step")[column].max().sort_index()
    over = best[best > high]
    if over.empty:
        return None
    end = over.index[0]
    under = best[(best.index < end) & (best < low)]
    if under.empty:
        return None
    start = under.index[-1]
    icl = revisions.set_index("step")["icl"].sort_index()
    final = float(icl.iloc[-1])
    improvement = float(icl.loc[start] - icl.loc[end])
    return {
        "score": column,
        "start": int(start),
        "end": int(end),
        "score_start": float(best.loc[start]),
        "score_end": float(best.loc[end]),
        "low": low,
        "high": high,
        "icl_start": float(icl.loc[start]),
        "icl_end": float(icl.loc[end]),
        "icl_final": final,
        "icl_improvement": improvement,
        "icl_fraction": improvement / abs(final) if final else float("nan"),
    }
