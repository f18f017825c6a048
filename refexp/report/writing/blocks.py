"""What a report section says, in blocks that name no output format: a heading, a paragraph, lines, a table, a
bullet list, an image. ``render.py`` writes each block as markdown (report.md) and as HTML (report.html); a section
(``refexp/report/sections/``) only chooses its blocks.

A few fields exist so that every report re-renders byte for byte as it did before the sections had blocks: where
report.md and report.html have always differed (an image's alt text, a caption report.html never had, a heading
written on one line with what follows it), the block says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union


@dataclass(frozen=True)
class Code:
    """A span of a paragraph printed as code: `x` in markdown, <code>x</code> in HTML."""

    text: str


Span = Union[str, Code]


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2
    joined: bool = False
    """HTML: the next block follows on the heading's line (the notes' and how-to-read's headings always have)."""


@dataclass(frozen=True)
class Paragraph:
    """``text``: plain words (escaped in HTML), or spans of words and code. ``lead``: a bold lead-in ("Verdict.").
    ``markup``: the text is written with markdown's `code` and *emphasis*, which HTML turns into tags."""

    text: Union[str, tuple[Span, ...]]
    lead: str = ""
    markup: bool = False
    note: bool = False
    """HTML: a muted paragraph (class "note")."""
    in_html: bool = True
    """False: report.md only (the samples' caption, which report.html has never had)."""


@dataclass(frozen=True)
class Lines:
    """Sentences one after another, each led by ``lead``: one paragraph of lines in markdown, a paragraph each in
    HTML (the likelihood-displacement flags)."""

    texts: tuple[str, ...]
    lead: str = ""


@dataclass(frozen=True)
class Table:
    """A header and rows of strings. ``numeric``: markdown right-aligns every column after the first (numbers).
    ``words``: HTML left-aligns every cell (cells of words: runs, errors, completions, the setup)."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: bool = True
    words: bool = False


@dataclass(frozen=True)
class BulletList:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Image:
    """A PNG under the sweep dir: linked by its relative path in markdown, embedded in HTML."""

    path: Path
    alt: str
    html_alt: Optional[str] = None
    """HTML's alt text where it has always differed from markdown's (None: the same)."""


Block = Union[Heading, Paragraph, Lines, Table, BulletList, Image]


def table_of(header, rows, numeric: bool = True, words: bool = False) -> Table:
    """A ``Table`` from lists (a section's header and rows as it builds them)."""
    return Table(tuple(header), tuple(tuple(r) for r in rows), numeric, words)
