"""The runs viewer's HTML: the list of run folders, one run's attempts and plots, one
attempt's transcript. Plain server-rendered pages (no script: the page's policy allows
none), every value from a run escaped."""

from __future__ import annotations

import shlex
import time
from html import escape
from pathlib import Path
from urllib.parse import urlencode

from orchard.dashboard import plots
from orchard.dashboard.runs import Attempt, RunFolder
from orchard.dashboard.transcript import Transcript

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1b4332;color:#fff;padding:10px 20px}header a{color:#d8f3dc}
main{padding:16px 20px;max-width:1200px}
table{border-collapse:collapse;background:#fff;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;font-size:14px;vertical-align:top}
th{background:#f0f0f0}
.ok{color:#2e7d32;font-weight:bold}.bad{color:#c62828;font-weight:bold}.none{color:#777}
pre{background:#fff;border:1px solid #ddd;padding:8px;white-space:pre-wrap;word-break:break-word;
font-size:13px;margin:4px 0}
code.cmd{display:block;background:#102a43;color:#f0f4f8;padding:8px;white-space:pre-wrap}
.entry{margin:8px 0;border-left:4px solid #bbb;padding-left:8px}
.entry.system{border-color:#888}.entry.user{border-color:#1565c0}
.entry.assistant{border-color:#2e7d32}.entry.tool{border-color:#ef6c00}
.entry.page{border-color:#6a1b9a}.entry.error{border-color:#c62828}
.role{font-size:12px;text-transform:uppercase;color:#555}
.role b{text-transform:none;color:#222}
.diff .add{color:#1b5e20;background:#e8f5e9}.diff .del{color:#b71c1c;background:#ffebee}
.diff .hunk{color:#6a1b9a}
.shots{display:flex;flex-wrap:wrap;gap:10px}.shots figure{margin:0}
.shots img{width:320px;border:1px solid #ccc}.entry img{max-width:640px;border:1px solid #ccc}
.plots{display:flex;flex-wrap:wrap;gap:16px}
"""


def _q(route: str, **params: object) -> str:
    return escape(f"{route}?{urlencode({k: str(v) for k, v in params.items()})}")


def file_url(root: Path, path: Path) -> str:
    return _q("/file", path=path.relative_to(root).as_posix())


def layout(title: str, body: str, crumbs: list[tuple[str, str]] | None = None) -> str:
    nav = " / ".join(
        ['<a href="/">runs</a>']
        + [
            f'<a href="{href}">{escape(text)}</a>' if href else escape(text)
            for text, href in crumbs or []
        ]
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)} - Orchard runs</title><style>{CSS}</style></head>"
        f"<body><header><b>Orchard runs</b> &nbsp; {nav}</header><main>{body}</main></body></html>"
    )


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"


def verdict_html(a: Attempt) -> str:
    cls = "none" if a.ok is None else "ok" if a.ok else "bad"
    return f'<span class="verdict {cls}">{escape(a.verdict)}</span>'


def inspect_command(run: RunFolder) -> str:
    """How to open the run in Inspect's viewer (the log is written next to the run)."""
    folder = shlex.quote(str(run.path))
    return f"orchard {run.family} export-log {folder} && inspect view --log-dir {folder}"


def index(root: Path, runs: list[RunFolder]) -> str:
    rows = []
    for r in runs:
        href = _q("/run", path=r.rel)
        scored = len(r.scored)
        rows.append(
            f'<tr class="run"><td><a href="{href}">{escape(r.rel)}</a></td>'
            f"<td>{escape(r.family)}</td><td>{len(r.attempts)}</td>"
            f"<td>{r.passed}/{scored}</td><td>{_num(r.mean_reward)}</td>"
            f"<td>{_when(r.path.stat().st_mtime)}</td></tr>"
        )
    if not runs:
        body = (
            f"<p>No run folders under <code>{escape(str(root))}</code> yet: the <code>--out</code> "
            "of <code>orchard swe run</code>, <code>orchard gui run</code> or "
            "<code>orchard claw run</code> goes here.</p>"
        )
    else:
        chart = plots.bars(
            "pass rate per run",
            [(r.rel, r.passed / len(r.scored) if r.scored else None, None) for r in runs],
        )
        body = (
            f"<p>{len(runs)} run folder(s) under <code>{escape(str(root))}</code></p>"
            '<table id="runs"><tr><th>run</th><th>family</th><th>attempts</th><th>passed</th>'
            f"<th>mean reward</th><th>modified</th></tr>{''.join(rows)}</table>"
            f'<div class="plots">{chart}</div>'
        )
    return layout("runs", body)


def run_page(run: RunFolder) -> str:
    rows = []
    for i, a in enumerate(run.attempts):
        href = _q("/attempt", run=run.rel, i=i)
        rows.append(
            f'<tr class="attempt"><td><a href="{href}">{escape(a.task)}</a></td>'
            f"<td>{a.attempt}</td><td>{verdict_html(a)}</td><td>{_num(a.reward)}</td>"
            f"<td><code>{escape(a.sandbox_id or '-')}</code></td>"
            f"<td>{_when(a.started_at)}</td><td>{_num(a.wall_s)}</td></tr>"
        )
    charts = [
        plots.bars(
            "reward per attempt",
            [(f"{a.task} #{a.attempt}", a.reward, a.ok) for a in run.attempts],
        )
    ]
    curves = run.pass_curves()
    if curves:
        charts.append(
            plots.lines(
                "pass@k and pass^k",
                [
                    ("pass@k", "#1565c0", [(k, v) for k, v, _ in curves]),
                    ("pass^k", "#ef6c00", [(k, v) for k, _, v in curves]),
                ],
            )
        )
    pk = ", ".join(f"pass@{k} {v:.3f}" for k, v, _ in curves)
    log = run.path / "run.eval"
    written = (
        f"<p>The Inspect log is written: <code>inspect view --log-dir "
        f"{escape(shlex.quote(str(run.path)))}</code></p>"
        if log.is_file()
        else ""
    )
    body = (
        f"<h2>{escape(run.rel)} <small>({escape(run.family)})</small></h2>"
        f"<p>{len(run.attempts)} attempts, {run.passed} passed of {len(run.scored)} scored; "
        f"mean reward {_num(run.mean_reward)}{'; ' + pk if pk else ''}</p>"
        "<p>Open it in Inspect's viewer (transcripts, scores, metadata):</p>"
        f'<code class="cmd" id="inspect-command">{escape(inspect_command(run))}</code>{written}'
        '<table id="attempts"><tr><th>task</th><th>attempt</th><th>verdict</th><th>reward</th>'
        f"<th>sandbox</th><th>started</th><th>wall s</th></tr>{''.join(rows)}</table>"
        f'<div class="plots">{"".join(charts)}</div>'
    )
    return layout(run.rel, body, [(run.rel, "")])


def _diff(patch: str) -> str:
    out = []
    for line in patch.splitlines():
        cls = (
            "hunk"
            if line.startswith("@@")
            else "add"
            if line.startswith("+") and not line.startswith("+++")
            else "del"
            if line.startswith("-") and not line.startswith("---")
            else ""
        )
        out.append(f'<span class="{cls}">{escape(line)}</span>' if cls else escape(line))
    return '<pre class="diff" id="patch">' + "\n".join(out) + "</pre>"


def attempt_page(root: Path, run: RunFolder, i: int, t: Transcript) -> str:
    a = run.attempts[i]
    meta = (
        '<table id="attempt-meta">'
        f"<tr><th>task</th><td>{escape(a.task)}</td></tr>"
        f"<tr><th>attempt</th><td>{a.attempt}</td></tr>"
        f"<tr><th>verdict</th><td>{verdict_html(a)}</td></tr>"
        f"<tr><th>reward</th><td>{_num(a.reward)}</td></tr>"
        f"<tr><th>sandbox</th><td><code>{escape(a.sandbox_id or '-')}</code></td></tr>"
        f"<tr><th>started</th><td>{_when(a.started_at)}</td></tr>"
        f"<tr><th>wall s</th><td>{_num(a.wall_s)}</td></tr>"
        f"<tr><th>record</th><td><code>{escape(a.record.relative_to(root).as_posix())}</code></td></tr>"
        "</table>"
    )
    parts = [f"<h2>{escape(a.task)} <small>attempt {a.attempt}</small></h2>", meta]
    parts.append(f'<h3>Score</h3><pre id="score">{escape(t.score)}</pre>')
    if t.patch:
        parts.append(f"<h3>Patch</h3>{_diff(t.patch)}")
    if t.screenshots:
        figs = "".join(
            f'<figure><img src="{file_url(root, p)}" alt="screenshot {n}">'
            f"<figcaption>{n}: {escape(p.name)}</figcaption></figure>"
            for n, p in enumerate(t.screenshots)
        )
        parts.append(
            f'<h3>Screenshots, in order</h3><div class="shots" id="screenshots">{figs}</div>'
        )
    entries = []
    for e in t.entries:
        cls = f"entry {escape(e.role)}" + (" error" if e.error else "")
        img = f'<img src="{file_url(root, e.image)}" alt="{escape(e.title)}">' if e.image else ""
        title = f" <b>{escape(e.title)}</b>" if e.title else ""
        entries.append(
            f'<div class="{cls}"><div class="role">{escape(e.role)}{title}</div>'
            f"<pre>{escape(e.text)}</pre>{img}</div>"
        )
    parts.append(f'<h3>Transcript</h3><div id="transcript">{"".join(entries)}</div>')
    for title, text in t.details:
        parts.append(
            f"<details><summary>{escape(title)}</summary><pre>{escape(text)}</pre></details>"
        )
    crumbs = [(run.rel, _q("/run", path=run.rel)), (f"{a.task} #{a.attempt}", "")]
    return layout(f"{a.task} #{a.attempt}", "".join(parts), crumbs)
