"""Plotly figures of head tables: layer x head heatmaps, bar charts and curves.

Heatmaps never let a panel pick its own colours: every score belongs to a *family* with one fixed
scale shared by all its panels and drawn as a colour bar (attention masses 0..1; the copying score
-1..1, diverging around 0; ablation importance anchored at 0). Panels are sized by the model's
number of layers and heads and wrap into rows that fit a 1280-pixel window. On a panel with a noise
floor, grey means "inside the floor" and nothing else: its colour scale holds no grey (:func:`grey_free`).

Every figure is saved as interactive, self-contained HTML (plotly.js inlined, atomically), and as PNG too when a Chrome or Chromium is
available (:mod:`interp.browser`); when none is, :func:`save_figure` says so once, in one line.

The figures take data (tidy tables, grids, the meta of a run), never a result class: results draw
themselves by calling these. The parts: :mod:`~interp.plots.style` (the template, the colour scales,
the noise floor), :mod:`~interp.plots.grid` (the layer x head heatmap), :mod:`~interp.plots.charts`
(named rows and columns, bars, curves) and :mod:`~interp.plots.files` (HTML and PNG on disk).
"""

from interp.plots.charts import bars as bars
from interp.plots.charts import curves as curves
from interp.plots.charts import labelled_heatmap as labelled_heatmap
from interp.plots.files import save_figure as save_figure
from interp.plots.files import save_png as save_png
from interp.plots.grid import PerHead as PerHead
from interp.plots.grid import heatmap as heatmap
from interp.plots.grid import inside_noise as inside_noise
from interp.plots.style import DIVERGING as DIVERGING
from interp.plots.style import EFFECT as EFFECT
from interp.plots.style import FAMILIES as FAMILIES
from interp.plots.style import IMPORTANCE as IMPORTANCE
from interp.plots.style import MARK_THRESHOLD as MARK_THRESHOLD
from interp.plots.style import MASS as MASS
from interp.plots.style import MAX_WIDTH as MAX_WIDTH
from interp.plots.style import NEUTRAL as NEUTRAL
from interp.plots.style import PRETTY as PRETTY
from interp.plots.style import SIGNED as SIGNED
from interp.plots.style import TEMPLATE as TEMPLATE
from interp.plots.style import Scale as Scale
from interp.plots.style import cell_text as cell_text
from interp.plots.style import colour_at as colour_at
from interp.plots.style import grey_free as grey_free
from interp.plots.style import noise_layer as noise_layer
from interp.plots.style import noise_mask as noise_mask
from interp.plots.style import panel_size as panel_size
from interp.plots.style import refuse_greys as refuse_greys
from interp.plots.style import short_name as short_name
from interp.plots.style import styled as styled
from interp.plots.style import title_width as title_width
