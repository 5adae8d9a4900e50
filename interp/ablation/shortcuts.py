"""Exact shortcuts of the replay engine, each a context manager around a replay.

- :func:`reused_attention`: the replay for heads of layer ``l`` starts at block ``l``, whose input is
  the clean pass's. Its attention output is then the clean one plus the ablated heads' change,
  ``sum_h (r_h - z_h) W_O[h]`` (attention output is linear in ``hook_z``): the block's attention
  module returns that instead of recomputing queries, keys, values and patterns.
- :func:`trimmed_mlp`: the last block's MLP sees only the positions the metric reads (an MLP is
  positionwise); elsewhere its output is 0, and those positions of the final residual are never read.

Both touch model modules, so they live with the model adapters (:mod:`interp.adapters.patch`); this
module names them for the replay.
"""

from interp.adapters.patch import head_outputs, reused_attention, trimmed_mlp

__all__ = ["head_outputs", "reused_attention", "trimmed_mlp"]
