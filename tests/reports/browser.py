"""A tiny headless-Chromium driver over the DevTools protocol on pipes (--remote-debugging-pipe).

No websocket and no third-party client: Chromium reads NUL-terminated JSON commands from fd 3
and writes replies/events to fd 4. Used to check that a report loads from file:// with no
console errors and no network requests, that every chart rendered, and to take a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-pipe", "--window-size=1280,900")
# Requests a file:// page may legitimately make without touching the network.
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")


def find_chromium() -> str | None:
    for path in CHROMIUM_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("chromium")


@dataclass
class PageReport:
    console_errors: list[str] = field(default_factory=list)  # console.error + exceptions + log
    requests: list[str] = field(default_factory=list)  # every URL the page requested
    charts: list[dict[str, Any]] = field(default_factory=list)  # per chart div: id, svg children
    provenance: str = ""  # the text of the page's #provenance block ('' if absent)
    screenshot: Path | None = None

    @property
    def network_requests(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(LOCAL_SCHEMES)]


class _Pipe:
    def __init__(self, binary: str, user_data_dir: str) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire() -> None:  # in the child: the protocol fds are 3 (in) and 4 (out)
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        # preexec_fn (not thread-safe) runs before any test thread starts a browser: the
        # DevTools pipe must sit on fds 3 and 4 of the child
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={user_data_dir}"], pass_fds=(3, 4),
            preexec_fn=wire,  # noqa: PLW1509
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def _recv(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_chrome], [], [], max(left, 0))
            if not ready:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed the pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return dict(json.loads(msg))

    def call(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = 20.0) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def wait_event(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if any(e.get("method") == name for e in self.events):
            return
        while True:
            ev = self._recv(deadline)
            self.events.append(ev)
            if ev.get("method") == name:
                return

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._recv(deadline))
        except TimeoutError:
            pass

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (TimeoutError, EOFError, RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


_CHART_PROBE = """
Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => {
  const svgs = d.querySelectorAll('svg.main-svg');
  let kids = 0; svgs.forEach(s => { kids += s.querySelectorAll('*').length; });
  const marks = d.querySelectorAll('.trace, .heatmaplayer image, .bars path, .scatterlayer path');
  return {id: d.id, svg: svgs.length, svg_elements: kids, marks: marks.length,
          canvas: d.querySelectorAll('canvas').length};
})
"""


_PROVENANCE_PROBE = "(document.getElementById('provenance') || {innerText: ''}).innerText"


def inspect_page(html: Path, screenshot: Path | None = None, timeout: float = 40.0) -> PageReport:
    """Load `html` from file:// in headless Chromium; collect errors, requests, charts."""
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("chromium is not installed")
    report = PageReport()
    with tempfile.TemporaryDirectory(prefix="vegas-chromium-") as profile:
        pipe = _Pipe(binary, profile)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget",
                                {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Network", "Log"):
                pipe.call(f"{domain}.enable", session=session)
            pipe.call("Page.navigate", {"url": html.resolve().as_uri()}, session=session)
            pipe.wait_event("Page.loadEventFired", timeout)
            pipe.drain(1.0)  # late console messages and requests after load
            probe = pipe.call("Runtime.evaluate", {"expression": _CHART_PROBE,
                                                   "returnByValue": True}, session=session)
            report.charts = list(probe["result"].get("value") or [])
            block = pipe.call("Runtime.evaluate", {"expression": _PROVENANCE_PROBE,
                                                   "returnByValue": True}, session=session)
            report.provenance = str(block["result"].get("value") or "")
            if screenshot is not None:
                shot = pipe.call("Page.captureScreenshot",
                                 {"format": "png", "captureBeyondViewport": True},
                                 session=session, timeout=timeout)
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
                report.screenshot = screenshot
        finally:
            pipe.close()
    for ev in pipe.events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Network.requestWillBeSent":
            report.requests.append(params["request"]["url"])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            report.console_errors.append(
                " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            report.console_errors.append(str(params["exceptionDetails"]))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            report.console_errors.append(str(params["entry"].get("text")))
    return report
