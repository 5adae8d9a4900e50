"""The stream engine's machinery: head statistics at long context without ever forming the
``T x T`` pattern.

Every statistic the analyses report is a sum of softmax weights ``exp(s_qk - lse_q)``; with each
query row's log-sum-exp from a flash-style pass, the weights at known targets are gathered, the row
max gives Voita's confidence, and one more blockwise pass gives every key's received mass. The
model's own attention runs fused meanwhile, so memory grows linearly in ``T``. What to reduce is
the analyses' business (:func:`interp.heads.stream_attention_scores`,
:func:`interp.sinks.stats.stream_sink_statistics`); nothing here imports them.

- :mod:`interp.stream.capture`: post-rotary ``q``, ``k``, ``v`` from a bridge or the toy, fused
  (through the model's adapter, :mod:`interp.adapters`);
- :mod:`interp.stream.blockwise`: the torch passes (the online-softmax reference of
  :mod:`interp.kernels`, column sums, gathered weights);
- :mod:`interp.stream.triton`: the same two passes as Triton kernels;
- :mod:`interp.stream.driver`: the chunked fused run that calls back per layer, and the choice of
  Triton or torch for each pass;
- :mod:`interp.stream.budget`: ``engine="auto"``: stream when a layer's pattern exceeds a budget.

Use it through ``head_scores(..., engine=...)`` and ``sink_scores(..., engine=...)``.
"""

from interp.stream.budget import ENGINES, PATTERN_BUDGET, choose_engine

__all__ = ["ENGINES", "PATTERN_BUDGET", "choose_engine"]
