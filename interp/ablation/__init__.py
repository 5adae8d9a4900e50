"""Head ablation (being split into one module per concern; for now it all lives in ``engine``)."""

from interp.ablation.engine import *  # noqa: F403
