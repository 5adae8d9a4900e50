"""Attention sinks: which heads dump attention, on which tokens, and the massive activations behind them.

Definitions (``A`` is a head's attention pattern on one sequence of ``T`` tokens, rows are queries
``i``, columns keys ``k``; a query *sees* key ``k`` when ``k <= i`` for causal models, always for
encoders; ``n_k`` is how many queries see ``k``: ``T - k`` causal, ``T`` encoder):

- **sink mass** of key ``k`` (Gu et al. 2024, ``alpha_k``): the mean attention the queries that see
  ``k`` give it, ``alpha_k = sum_i A[i, k] / n_k``, averaged over the probe's sequences.
  ``first_mass`` is ``alpha_0``: the first token, which is the BOS of a causal model that has one
  and ``[CLS]`` for an encoder; ``sep_mass`` (encoders) is ``alpha`` at the ``[SEP]`` position.
  ``top_other_mass`` / ``top_other_pos`` are the largest ``alpha_k`` over the other positions seen
  by at least ``min_queries`` queries, and the ``positions`` table summarises ``alpha_k`` over heads
  for every position of every layer.
- **Sink_k^eps** (Gu et al.): the share of heads whose ``alpha_k`` exceeds ``epsilon`` (0.3), per
  layer and for the whole model (the mean over layers of the per-layer share).
- **sink discovery**: for every token occurrence, the attention it draws relative to a head that
  attends uniformly over what each query sees (``alpha_k`` over its uniform value
  ``mean_{i sees k} 1 / (#keys i sees)``), averaged over all heads of all layers; occurrences are
  grouped by token and *role* (``first``, ``BOS``, ``[CLS]``, ``[SEP]``, ``punctuation``,
  ``newline``, ``space``, ``special``, ``word``) and ranked. Only keys seen by at least
  ``min_queries`` queries count: the last few keys of a causal sequence are seen by so few queries
  that a local (previous-token) head makes them look like sinks. ``sink_head_share`` is the share
  of heads that *dump* on the occurrence: ``alpha_k > epsilon`` and ``alpha_k >= sink_ratio`` times
  the uniform value. An occurrence (or, on average, a token) is a sink when its attention ratio
  reaches ``sink_ratio`` (3) or at least one head dumps on it (a share of at least ``1 / #heads``):
  averaged over all heads, one dumping head among many is diluted below any ratio.
- **sink positions** of a sequence: the first position, the ``[SEP]`` of an encoder, and every
  occurrence that is a sink.
- **value norms**: ``value_norm_first`` is the mean ``||v_0||`` of the head's value vector at the
  first position, ``value_norm_other`` its mean over the other body positions, and
  ``value_norm_ratio`` their ratio. ``first_mass_by_norm`` is ``first_mass * value_norm_ratio``:
  the first token's attention weighted by how much its value carries, in units of an ordinary
  token's value (the norm-based view of Kobayashi et al. 2020, before ``W_O``). A head that *parks*
  attention has a large ``first_mass`` but a small ``value_norm_ratio`` and ``first_mass_by_norm``;
  a head that reads the first token's content has both large.
- **confidence** (Voita et al. 2019): the mean over queries of the largest attention weight;
  ``confidence_no_first`` takes the largest weight among keys other than the first position (not
  renormalised). Both average over the queries that see at least two keys (causal: ``i >= 1``).
- **massive activations** (Sun et al. 2024, the definition their code applies): residual-stream
  entries (``blocks.{l}.hook_resid_post``, so ``layer`` is the block whose output holds them) with
  ``|x| > abs_threshold`` (100) and ``|x| > rel_threshold`` (1000) times the median ``|x|`` of the
  sequence's whole layer output (every real position and dimension; padded slots left out).
  ``magnitude_ratio`` is ``|x|`` over that median. Not the median of the entry's own hidden state: a
  BOS whose state holds several large dimensions has a median far above the layer's and would hide
  them. Per layer the *outlier ratio* ``max_d |x|`` of a position over that layer median is averaged
  over sink positions and over the other positions, next to the largest three magnitudes and the
  median of each sequence.

Memory: the hooks reduce each layer's ``[batch, head, T, T]`` pattern to per-key sums and per-query
maxima as it is produced, value vectors to their norms and residuals to per-position maxima and
medians (plus the few massive entries): everything kept across layers is linear in ``T``. The
forward pass stops after the last layer's residual output. (The TransformerBridge itself keeps
each layer's pattern on its attention module; :func:`interp.adapters.run_with_reducers` drops it once the layer
is done, see ``analyses/bench_sinks.py``.)
"""

from typing import TYPE_CHECKING

from interp._lazy import lazy

# names load on first use, so `python -m interp.sinks` can set its Ctrl-C handler before torch loads
__getattr__, __dir__, __all__ = lazy(
    __name__,
    {
        "first_mass_heatmap": "interp.sinks.figures",
        "residual_curves": "interp.sinks.figures",
        "sink_rate_bars": "interp.sinks.figures",
        "SinkReport": "interp.sinks.report",
        "sink_scores": "interp.sinks.report",
        "validate_sink_scores": "interp.sinks.report",
        "ABS_THRESHOLD": "interp.sinks.stats",
        "EPSILON": "interp.sinks.stats",
        "MAX_MASSIVE_PER_LAYER": "interp.sinks.stats",
        "MIN_QUERIES": "interp.sinks.stats",
        "REL_THRESHOLD": "interp.sinks.stats",
        "SINK_RATIO": "interp.sinks.stats",
        "SinkStatistics": "interp.sinks.stats",
        "queries_per_key": "interp.sinks.stats",
        "sink_statistics": "interp.sinks.stats",
        "uniform_mass": "interp.sinks.stats",
        "sink_summary": "interp.sinks.summary",
        "token_texts": "interp.sinks.tables",
    },
)

if TYPE_CHECKING:  # what editors and type checkers see
    from interp.sinks.figures import first_mass_heatmap as first_mass_heatmap
    from interp.sinks.figures import residual_curves as residual_curves
    from interp.sinks.figures import sink_rate_bars as sink_rate_bars
    from interp.sinks.report import SinkReport as SinkReport
    from interp.sinks.report import sink_scores as sink_scores
    from interp.sinks.report import validate_sink_scores as validate_sink_scores
    from interp.sinks.stats import ABS_THRESHOLD as ABS_THRESHOLD
    from interp.sinks.stats import EPSILON as EPSILON
    from interp.sinks.stats import MAX_MASSIVE_PER_LAYER as MAX_MASSIVE_PER_LAYER
    from interp.sinks.stats import MIN_QUERIES as MIN_QUERIES
    from interp.sinks.stats import REL_THRESHOLD as REL_THRESHOLD
    from interp.sinks.stats import SINK_RATIO as SINK_RATIO
    from interp.sinks.stats import SinkStatistics as SinkStatistics
    from interp.sinks.stats import queries_per_key as queries_per_key
    from interp.sinks.stats import sink_statistics as sink_statistics
    from interp.sinks.stats import uniform_mass as uniform_mass
    from interp.sinks.summary import sink_summary as sink_summary
    from interp.sinks.tables import token_texts as token_texts
