"""Head statistics at long context without ever forming the ``T x T`` pattern: the stream engine.

Every statistic the analyses report is a sum of softmax weights ``exp(s_qk - lse_q)``; with each
query row's log-sum-exp from a flash-style pass, the weights at known targets are gathered, the row
max gives Voita's confidence, and one more blockwise pass gives every key's received mass. The
model's own attention runs fused meanwhile (:mod:`interp.stream.capture`), so memory grows
linearly in ``T``.

- :mod:`interp.stream.capture`: post-rotary ``q``, ``k``, ``v`` from a bridge or the toy, fused;
- :mod:`interp.stream.blockwise`: the torch online-softmax passes;
- :mod:`interp.stream.engine`: head and sink statistics in the pattern engine's shapes;
- :mod:`interp.stream.budget`: ``engine="auto"``: stream when a layer's pattern exceeds a budget.

Use it through ``head_scores(..., engine=...)`` and ``sink_scores(..., engine=...)``.
"""

from interp.stream.budget import ENGINES, PATTERN_BUDGET, choose_engine

__all__ = ["ENGINES", "PATTERN_BUDGET", "choose_engine"]
