"""Set-of-Mark: number the visible interactive elements and draw their boxes on a screenshot.

The page is asked (one JS call) for the elements a user could act on that are actually
visible on top at their centre; their boxes are converted to the 0..GRID action grid so a
model can either click a mark's number or its coordinates.
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from orchard.gui.types import GRID, Mark

MAX_MARKS = 200

# Returns [{role, name, x, y, w, h}] in CSS pixels of the viewport, in document order.
MARKS_JS = """
(maxMarks) => {
  const sel = 'a[href], button, input:not([type=hidden]), select, textarea, summary, '
    + '[role=button], [role=link], [role=checkbox], [role=tab], [role=menuitem], '
    + '[onclick], [tabindex]:not([tabindex="-1"]), [contenteditable=""], [contenteditable=true]';
  const vw = innerWidth, vh = innerHeight, out = [];
  for (const el of document.querySelectorAll(sel)) {
    if (out.length >= maxMarks) break;
    const r = el.getBoundingClientRect();
    if (r.width < 2 || r.height < 2 || r.bottom <= 0 || r.right <= 0 || r.top >= vh
        || r.left >= vw) continue;
    const st = getComputedStyle(el);
    if (st.visibility === 'hidden' || st.display === 'none' || Number(st.opacity) === 0) continue;
    const cx = Math.min(Math.max(r.left + r.width / 2, 0), vw - 1);
    const cy = Math.min(Math.max(r.top + r.height / 2, 0), vh - 1);
    const hit = document.elementFromPoint(cx, cy);
    if (!hit || !(el === hit || el.contains(hit) || hit.contains(el))) continue;
    const tag = el.tagName.toLowerCase();
    const role = el.getAttribute('role')
      || (tag === 'input' ? 'input:' + (el.type || 'text') : tag);
    // The accessible name, roughly as a screen reader finds it: a form control is named by
    // its <label>, not by its contents (a <select>'s innerText is every option at once).
    const by = (el.getAttribute('aria-labelledby') || '').split(/\\s+/)[0];
    const ref = by ? document.getElementById(by) : null;
    const control = tag === 'input' || tag === 'select' || tag === 'textarea';
    const label = el.labels && el.labels.length ? el.labels[0].innerText : '';
    const chosen = tag === 'select' && el.selectedOptions.length ? el.selectedOptions[0].text : '';
    const name = (el.getAttribute('aria-label') || (ref ? ref.innerText : '') || label
      || (control ? '' : el.innerText) || el.getAttribute('placeholder')
      || (tag === 'input' ? el.value : chosen) || el.getAttribute('title')
      || el.getAttribute('alt') || '')
      .replace(/\\s+/g, ' ').trim().slice(0, 80);
    const x0 = Math.max(r.left, 0), y0 = Math.max(r.top, 0);
    out.push({role, name, x: x0, y: y0, w: Math.min(r.right, vw) - x0,
              h: Math.min(r.bottom, vh) - y0});
  }
  return out;
}
"""


def to_marks(raw: list[dict[str, Any]], viewport: tuple[int, int]) -> list[Mark]:
    """The page's boxes (CSS pixels) as numbered marks on the action grid."""
    vw, vh = viewport
    marks = []
    for i, r in enumerate(raw):
        x, y = round(r["x"] * GRID / vw), round(r["y"] * GRID / vh)
        w = max(1, round(r["w"] * GRID / vw))
        h = max(1, round(r["h"] * GRID / vh))
        marks.append(Mark(id=i, role=str(r["role"]), name=str(r["name"]), box=(x, y, w, h)))
    return marks


def mark_center(mark: Mark) -> tuple[int, int]:
    """The centre of a mark's box, on the grid."""
    x, y, w, h = mark.box
    return x + w // 2, y + h // 2


_COLORS = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#008080", "#9a6324")


def draw_marks(png: bytes, marks: list[Mark]) -> bytes:
    """A copy of the screenshot with each mark's box and number drawn on it."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    sx, sy = image.width / GRID, image.height / GRID
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=14)
    for m in marks:
        color = _COLORS[m.id % len(_COLORS)]
        x, y, w, h = m.box
        box = (x * sx, y * sy, (x + w) * sx - 1, (y + h) * sy - 1)
        draw.rectangle(box, outline=color, width=2)
        label = str(m.id)
        left, top, right, bottom = draw.textbbox((0, 0), label, font=font)
        tw, th = right - left + 6, bottom - top + 4
        lx, ly = box[0], max(box[1] - th, 0)
        draw.rectangle((lx, ly, lx + tw, ly + th), fill=color)
        draw.text((lx + 3, ly + 2 - top), label, fill="white", font=font)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def marks_text(marks: list[Mark]) -> str:
    """The marks as lines a text model can read: `[3] button "Search"`."""
    return "\n".join(f'[{m.id}] {m.role} "{m.name}"' for m in marks)
