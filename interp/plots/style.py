"""The toolkit's look: one template, the colour scales of the score families, and the noise floor.

Heatmaps never let a panel pick its own colours: every score belongs to a *family* with one fixed
scale shared by all its panels and drawn as a colour bar (attention masses 0..1; the copying score
-1..1, diverging around 0; ablation importance anchored at 0). On a panel with a noise floor, grey
means "inside the floor" and nothing else: its colour scale holds no grey (:func:`grey_free`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

PRETTY = {
    "prev_token": "previous-token",
    "current": "current-token",
    "duplicate": "duplicate-token",
    "induction": "induction",
    "copying": "copying",
    "first_mass": "first-token mass",
    "sep_mass": "[SEP] mass",
    "importance": "importance",
    "metric_ablated": "metric when ablated",
}
MAX_WIDTH = 1200  # figures fit a 1280-pixel window with its scrollbar and a page's margins
MARK_THRESHOLD = 0.3  # the role rule's effect size: a mark needs the CI above the baseline and this much score
NEUTRAL = "#d5d9de"  # cells inside an importance's noise floor
GREY_CHROMA = 48  # a colour whose channels differ by less than this (of 255) reads as grey beside NEUTRAL
# RdBu_r without its white middle: a diverging scale on which no colour is grey, for panels where grey
# means "inside the noise floor" (the floor's cells are drawn in NEUTRAL, the rest never look like them)
DIVERGING = (
    (0.0, "#053061"),
    (0.25, "#2166ac"),
    (0.5, "#92c5de"),
    (0.5, "#f4a582"),
    (0.75, "#d6604d"),
    (1.0, "#67001f"),
)
# one template for every figure the toolkit draws: heatmaps, bars, curves, the sinks and gate plots;
# strings that look like numbers (head labels "0.1" and "0.10") stay strings, as plotly's own template has it
TEMPLATE = go.layout.Template(
    layout=dict(
        autotypenumbers="strict",
        font=dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=13, color="#1f2933"),
        title=dict(x=0.0, xanchor="left", pad=dict(l=16), font=dict(size=16)),  # padded: a flush title is cut
        paper_bgcolor="white",
        plot_bgcolor="white",
        colorway=["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"],
        xaxis=dict(showline=True, linecolor="#9aa5b1", gridcolor="#eef2f6", zeroline=False, ticks="outside"),
        yaxis=dict(showline=True, linecolor="#9aa5b1", gridcolor="#eef2f6", zeroline=False, ticks="outside"),
        legend=dict(bgcolor="rgba(255,255,255,0.8)"),
        hoverlabel=dict(font=dict(size=12)),
    )
)
DASHES = ("solid", "dash", "dot", "dashdot", "longdash")
SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x")


def styled(fig: go.Figure) -> go.Figure:
    """``fig`` on the toolkit's one :data:`TEMPLATE` (every figure builder ends here)."""
    fig.update_layout(template=TEMPLATE)
    return fig


def title_width(title: str | None, left: int = 70) -> int:
    """The width a figure needs so that its title is not cut off (plain text, about 8 px a character)."""
    import re

    if not title:
        return 0
    longest = max(len(re.sub(r"<[^>]+>", "", line)) for line in re.split(r"<br\s*/?>", title))
    return int(left + 8.5 * longest + 20)


@dataclass(frozen=True)
class Scale:
    """A colour scale shared by every panel of one score family.

    ``zmin``/``zmax`` of ``None`` follow the data; ``anchor`` pins one end at that value (or, when
    the data cross it, centres the ``diverging`` scale on it)."""

    title: str
    colorscale: str | tuple = "Viridis"
    zmin: float | None = None
    zmax: float | None = None
    zmid: float | None = None
    anchor: float | None = None
    diverging: str | tuple = "RdBu_r"

    def limits(self, values: np.ndarray) -> tuple[float, float, float | None, str | tuple]:
        """``(zmin, zmax, zmid, colorscale)`` for these values."""
        finite = values[np.isfinite(values)]
        lo = float(finite.min()) if finite.size else 0.0
        hi = float(finite.max()) if finite.size else 1.0
        if self.anchor is not None:
            a = self.anchor
            if lo < a < hi:  # both signs: diverging around the anchor
                r = max(hi - a, a - lo)
                return a - r, a + r, a, self.diverging
            lo, hi = (a, max(hi, a + 1e-12)) if lo >= a else (min(lo, a - 1e-12), a)
        zmin = lo if self.zmin is None else self.zmin
        zmax = hi if self.zmax is None else self.zmax
        if zmax <= zmin:
            zmax = zmin + 1e-12
        return zmin, zmax, self.zmid, self.colorscale


MASS = Scale("attention mass", zmin=0.0, zmax=1.0)
SIGNED = Scale("copying score", colorscale="RdBu_r", zmin=-1.0, zmax=1.0, zmid=0.0)
IMPORTANCE = Scale("importance", colorscale="Viridis", anchor=0.0, diverging=DIVERGING)
# a patching or path effect: the fraction of the clean-corrupted gap moved, -1..1 whatever the data
# (an effect of 1e-8 is pale, not saturated); no grey on it, for grey marks the noise floor
EFFECT = Scale("effect (fraction of the gap)", colorscale=DIVERGING, zmin=-1.0, zmax=1.0, zmid=0.0)
FAMILIES: dict[str, Scale] = {
    "prev_token": MASS,
    "current": MASS,
    "duplicate": MASS,
    "induction": MASS,
    "first_mass": MASS,
    "sep_mass": MASS,
    "copying": SIGNED,
    "importance": IMPORTANCE,
}


def _rgb(colour: str) -> tuple[float, float, float]:
    from plotly.colors import hex_to_rgb, unlabel_rgb

    return tuple(float(v) for v in (hex_to_rgb(colour) if colour.startswith("#") else unlabel_rgb(colour))[:3])


def colour_at(colorscale: str | Sequence, t: float) -> tuple[float, float, float]:
    """The RGB colour (0..255) that ``colorscale`` (a plotly name or ``[(position, colour), ...]``)
    gives at ``t`` in 0..1, interpolated linearly as plotly.js does; at a repeated position the
    upper colour wins."""
    from plotly.colors import get_colorscale

    stops = [
        (float(p), _rgb(c)) for p, c in (get_colorscale(colorscale) if isinstance(colorscale, str) else colorscale)
    ]
    t = min(1.0, max(0.0, float(t)))
    for (p0, c0), (p1, c1) in zip(stops, stops[1:]):
        if p0 <= t < p1 or (t == p1 == stops[-1][0]):
            w = (t - p0) / (p1 - p0)
            return tuple(a + w * (b - a) for a, b in zip(c0, c1))
    return stops[-1][1] if t >= stops[-1][0] else stops[0][1]


def grey_free(colorscale: str | Sequence, samples: int = 401) -> bool:
    """Whether no colour of ``colorscale`` reads as grey: its channels differ by at least
    :data:`GREY_CHROMA` everywhere (Viridis, Plasma and :data:`DIVERGING` do; Cividis, RdBu_r do not)."""
    return all(max(c) - min(c) >= GREY_CHROMA for c in (colour_at(colorscale, t) for t in np.linspace(0, 1, samples)))


def refuse_greys(scale: Scale, what: str) -> None:
    """Refuse ``scale`` for ``what`` (panels with a noise floor) when a colour of it reads as grey."""
    for cs in (scale.colorscale, scale.diverging if scale.anchor is not None else scale.colorscale):
        if not grey_free(cs):
            raise ValueError(
                f"the colour scale {cs if isinstance(cs, str) else 'given'} of {what} holds greys, and "
                "grey marks the cells inside the noise floor: choose one without (Viridis, Plasma, plots.DIVERGING)"
            )


def short_name(name: str) -> str:
    """A model's name for titles: a local path shortened to its last folder; Hub names as they are."""
    text = str(name).rstrip("/\\")
    if text.startswith(("/", "./", "../", "~")) or text.count("/") >= 2 or "\\" in text:
        return Path(text.replace("\\", "/")).name or text
    return text


def panel_size(n_layers: int, n_heads: int) -> tuple[int, int, int]:
    """``(width, height, cell)`` in pixels of one layer x head panel: cells shrink as models grow."""
    cell = int(min(56, max(12, 420 // max(n_layers, n_heads, 1))))
    return max(160, cell * n_heads), max(150, cell * n_layers), cell


def noise_mask(
    z: np.ndarray, floor: float | None, lo: np.ndarray | None = None, hi: np.ndarray | None = None
) -> np.ndarray:
    """Cells of ``z`` indistinguishable from 0: ``|value| <= floor``, or (with a floor) the CI
    ``[lo, hi]`` reaches 0; none without a floor."""
    if floor is None:
        return np.zeros(z.shape, dtype=bool)
    inside = np.abs(z) <= floor
    if lo is not None and hi is not None:
        inside |= (lo <= 0) & (hi >= 0)
    return inside & np.isfinite(z)


def noise_layer(noise: np.ndarray, x: Sequence, y: Sequence) -> go.Heatmap:
    """The neutral layer drawn under a coloured heatmap: :data:`NEUTRAL` on the cells inside the
    noise floor (``noise``), nothing elsewhere."""
    return go.Heatmap(
        z=np.where(noise, 0.0, np.nan),
        x=x,
        y=y,
        colorscale=[[0, NEUTRAL], [1, NEUTRAL]],
        showscale=False,
        hoverinfo="skip",
        xgap=1,
        ygap=1,
        name="noise",
    )


def cell_text(
    z: np.ndarray,
    lo: np.ndarray | None = None,
    hi: np.ndarray | None = None,
    noise: np.ndarray | None = None,
    baseline: float | None = None,
) -> np.ndarray:
    """Each cell's hover text: its value, its CI when there is one, the ``baseline`` when given, and
    whether it lies inside the noise floor (``noise``)."""
    if lo is None or hi is None:
        text = np.vectorize(lambda v: f"{v:.3g}")(z)
    else:
        text = np.vectorize(lambda v, a, b: f"{v:.3g} [{a:.3g}, {b:.3g}]")(z, lo, hi)
    if baseline is not None:
        text = np.char.add(text.astype(str), f"<br>uniform: {baseline:.3g}")
    if noise is not None and noise.any():
        text = np.where(noise, np.char.add(text.astype(str), "<br>inside the noise floor"), text)
    return text
