"""A report as data (sections of text, tables, lists and figures), rendered two ways:
Markdown that links the PNG files beside it, and one self-contained HTML file (inline CSS, every
image embedded as a base64 data URI: it opens offline, by itself, anywhere)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field

__all__ = ["Bullets", "Callout", "Document", "Figure", "Section", "Table", "Text", "to_html",
           "to_markdown"]


@dataclass(frozen=True)
class Text:
    text: str  # one paragraph, plain text (escaped by each renderer)


@dataclass(frozen=True)
class Callout:
    text: str  # the headline: a verdict or a recommendation, shown prominently


@dataclass(frozen=True)
class Bullets:
    items: list[str]
    ordered: bool = False


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]
    right: set[int] = field(default_factory=set)  # column indexes aligned right (numbers)


@dataclass(frozen=True, kw_only=True)
class Figure:
    name: str  # the PNG's file name in the report folder, e.g. "s_per_epoch.png"
    alt: str  # what the image shows, in words (alt text and the Markdown link text)
    caption: str
    png: bytes


Block = Text | Callout | Bullets | Table | Figure


@dataclass(frozen=True)
class Section:
    title: str
    blocks: list[Block]


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    sections: list[Section]

    @property
    def figures(self) -> list[Figure]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Figure)]


# ------------------------------------------------------------------------------------ Markdown

def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_block(block: Block) -> str:
    if isinstance(block, Text):
        return block.text
    if isinstance(block, Callout):
        return f"> **{block.text}**"
    if isinstance(block, Bullets):
        return "\n".join(f"{f'{i}.' if block.ordered else '-'} {item}"
                         for i, item in enumerate(block.items, 1))
    if isinstance(block, Table):
        align = ["---:" if i in block.right else "---" for i in range(len(block.header))]
        rows = [block.header, *block.rows]
        lines = ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
        return "\n".join([lines[0], "|" + "|".join(align) + "|", *lines[1:]])
    return f"![{_md_cell(block.alt)}]({block.name})\n\n_{block.caption}_"


def to_markdown(doc: Document) -> str:
    """Markdown; images are links to the PNG files written beside ``report.md``."""
    parts = [f"# {doc.title}", f"_{doc.subtitle}_"]
    for section in doc.sections:
        parts.append(f"## {section.title}")
        parts += [_md_block(b) for b in section.blocks]
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------- HTML

_CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1b1b1b;
       max-width: 1000px; margin: 2em auto; padding: 0 1.2em; background: #fff; }
h1 { font-size: 1.7em; margin-bottom: 0.1em; overflow-wrap: anywhere; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
.subtitle { color: #555; margin-top: 0; }
.callout { border-left: 5px solid #0b2545; background: #f2f5f9; padding: 0.6em 1em;
           font-weight: 600; margin: 1em 0; }
p, li, figcaption { overflow-wrap: anywhere; }
.table-wrap { overflow-x: auto; margin: 0.8em 0; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #d0d0d0; padding: 0.25em 0.45em; vertical-align: top; }
th { background: #f0f0f0; text-align: left; }
td { overflow-wrap: break-word; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; overflow-wrap: normal; }
tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1.2em 0; }
figure img { box-sizing: border-box; max-width: 100%; height: auto; border: 1px solid #e4e4e4; }
figcaption { color: #444; font-size: 0.9em; margin-top: 0.3em; }
li { margin: 0.2em 0; }
"""


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _html_table(t: Table) -> str:
    def cls(i: int) -> str:
        return ' class="num"' if i in t.right else ""

    head = "".join(f"<th{cls(i)}>{_esc(c)}</th>" for i, c in enumerate(t.header))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{_esc(c)}</td>" for i, c in enumerate(row))
                   + "</tr>" for row in t.rows)
    # in a box of the text column's width: a table too wide for a narrow window scrolls in it
    # rather than the whole page sideways
    return (f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}'
            "</tbody></table></div>")


def _html_block(block: Block) -> str:
    if isinstance(block, Text):
        return f"<p>{_esc(block.text)}</p>"
    if isinstance(block, Callout):
        return f'<p class="callout">{_esc(block.text)}</p>'
    if isinstance(block, Bullets):
        tag = "ol" if block.ordered else "ul"
        return f"<{tag}>" + "".join(f"<li>{_esc(i)}</li>" for i in block.items) + f"</{tag}>"
    if isinstance(block, Table):
        return _html_table(block)
    data = base64.b64encode(block.png).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(block.alt)}">'
            f"<figcaption>{_esc(block.caption)}</figcaption></figure>")


def to_html(doc: Document) -> str:
    """One self-contained page: inline CSS, images as data URIs, no script, no network."""
    body = [f"<h1>{_esc(doc.title)}</h1>", f'<p class="subtitle">{_esc(doc.subtitle)}</p>']
    for section in doc.sections:
        body.append(f"<section><h2>{_esc(section.title)}</h2>")
        body += [_html_block(b) for b in section.blocks]
        body.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_esc(doc.title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
