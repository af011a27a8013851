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

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "browser"))

from cdp import Browser, find_chromium  # a test helper, not part of the package

OUT = Path(__file__).resolve().parent
WIDTH_PX = 1000
READY = "window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents.every(d => d.is_idle)"
SECTION_BOX = """(() => {{ const r = document.getElementById({key!r}).getBoundingClientRect();
  return {{x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height}}; }})()"""
# section id -> (image name, tallest part kept in page pixels, None = all of it)
SECTIONS = {
    "headline": ("compare-headline.png", None),
    "findings": ("compare-findings.png", None),
    "structure": ("compare-structure.png", None),
    "units": ("compare-units.png", 900),
    "timelines": ("compare-timelines.png", None),
}


def _save(src: Path, name: str, max_height_px: int | None) -> None:
    with Image.open(src) as img:
        img = img.convert("RGB")
        if max_height_px is not None and img.height > max_height_px:
            img = img.crop((0, 0, img.width, max_height_px))
        scale = WIDTH_PX / img.width
        img = img.resize((WIDTH_PX, round(img.height * scale)), Image.LANCZOS)
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(OUT / name, optimize=True)
    print(f"{OUT / name}: {(OUT / name).stat().st_size / 1024:.0f} KB")


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
            _save(shot, name, max_height)


if __name__ == "__main__":
    main()
