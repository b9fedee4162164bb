"""Small SVG charts drawn on the server (no script, nothing fetched): rewards per attempt
as bars, pass@k and pass^k over k as lines. Every label is escaped."""

from __future__ import annotations

from html import escape

W, H = 560, 220
PAD_L, PAD_R, PAD_T, PAD_B = 44, 12, 26, 34
OK, BAD, NONE = "#2e7d32", "#c62828", "#9e9e9e"


def _frame(title: str, lo: float, hi: float, body: list[str], label: str) -> str:
    ih = H - PAD_T - PAD_B
    ticks = []
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        y = PAD_T + ih - ih * i / 4
        ticks.append(
            f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{v:g}</text>'
        )
    return (
        f'<svg class="plot" role="img" aria-label="{escape(label)}" viewBox="0 0 {W} {H}" '
        f'width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">'
        f"<title>{escape(label)}</title>"
        f'<text x="{PAD_L}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>'
        + "".join(ticks)
        + f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" stroke="#555"/>'
        + "".join(body)
        + "</svg>"
    )


def _y(v: float, lo: float, hi: float) -> float:
    ih = H - PAD_T - PAD_B
    span = (hi - lo) or 1.0
    return PAD_T + ih - ih * (min(max(v, lo), hi) - lo) / span


def bars(title: str, items: list[tuple[str, float | None, bool | None]]) -> str:
    """One bar per (label, value, ok): green passed, red failed, grey unscored (no value
    draws a stub). The axis spans 0 and every value (rewards may be negative)."""
    values = [v for _, v, _ in items if v is not None]
    lo, hi = min([0.0, *values]), max([1.0, *values])
    iw = W - PAD_L - PAD_R
    step = iw / max(1, len(items))
    bw = max(2.0, min(40.0, step * 0.7))
    body = []
    for i, (label, v, ok) in enumerate(items):
        x = PAD_L + step * i + (step - bw) / 2
        color = NONE if ok is None else OK if ok else BAD
        y0, y1 = _y(0.0, lo, hi), _y(v if v is not None else 0.0, lo, hi)
        top, height = min(y0, y1), max(abs(y1 - y0), 1.5)
        tip = f"{label}: {'-' if v is None else f'{v:g}'}"
        body.append(
            f'<rect x="{x:.1f}" y="{top:.1f}" width="{bw:.1f}" height="{height:.1f}" '
            f'fill="{color}"><title>{escape(tip)}</title></rect>'
        )
        if len(items) <= 16:
            body.append(
                f'<text x="{x + bw / 2:.1f}" y="{H - PAD_B + 14}" font-size="10" '
                f'text-anchor="middle">{i + 1}</text>'
            )
    return _frame(title, lo, hi, body, f"{title}: {len(items)} bars")


def lines(title: str, series: list[tuple[str, str, list[tuple[int, float]]]]) -> str:
    """Lines of (name, color, [(k, value)]) over k, values in [0, 1]; a legend."""
    ks = [k for _, _, pts in series for k, _ in pts]
    k_max = max([2, *ks])
    iw = W - PAD_L - PAD_R

    def x(k: int) -> float:
        return PAD_L + iw * (k - 1) / (k_max - 1)

    body = []
    for n, (name, color, pts) in enumerate(series):
        path = " ".join(f"{x(k):.1f},{_y(v, 0.0, 1.0):.1f}" for k, v in pts)
        body.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for k, v in pts:
            body.append(
                f'<circle cx="{x(k):.1f}" cy="{_y(v, 0.0, 1.0):.1f}" r="3.5" fill="{color}">'
                f"<title>{escape(name)} k={k}: {v:.3f}</title></circle>"
            )
        lx = W - PAD_R - 90
        body.append(
            f'<rect x="{lx}" y="{PAD_T + 4 + n * 16}" width="10" height="10" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{PAD_T + 13 + n * 16}" font-size="11">{escape(name)}</text>'
        )
    for k in range(1, k_max + 1):
        body.append(
            f'<text x="{x(k):.1f}" y="{H - PAD_B + 14}" font-size="10" '
            f'text-anchor="middle">{k}</text>'
        )
    body.append(
        f'<text x="{PAD_L + iw / 2:.1f}" y="{H - 4}" font-size="11" text-anchor="middle">k</text>'
    )
    return _frame(title, 0.0, 1.0, body, title)
