"""A tiny Chrome DevTools Protocol client over ``--remote-debugging-pipe`` for the browser tests.

Why a pipe and not a websocket or ``--dump-dom``: the pipe needs no port (no collisions between
concurrent test runs), no extra package, and it gives the events a browser test needs to be
honest: uncaught exceptions (``Runtime.exceptionThrown``), console errors
(``Runtime.consoleAPICalled``, ``Log.entryAdded``), JavaScript dialogs (an ``alert()`` fired by
injected markup shows up as ``Page.javascriptDialogOpening``) and network requests
(``Network.requestWillBeSent``), plus ``Runtime.evaluate`` and ``Page.captureScreenshot``.

Chromium reads NUL-terminated JSON messages on fd 3 and writes them on fd 4.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
# Flags that work for headless Chromium in a container without GPU or sandbox, minus --screenshot
# (CDP takes the screenshots).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """Return the path of a Chromium binary on PATH, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLog:
    """What the page did while it was open."""

    exceptions: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


class Browser:
    """One headless Chromium with one page, driven over the DevTools pipe."""

    def __init__(self, binary: str, *, width: int = 1400, height: int = 900) -> None:
        self._profile = tempfile.mkdtemp(prefix="fsdpviz-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium expects its read end on fd 3 and its write end on fd 4.
        # Move both ends above 4 first: os.pipe() may itself have returned 3 or 4.
        def _setup_fds() -> None:
            read_end = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3, inheritable=True)
            os.dup2(write_end, 4, inheritable=True)

        self._proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={self._profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # close_fds would close 3 and 4 after preexec_fn ran; the pipe ends are
            # non-inheritable, so only the dup2'ed copies reach Chromium.
            preexec_fn=_setup_fds, close_fds=False,  # noqa: PLW1509 - the test process starts no threads first
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.log = PageLog()
        self._width, self._height = width, height
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self._session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    # --- protocol -------------------------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")

    def _read_message(self, timeout_s: float) -> dict[str, Any] | None:
        import select

        deadline = time.monotonic() + timeout_s
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _record(self, message: dict[str, Any]) -> None:
        method = message.get("method", "")
        params = message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text", "")
            self.log.exceptions.append(str(text))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.log.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                                    for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.log.console_errors.append(params["entry"].get("text", ""))
        elif method == "Page.javascriptDialogOpening":
            self.log.dialogs.append(params.get("message", ""))
            self._send({"id": self._new_id(), "method": "Page.handleJavaScriptDialog",
                        "params": {"accept": True}, "sessionId": self._session})
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if not url.startswith("data:"):  # inline images (bokeh's toolbar icons) are no request
                self.log.requests.append(url)
        self._events.append(message)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def call(self, method: str, *, session: bool = False, timeout_s: float = 60.0,
             **params: Any) -> dict[str, Any]:
        """Send one command and return its result, recording the events that arrive meanwhile."""
        msg_id = self._new_id()
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        self._send(message)
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._read_message(max(0.0, deadline - time.monotonic()))
            if reply is None:
                raise TimeoutError(f"no reply to {method} within {timeout_s} s")
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._record(reply)

    def pump(self, seconds: float) -> None:
        """Process events for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            message = self._read_message(left)
            if message is not None:
                self._record(message)

    # --- page helpers ---------------------------------------------------------------------------
    def open(self, url: str, *, timeout_s: float = 60.0) -> None:
        """Navigate and wait for the load event."""
        self.call("Page.navigate", session=True, url=url)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self._read_message(deadline - time.monotonic())
            if message is None:
                break
            self._record(message)
            if message.get("method") == "Page.loadEventFired":
                return
        raise TimeoutError(f"{url} did not load within {timeout_s} s")

    def evaluate(self, expression: str) -> Any:
        """Evaluate a JavaScript expression in the page and return its value (JSON-able)."""
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluate failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout_s: float = 60.0, poll_s: float = 0.25) -> Any:
        """Poll ``expression`` until it is truthy; return its last value (falsy on timeout)."""
        deadline = time.monotonic() + timeout_s
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            self.pump(poll_s)
        return value

    def screenshot(self, path: Path, *, full_page: bool = False, clip: dict[str, float] | None = None) -> Path:
        """Save a PNG screenshot of the viewport (or the whole page / a clip) to ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
        if clip is not None:
            params["captureBeyondViewport"] = True
            params["clip"] = {"scale": 1, **clip}
        data = self.call("Page.captureScreenshot", session=True, **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._send({"id": self._new_id(), "method": "Browser.close"})
            self._proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - best effort; fall back to killing our own child
            self._proc.kill()
            self._proc.wait(timeout=10)
        finally:
            os.close(self._to_chrome)
            os.close(self._from_chrome)
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
