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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "browser"))

from cdp import Browser, find_chromium  # a test helper, not part of the package
from shots import READY, SECTION_BOX, save_png

OUT = Path(__file__).resolve().parent
WIDTH_PX = 1000
DEFAULT_GPU = ROOT.parent / "shared" / "traces" / "gpu-real" / "nccl_parser_config" / "nccl_data.json.gz"
SELECT_TAB = """(() => {{ const t = [...Bokeh.documents[0].all_models].find(m => m.type === 'Tabs');
  if (t) {{ t.active = {index}; }} return t ? t.active : -1; }})()"""


def _section(browser: Browser, key: str, tmp: Path) -> Path:
    box = browser.evaluate(SECTION_BOX.format(key=key))
    return browser.screenshot(tmp / f"{key}.png", clip=box)


def main() -> None:
    from fsdpviz.analysis.pipeline import analyse_traces
    from fsdpviz.report.build import build_report
    from fsdpviz.trace import load_traces

    run = Path(sys.argv[1])
    gpu = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_GPU
    chromium = find_chromium()
    if chromium is None:
        sys.exit("needs Chromium (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        example = build_report(analyse_traces(load_traces([run])), tmp / "example.html").path
        ddp = build_report(analyse_traces(load_traces([gpu])), tmp / "gpu.html").path
        with Browser(chromium, width=1400, height=900) as browser:
            browser.open(example.as_uri())
            browser.wait_for(READY)
            browser.pump(1.0)
            save_png(_section(browser, "headline", tmp), OUT / "report-headline.png", WIDTH_PX)
            save_png(_section(browser, "timeline", tmp), OUT / "report-timeline-units.png", WIDTH_PX)
            browser.evaluate(SELECT_TAB.format(index=1))
            browser.pump(1.5)
            save_png(_section(browser, "timeline", tmp), OUT / "report-timeline-events.png", WIDTH_PX)
            save_png(_section(browser, "units", tmp), OUT / "report-units.png", WIDTH_PX, max_height_px=1500)
            save_png(_section(browser, "steps", tmp), OUT / "report-steps.png", WIDTH_PX)
        with Browser(chromium, width=1400, height=900) as browser:
            browser.open(ddp.as_uri())
            browser.wait_for(READY)
            browser.pump(1.0)
            save_png(_section(browser, "headline", tmp), OUT / "report-gpu-headline.png", WIDTH_PX)
            save_png(_section(browser, "timeline", tmp), OUT / "report-gpu-timeline.png", WIDTH_PX)


if __name__ == "__main__":
    main()
