"""What the screenshot scripts of docs/images share: when a page's Bokeh figures are drawn, the box
of one page section, and saving a capture small enough for the docs (scaled, 256 colours)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

READY = "window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents.every(d => d.is_idle)"
SECTION_BOX = """(() => {{ const r = document.getElementById({key!r}).getBoundingClientRect();
  return {{x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height}}; }})()"""


def save_png(src: Path, dest: Path, width_px: int, max_height_px: int | None = None) -> None:
    """``src`` cut to its top ``max_height_px`` (None: all of it), scaled to ``width_px`` wide and
    quantised to 256 colours, written to ``dest``."""
    with Image.open(src) as img:
        img = img.convert("RGB")
        if max_height_px is not None and img.height > max_height_px:
            img = img.crop((0, 0, img.width, max_height_px))
        img = img.resize((width_px, round(img.height * width_px / img.width)), Image.LANCZOS)
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(dest, optimize=True)
    print(f"{dest}: {dest.stat().st_size / 1024:.0f} KB")
