"""What each head *is*: uniform baselines and the role table of the head atlas.

A head earns a role label only when its score for that role clears what a head attending
uniformly over the keys it may see would score (the *uniform baseline*) beyond its bootstrap CI,
that is ``lo > baseline``, and carries at least ``threshold`` (default 0.3, Gu et al.'s Sink^eps
epsilon) of its attention there: a head that puts 15% on the previous token, three times the
uniform share, is recorded in the table but not named a previous-token head. A role may register
its own bar (``threshold``): the positional role's is Voita et al.'s 0.9. The copying score has
no CI and no uniform baseline (a random OV circuit scores near 0 with a spread that depends on
the model's width), so it is shown but never a label.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from interp.heads import uniform_baselines as uniform_baselines  # re-exported: the one baseline function
from interp.registry import Registry
from interp.scores import HeadScores

# The roles a head can be named for: the role label, what it means, and the score column it is read from
# (``column``). Order matters: a head's labels are joined in this order, and the viewer preselects the
# strongest head of each role in it.
ROLES: Registry[str] = Registry("role")
ROLES.add("induction", "attends to the token after an earlier copy of the current one", column="induction")
ROLES.add("previous-token", "attends to the previous position", column="prev_token")
ROLES.add("current-token", "attends to its own position", column="current")
ROLES.add("duplicate-token", "attends to earlier copies of the current token", column="duplicate")
ROLES.add("sink", "parks its attention on the first token", column="first_mass")
# what heads write and read (interp.roles): OV roles from weights, encoder heads from patterns
ROLES.add(
    "copy-suppression", "lowers the logit of the token it attends to (McDougall et al.)", column="copy_suppression"
)
ROLES.add("successor", "writes the next item of an ordinal sequence (Gould et al.)", column="successor")
ROLES.add("[CLS]", "attends to [CLS] (Clark et al.)", column="cls")
ROLES.add("[SEP]", "attends to [SEP] (Clark et al.)", column="sep")
ROLES.add("punctuation", "attends to punctuation (Clark et al.)", column="punct")
ROLES.add("next-token", "attends to the next position (Clark et al.)", column="next")
ROLES.add(
    "positional",
    "its largest weight falls on one relative position at least 90% of the time (Voita et al.)",
    column="positional",
    threshold=0.9,
)
ROLES.add("rare-word", "its largest weight falls on the rarest token it sees (Voita et al.)", column="rare_word")
THRESHOLD = 0.3


def role_columns() -> dict[str, str]:
    """``{score column: role label}`` for every registered role, in registration order."""
    return {ROLES.info(role, "column"): role for role in ROLES}


def role_column(role: str) -> str:
    """The score column role ``role`` is read from (a :class:`UsageError` for an unknown role)."""
    return ROLES.info(role, "column")


def role_table(
    scores: HeadScores,
    baselines: Mapping[str, float],
    *,
    threshold: float = THRESHOLD,
    extra: Mapping[str, HeadScores] | None = None,
) -> pd.DataFrame:
    """A row per head: every score with its CI, ``role`` (labels joined by ", "; "" for none).

    ``scores`` holds the attention scores (and ``copying``); ``extra`` adds columns from other
    tables by name, e.g. ``{"": sink_report.heads}`` for ``first_mass`` or ``{"exact_": sweep}``
    for ``exact_importance`` (prefix -> table; every score column and CI bound is copied).
    ``baselines`` gives each role score's uniform value (missing: that role is never labelled).
    """
    table = scores.table.copy()
    for prefix, other in (extra or {}).items():
        keep = [c for c in other.table.columns if c not in ("layer", "head", "label")]
        renamed = other.table[["layer", "head", *keep]].rename(columns={c: prefix + c for c in keep})
        dup = [c for c in renamed.columns if c in table.columns and c not in ("layer", "head")]
        table = table.merge(renamed.drop(columns=dup), on=["layer", "head"], how="left")
    labels = [[] for _ in range(len(table))]
    for role in role_columns().values():
        for i in passes(table, role, baselines, threshold).to_numpy().nonzero()[0]:
            labels[i].append(role)
    table.insert(3, "role", [", ".join(r) for r in labels])
    return table


def passes(table: pd.DataFrame, role: str, baselines: Mapping[str, float], threshold: float = THRESHOLD) -> pd.Series:
    """Which rows (heads) of ``table`` pass ``role``'s rule: the CI's lower bound above the score's
    uniform baseline and a score of at least ``threshold`` (or the role's own bar); all False when
    the table lacks the score or its CI, or ``baselines`` lacks its baseline."""
    col = ROLES.info(role, "column")
    base = baselines.get(col)
    if col not in table or f"{col}_lo" not in table or base is None:
        return pd.Series(False, index=table.index)
    at_least = ROLES.info(role, "threshold", None) or threshold  # a role's own bar (Voita's 0.9)
    return (table[f"{col}_lo"] > base) & (table[col] >= at_least)
