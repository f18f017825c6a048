"""Write the report: report.md (plots by relative path), report.html (one self-contained file,
plots as base64 data URIs, no scripts, no external references) and summary.json (the numbers).

What each file says is the report's sections' (``report.sections``, ``refexp/report/sections/``): their blocks
(``blocks.py``) in page order for report.md and report.html, their entries for summary.json. This module writes
blocks and names no analysis.

Every file is written to a temporary name and renamed, so a reader never sees half a report and
re-running on a sweep that is still going simply replaces the previous one.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

from refexp.record.atomic import write_text_atomic
from refexp.report.writing.blocks import BulletList, Code, Heading, Image, Lines, Paragraph, Table

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
code{background:#f3f3f3;padding:0 .2em}
img{max-width:100%;display:block;margin:1em 0;border:1px solid #eee}
.note{color:#555}.bad td{text-align:left}
"""


def _write(path: Path, text: str) -> Path:
    return write_text_atomic(path, text, encoding="utf-8")


def _blocks(report) -> list:
    return [b for s in report.sections for b in s.blocks(report)]


# ---------------------------------------------------------------- markdown
_HTML_OPENER = re.compile(r"<(?=[A-Za-z/!?])")
"""A ``<`` that Markdown would read as raw HTML: a tag (``<script>``, ``<svg onload=...>``, ``</b>``), a comment or
declaration (``<!``), a processing instruction (``<?``) or an autolink (``<http://...>``)."""


def _no_raw_html(markdown: str) -> str:
    """``markdown`` with every ``<`` that could open raw HTML written ``&lt;``, which renders as ``<``: a report
    prints run names, completions and prompts it did not write, and report.md, like report.html, shows them as text.
    The report's own Markdown holds no HTML; a ``<`` before a space, a digit or ``=`` (``p <= alpha``) stays."""
    return _HTML_OPENER.sub("&lt;", markdown)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header, body, numeric: bool = True) -> list[str]:
    """A pipe table; ``numeric`` right-aligns every column after the first (the numbers)."""
    rest = "---:" if numeric else ":---"
    lines = ["| " + " | ".join(map(_md_cell, header)) + " |",
             "|" + "|".join([":---"] + [rest] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in body]
    return lines


def _md_text(text) -> str:
    return text if isinstance(text, str) else "".join(f"`{s.text}`" if isinstance(s, Code) else s for s in text)


def _md_lead(lead: str) -> str:
    return f"**{lead}** " if lead else ""


def _markdown_lines(block, sweep_dir: Path) -> list[str]:
    if isinstance(block, Heading):
        return ["#" * block.level + " " + block.text]
    if isinstance(block, Paragraph):
        return [_md_lead(block.lead) + _md_text(block.text)]
    if isinstance(block, Lines):
        return [_md_lead(block.lead) + t for t in block.texts]
    if isinstance(block, Table):
        return _md_table(block.header, block.rows, block.numeric)
    if isinstance(block, BulletList):
        return [f"- {item}" for item in block.items]
    if isinstance(block, Image):
        return [f"![{block.alt}]({block.path.relative_to(sweep_dir).as_posix()})"]
    raise TypeError(f"not a report block: {block!r}")


def render_markdown(report) -> str:
    """Every section's blocks, a blank line after each."""
    out = []
    for block in _blocks(report):
        out += _markdown_lines(block, report.sweep_dir) + [""]
    return _no_raw_html("\n".join(out[:-1]) + "\n")


# ---------------------------------------------------------------- html
def _html_table(header, body, cls: str = "") -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in body)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _md_emphasis_to_html(text: str) -> str:
    """Text written with *x* and `x` (the how-to-read paragraph); turn exactly those into <em>/<code>."""
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", text)


def _html_text(block: Paragraph) -> str:
    if block.markup:
        return _md_emphasis_to_html(block.text)
    if isinstance(block.text, str):
        return html.escape(block.text)
    return "".join(f"<code>{html.escape(s.text)}</code>" if isinstance(s, Code) else html.escape(s)
                   for s in block.text)


def _html_lead(lead: str) -> str:
    return f"<strong>{html.escape(lead)}</strong> " if lead else ""


def _html_parts(block) -> list[str]:
    e = html.escape
    if isinstance(block, Heading):
        return [f"<h{block.level}>{e(block.text)}</h{block.level}>"]
    if isinstance(block, Paragraph):
        if not block.in_html:
            return []
        cls = ' class="note"' if block.note else ""
        return [f"<p{cls}>{_html_lead(block.lead)}{_html_text(block)}</p>"]
    if isinstance(block, Lines):
        return [f"<p>{_html_lead(block.lead)}{e(t)}</p>" for t in block.texts]
    if isinstance(block, Table):
        return [_html_table(block.header, block.rows, "bad" if block.words else "")]
    if isinstance(block, BulletList):
        return ["<ul>" + "".join(f"<li>{e(item)}</li>" for item in block.items) + "</ul>"]
    if isinstance(block, Image):
        alt = block.alt if block.html_alt is None else block.html_alt
        return [f'<img alt="{e(alt)}" src="{_data_uri(block.path)}">']
    raise TypeError(f"not a report block: {block!r}")


def render_html(report) -> str:
    """One page: every section's blocks, one per line (a joined heading shares its line with the next block)."""
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(report.title)}"
             f"</title><style>{_CSS}</style></head><body>"]
    joined = False
    for block in _blocks(report):
        new = _html_parts(block)
        if joined and new:
            parts[-1] += new.pop(0)
        parts += new
        joined = isinstance(block, Heading) and block.joined
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- json
def summary_dict(report) -> dict:
    """Every section's entries, in ``report.summary_keys``' order, then any other in page order; non-finite numbers
    are null."""
    entries: dict = {}
    for s in report.sections:
        entries |= s.summary(report)
    ordered = {k: entries.pop(k) for k in report.summary_keys if k in entries}
    return ordered | entries


def write_all(report) -> None:
    """report.md, report.html and summary.json into the sweep dir, each rendered before the first is written: one
    that cannot be rendered leaves the previous three as they were, none of them stale beside the others."""
    texts = {report.markdown_path: render_markdown(report), report.html_path: render_html(report),
             report.summary_path: json.dumps(summary_dict(report), indent=2, allow_nan=False) + "\n"}
    for path, text in texts.items():
        _write(path, text)
