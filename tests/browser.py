"""A headless Chromium driven over the DevTools protocol: open a page, collect console errors and
uncaught exceptions, wait for plotly to draw, take a screenshot. One browser serves many pages."""

from __future__ import annotations

import base64
import io
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from interp.browser import headless_args

PLOTS_DRAWN = """(() => {
  const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));
  const ready = divs.length > 0 || document.body?.dataset.ready === '1';  // a page drawn without plotly says so
  return ready && divs.every(d => d._fullLayout && d.querySelector('.main-svg'));
})()"""


@dataclass
class PageVisit:
    url: str
    errors: list[str] = field(default_factory=list)
    png: bytes = b""
    drawn: bool = False
    value: object = None  # what ``script`` returned
    shots: dict[str, bytes] = field(default_factory=dict)  # screenshots taken by ("shot", name) steps
    values: dict[str, object] = field(default_factory=dict)  # what ("eval", name, js) steps returned


class Chromium:
    def __init__(self, executable: str, timeout: float = 30.0):
        import websocket  # websocket-client

        self.timeout = timeout
        self.profile = Path(tempfile.mkdtemp(prefix="interp-browser-"))
        cmd = headless_args(executable, self.profile) + ["--remote-debugging-port=0", "about:blank"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{executable} did not open its DevTools port")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=timeout, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        msg_id = next(self.ids)
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _drain(self, session: str, visit: PageVisit, until: str | None = None, wait: float = 0.0) -> bool:
        """Read events (those queued first) into ``visit.errors``; stop at ``until`` or after ``wait`` s."""
        deadline = time.monotonic() + (wait if until is None else self.timeout)
        seen = False
        while True:
            if self.events:
                event = self.events.pop(0)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return seen
                self.ws.settimeout(left)
                try:
                    event = json.loads(self.ws.recv())
                except Exception:  # the socket's timeout: nothing more came
                    return seen
                finally:
                    self.ws.settimeout(self.timeout)
            if event.get("sessionId") != session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = params["exceptionDetails"]
                visit.errors.append(f"uncaught: {d.get('exception', {}).get('description') or d.get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                visit.errors.append(
                    "console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                visit.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}".strip())
            if until is not None and method == until:
                seen = True
                deadline = time.monotonic()  # keep what is already queued, then stop

    def visit(
        self,
        url: str,
        *,
        width: int = 1400,
        height: int = 1000,
        script: str | None = None,
        draw_timeout: float | None = None,
        steps: list[tuple] = (),
    ) -> PageVisit:
        """Load ``url`` in a fresh tab, wait for every plotly figure, run ``script`` (its value, awaited
        if a promise, lands in ``visit.value``), screenshot the window."""
        visit = PageVisit(url)
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        try:
            for domain in ("Runtime", "Log", "Page"):
                self.send(f"{domain}.enable", session=session)
            self.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            self.send("Page.navigate", {"url": url}, session=session)
            if not self._drain(session, visit, until="Page.loadEventFired"):
                visit.errors.append(f"the page did not finish loading in {self.timeout:g}s")
            deadline = time.monotonic() + (self.timeout if draw_timeout is None else draw_timeout)
            while time.monotonic() < deadline and not visit.drawn:
                visit.drawn = self.evaluate(PLOTS_DRAWN, session)
                self._drain(session, visit, wait=0.1)
            if script:
                visit.value = self.evaluate(script, session)
                self._drain(session, visit, wait=0.2)
            for step in steps:
                self._step(step, session, visit)
            shot = self.send("Page.captureScreenshot", {"format": "png"}, session=session)
            visit.png = base64.b64decode(shot["data"])
            self._drain(session, visit, wait=0.2)
        finally:
            self.send("Target.closeTarget", {"targetId": target})
        return visit

    def _step(self, step: tuple, session: str, visit: PageVisit) -> None:
        """One user action, as the real input pipeline delivers it: ``("hover", css)`` moves the mouse
        to the element's centre, ``("click", css)`` clicks there, ``("click_at", js)`` clicks where a
        script's ``[x, y]`` (window pixels) says, ``("shot", name)`` takes a screenshot,
        ``("eval", name, js)`` keeps a script's value."""
        kind = step[0]
        if kind in ("hover", "click", "click_at"):
            where = (
                step[1]
                if kind == "click_at"
                else f"(() => {{ const e = document.querySelector({json.dumps(step[1])}); if (!e) return null;"
                " const r = e.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()"
            )
            xy = self.evaluate(where, session)
            if xy is None:
                raise RuntimeError(f"no element {step[1]!r} to {kind}")
            x, y = xy
            self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y}, session=session)
            if kind != "hover":
                for t in ("mousePressed", "mouseReleased"):
                    params = {"type": t, "x": x, "y": y, "button": "left", "clickCount": 1}
                    self.send("Input.dispatchMouseEvent", params, session=session)
        elif kind == "shot":
            shot = self.send("Page.captureScreenshot", {"format": "png"}, session=session)
            visit.shots[step[1]] = base64.b64decode(shot["data"])
        elif kind == "eval":
            visit.values[step[1]] = self.evaluate(step[2], session)
        else:
            raise ValueError(f"unknown step {kind!r}")
        self._drain(session, visit, wait=0.1)

    def evaluate(self, expression: str, session: str):
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        result = self.send("Runtime.evaluate", params, session=session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}...: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def close(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


def ink(png: bytes) -> tuple[float, int]:
    """How much of a screenshot is not background: the share of pixels unlike the commonest colour,
    and the number of distinct colours."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 24)
    total = img.width * img.height
    background = max(colours)[0]
    return 1.0 - background / total, len(colours)


# The page's layout as the browser laid it out: the viewport, how wide the document is, every element
# that scrolls sideways, and the box of every piece of visible text (HTML text and SVG text alike), cut
# to the boxes of the elements that clip it (a scrolling table's rows below its fold are not seen).
LAYOUT = r"""(() => {
  const box = r => [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY];
  const clip = (el, r) => { let [x0, y0, x1, y1] = [r.left, r.top, r.right, r.bottom];
    for (let e = el.parentElement; e && e !== document.body; e = e.parentElement) {
      const s = getComputedStyle(e);
      if (s.overflowX === 'visible' && s.overflowY === 'visible') continue;
      const c = e.getBoundingClientRect();
      [x0, y0, x1, y1] = [Math.max(x0, c.left), Math.max(y0, c.top), Math.min(x1, c.right), Math.min(y1, c.bottom)]; }
    return {left: x0, top: y0, right: x1, bottom: y1, width: x1 - x0, height: y1 - y0}; };
  const shown = el => { for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
      const s = getComputedStyle(e);
      if (s.display === 'none' || s.visibility === 'hidden' || +s.opacity === 0) return false; }
    return true; };
  const texts = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const p = n.parentElement;
    if (!n.data.trim() || !p || p.closest('script, style, svg, option') || !shown(p)) continue;
    const range = document.createRange(); range.selectNodeContents(n);
    for (const whole of range.getClientRects()) {
      const r = clip(p, whole);
      if (r.width > 0 && r.height > 0) texts.push({text: n.data.trim().slice(0, 40), box: box(r), svg: false}); }
  }
  for (const t of document.querySelectorAll('svg text')) {
    const r = t.getBoundingClientRect();
    if (t.textContent.trim() && r.width > 0 && r.height > 0 && shown(t))
      texts.push({text: t.textContent.trim().slice(0, 40), box: box(r), svg: true});
  }
  const scrollers = [];
  for (const e of document.querySelectorAll('body *')) {
    const s = getComputedStyle(e);
    if (['auto', 'scroll'].includes(s.overflowX) && e.scrollWidth > e.clientWidth + 1) {
      const r = e.getBoundingClientRect();
      scrollers.push({tag: e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ')[0] : ''),
                      top: r.top + scrollY, scroll: e.scrollWidth, client: e.clientWidth});
    }
  }
  return {width: innerWidth, height: innerHeight, scroll: document.documentElement.scrollWidth, scrollers, texts};
})()"""


def overlaps(texts: list[dict], tolerance: float = 2.0, clearance: float = 4.0) -> list[tuple[str, str]]:
    """Pairs of text boxes that overlap by more than ``tolerance`` pixels both ways. Two pieces of a
    figure's text (SVG) must not overlap at all, and one above the other must stay ``clearance``
    pixels apart: an axis title that touches the next panel's title counts. A sweep along x."""
    items = sorted(texts, key=lambda t: t["box"][0])
    found = []
    for i, a in enumerate(items):
        ax0, ay0, ax1, ay1 = a["box"]
        for b in items[i + 1 :]:
            bx0, by0, bx1, by1 = b["box"]
            svg = a["svg"] and b["svg"]
            across = tolerance if not svg else 0.5
            if bx0 >= ax1 - across:
                break
            down = tolerance if not svg else -clearance
            if min(ax1, bx1) - max(ax0, bx0) > across and min(ay1, by1) - max(ay0, by0) > down:
                found.append((a["text"], b["text"]))
    return found


def layout_problems(layout: dict) -> list[str]:
    """What a reader would see wrong in :data:`LAYOUT`'s answer: a page or a box on its first screen
    that scrolls sideways, and text boxes that overlap."""
    problems = []
    if layout["scroll"] > layout["width"]:
        problems.append(f"the page scrolls sideways: {layout['scroll']} px wide in a {layout['width']} px window")
    for s in layout["scrollers"]:
        if s["top"] < layout["height"]:
            problems.append(f"{s['tag']} on the first screen scrolls sideways: {s['scroll']} px in {s['client']} px")
    pairs = overlaps(layout["texts"])
    if pairs:
        problems.append(f"{len(pairs)} overlapping text boxes, e.g. {pairs[:4]}")
    return problems
