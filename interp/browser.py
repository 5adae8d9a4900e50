"""A Chrome or Chromium on this machine: found, and used headless to turn a figure into a PNG.

Static export of plotly figures needs a browser. :func:`find_browser` looks at ``BROWSER_PATH``
(the variable kaleido and choreographer honour), then for the usual names on ``PATH``
(``chromium``, ``chromium-browser``, ``google-chrome``, ...). :func:`figure_png` renders a figure
with kaleido when it is installed (pointed at the browser found here), and otherwise by asking the
browser itself for a screenshot of the figure's page.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

from interp.interrupts import deferred, end_process_group, remove_tree

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
NO_BROWSER = "no Chrome or Chromium found: install one (Debian: apt-get install chromium) or set BROWSER_PATH"


def find_browser() -> str | None:
    """The path of a Chrome/Chromium executable, or ``None``: ``BROWSER_PATH`` first, then ``PATH``."""
    env = os.environ.get("BROWSER_PATH")
    if env:
        return env if Path(env).is_file() and os.access(env, os.X_OK) else None
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def headless_args(browser: str, profile: str | Path) -> list[str]:
    """The command line of a headless browser with its own throw-away profile folder."""
    return [
        browser,
        "--headless",
        "--no-sandbox",  # root in containers and CI
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--no-default-browser-check",
        f"--user-data-dir={profile}",
    ]


def figure_png(fig: Any, browser: str, *, timeout: float = 60.0) -> bytes:
    """The figure as PNG bytes, at its layout's width and height.

    Uses kaleido when importable (told where the browser is through ``BROWSER_PATH``), else a
    headless screenshot of a page that holds only the figure. Raises ``RuntimeError`` on failure.
    """
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return screenshot_png(fig, browser, timeout=timeout)
    previous = os.environ.get("BROWSER_PATH")
    os.environ["BROWSER_PATH"] = browser
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fig.to_image(format="png")
    except Exception as e:  # kaleido's own errors: no usable browser, a crash, a timeout
        raise RuntimeError(f"kaleido could not export a PNG with {browser}: {e}") from e
    finally:
        if previous is None:
            os.environ.pop("BROWSER_PATH", None)
        else:
            os.environ["BROWSER_PATH"] = previous


def screenshot_png(fig: Any, browser: str, *, timeout: float = 60.0) -> bytes:
    """The figure as PNG bytes from the browser's own ``--screenshot`` of a page that holds only it.

    The page and the browser's throw-away profile live in a temporary folder. The browser runs in
    its own process group: however this ends (done, failed, timed out, Ctrl-C), the browser and
    every helper process it started are killed and the folder is removed before this returns or
    raises (see :mod:`interp.interrupts`).
    """
    width = int(fig.layout.width or 900)
    height = int(fig.layout.height or 500)
    page = fig.to_html(
        include_plotlyjs=True, full_html=True, config={"staticPlot": True, "displayModeBar": False}
    ).replace("<body>", '<body style="margin:0">', 1)
    tmp: Path | None = None
    try:
        with deferred():  # the folder is made and its name kept, or neither
            tmp = scratch_folder()
        html, png = tmp / "figure.html", tmp / "figure.png"
        html.write_text(page, encoding="utf-8")
        cmd = headless_args(browser, tmp / "profile") + [
            f"--window-size={width},{height}",
            "--virtual-time-budget=10000",  # let plotly draw before the shot
            f"--screenshot={png}",
            html.as_uri(),
        ]
        code, stderr = run_browser(cmd, timeout=timeout, tmp=tmp)
        if not png.is_file():
            last = (stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{browser} wrote no screenshot (exit {code}): {last}")
        return png.read_bytes()
    finally:
        if tmp is not None:
            with deferred():
                remove_tree(tmp)


SOCKET_ROOM = 40
"""The longest temporary folder the scratch folder is made in: the browser puts a socket under
``$TMPDIR``, and a socket's path holds at most 107 bytes (a longer one makes the browser abort)."""


def scratch_folder() -> Path:
    """A new temporary folder ``interp-png-*`` for a page, a browser profile and the browser's own
    temporary files: in the usual temporary folder, or in ``/tmp`` when that one's path is too long
    for the browser's sockets (:data:`SOCKET_ROOM`)."""
    base = tempfile.gettempdir()
    if len(base) > SOCKET_ROOM and os.access("/tmp", os.W_OK):
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix="interp-png-", dir=base))


def run_browser(cmd: list[str], *, timeout: float, tmp: Path) -> tuple[int, bytes]:
    """Run a headless browser to its end: its exit code and stderr. Its temporary files go under
    ``tmp`` (its ``TMPDIR``: a killed browser leaves them there, not in the system's temporary
    folder). It runs in a process group of its own, so a terminal's Ctrl-C reaches this process
    alone, and the whole group is killed on the way out, whatever the way (a ``RuntimeError`` when
    it cannot start or runs past ``timeout``)."""
    proc: subprocess.Popen | None = None
    env = {**os.environ, "TMPDIR": str(tmp)}
    try:
        with deferred():  # started and remembered, or not started
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        _, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"{cmd[0]} could not take a screenshot: {e}") from e
    finally:
        if proc is not None:
            with deferred():
                end_process_group(proc)
