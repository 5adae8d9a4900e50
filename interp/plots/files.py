"""Figures on disk: self-contained HTML always, PNG when a Chrome or Chromium is here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import plotly.graph_objects as go

from interp._io import atomic_write, writing
from interp.browser import NO_BROWSER, figure_png, find_browser
from interp.plots.style import styled

_PNG_NOTE: list[str] = []  # why PNGs are not written, said once per process


def save_png(fig: go.Figure, path: str | Path) -> Path | None:
    """Write ``fig`` as a PNG at ``path`` through a Chrome/Chromium found here; ``None`` when none is.

    The first failure (no browser, or the export failing) is said once, in one line on stderr, and
    later calls skip the attempt. ``INTERP_PNG=0`` in the environment turns PNG export off (the
    tests do, to stay fast).
    """
    if (
        _PNG_NOTE or os.environ.get("INTERP_PNG", "1") == "0" or not writing()
    ):  # not on the other ranks of a torchrun run
        return None
    browser = find_browser()
    try:
        if browser is None:
            raise RuntimeError(NO_BROWSER)
        return atomic_write(Path(path), figure_png(fig, browser))
    except RuntimeError as e:
        _PNG_NOTE.append(str(e))
        print(f"PNG export skipped: {' '.join(str(e).split())}", file=sys.stderr)
        return None


def save_figure(
    fig: go.Figure, out_dir: str | Path, stem: str, *, png: bool = True, overwrite: bool = False
) -> list[Path]:
    """Write ``<stem>.html`` (always) and ``<stem>.png`` (see :func:`save_png`); return the paths.

    The HTML is self-contained: plotly.js (about 4.8 MB) is inlined, so the file renders offline
    wherever it is moved or mailed. The figure is put on the toolkit's :data:`TEMPLATE`. Writing
    over an earlier ``<stem>.html`` refuses unless ``overwrite`` (a command replaces its own).
    """
    from interp.saving import claim

    html_path, png_path = claim(Path(out_dir), [f"{stem}.html", f"{stem}.png"], overwrite=overwrite)
    styled(fig)
    html = fig.to_html(include_plotlyjs=True, full_html=True, config={"displaylogo": False})
    written = [atomic_write(html_path, html)]
    image = save_png(fig, png_path) if png else None
    return written + ([image] if image else [])
