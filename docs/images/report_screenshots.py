"""Re-create the report screenshots of docs/report.md with headless Chromium.

    python docs/images/report_screenshots.py RUN_FOLDER [GPU_TRACE]

RUN_FOLDER is a recording of the bundled example (``make demo`` writes one to ``demo-run/``);
GPU_TRACE a trace without FSDP labels (default: the shared ``nccl_data`` DDP trace beside the
checkout). Each section of the report is captured on its own, scaled to 1000 px wide and
quantised to 256 colours so that every image stays well under 200 KB.
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
DEFAULT_GPU = ROOT.parent / "shared" / "traces" / "gpu-real" / "nccl_parser_config" / "nccl_data.json.gz"
READY = "window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents.every(d => d.is_idle)"
SECTION_BOX = """(() => {{ const r = document.getElementById({key!r}).getBoundingClientRect();
  return {{x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height}}; }})()"""
SELECT_TAB = """(() => {{ const t = [...Bokeh.documents[0].all_models].find(m => m.type === 'Tabs');
  if (t) {{ t.active = {index}; }} return t ? t.active : -1; }})()"""


def _save(src: Path, name: str, max_height_px: int | None = None) -> None:
    with Image.open(src) as img:
        img = img.convert("RGB")
        if max_height_px is not None and img.height > max_height_px:
            img = img.crop((0, 0, img.width, max_height_px))
        scale = WIDTH_PX / img.width
        img = img.resize((WIDTH_PX, round(img.height * scale)), Image.LANCZOS)
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(OUT / name, optimize=True)
    print(f"{OUT / name}: {(OUT / name).stat().st_size / 1024:.0f} KB")


def _section(browser: Browser, key: str, tmp: Path) -> Path:
    box = browser.evaluate(SECTION_BOX.format(key=key))
    return browser.screenshot(tmp / f"{key}.png", clip=box)


def main() -> None:
    from fsdpviz.report.build import build_report
    from fsdpviz.trace import load_traces

    run = Path(sys.argv[1])
    gpu = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_GPU
    chromium = find_chromium()
    if chromium is None:
        sys.exit("needs Chromium (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        example = build_report(load_traces([run]), tmp / "example.html").path
        ddp = build_report(load_traces([gpu]), tmp / "gpu.html").path
        with Browser(chromium, width=1400, height=900) as browser:
            browser.open(example.as_uri())
            browser.wait_for(READY)
            browser.pump(1.0)
            _save(_section(browser, "headline", tmp), "report-headline.png")
            _save(_section(browser, "timeline", tmp), "report-timeline-units.png")
            browser.evaluate(SELECT_TAB.format(index=1))
            browser.pump(1.5)
            _save(_section(browser, "timeline", tmp), "report-timeline-events.png")
            _save(_section(browser, "units", tmp), "report-units.png", max_height_px=1500)
            _save(_section(browser, "steps", tmp), "report-steps.png")
        with Browser(chromium, width=1400, height=900) as browser:
            browser.open(ddp.as_uri())
            browser.wait_for(READY)
            browser.pump(1.0)
            _save(_section(browser, "headline", tmp), "report-gpu-headline.png")
            _save(_section(browser, "timeline", tmp), "report-gpu-timeline.png")


if __name__ == "__main__":
    main()
