"""Re-create the compare-page screenshots of docs/tutorial-wrap-policies.md with headless Chromium.

    examples/compare_wrap_policies.sh runs/wrap-policies
    python docs/images/compare_screenshots.py runs/wrap-policies/compare.html

Each section of the page is captured on its own, scaled to 1000 px wide and quantised to 256
colours so that every image stays well under 200 KB.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "browser"))

from cdp import Browser, find_chromium  # a test helper, not part of the package
from shots import READY, SECTION_BOX, save_png

OUT = Path(__file__).resolve().parent
WIDTH_PX = 1000
# section id -> (image name, tallest part kept in page pixels, None = all of it)
SECTIONS = {
    "headline": ("compare-headline.png", None),
    "findings": ("compare-findings.png", None),
    "structure": ("compare-structure.png", None),
    "units": ("compare-units.png", 900),
    "timelines": ("compare-timelines.png", None),
}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    page = Path(sys.argv[1]).resolve()
    chromium = find_chromium()
    if chromium is None:
        sys.exit("error: headless Chromium not found (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp, Browser(chromium, width=1300, height=900) as browser:
        browser.open(page.as_uri())
        if not browser.wait_for(READY, timeout_s=60):
            sys.exit(f"error: {page}: the page did not finish drawing")
        browser.pump(1.0)
        for key, (name, max_height) in SECTIONS.items():
            box = browser.evaluate(SECTION_BOX.format(key=key))
            shot = browser.screenshot(Path(tmp) / f"{key}.png", clip=box)
            save_png(shot, OUT / name, WIDTH_PX, max_height)


if __name__ == "__main__":
    main()
