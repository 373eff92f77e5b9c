"""The report document rendered: Markdown, and one self-contained HTML page (plots embedded as
data URIs), and the files logged onto a parent run."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable

from experiments.report.document import Report


def markdown(report: Report, skip: Iterable[str] = ()) -> str:
    """The report as Markdown; sections (h2 titles) in ``skip`` left out."""
    out = []
    skipping = False
    for kind, *content in report.blocks:
        if kind == "h2":
            skipping = content[0] in skip
        if skipping:
            continue
        if kind == "h1":
            out.append(f"# {content[0]}\n")
        elif kind == "h2":
            out.append(f"## {content[0]}\n")
        elif kind == "p":
            out.append(f"{content[0]}\n")
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in content[0]) + "\n")
        elif kind == "table":
            out.append(markdown_table(*content) + "\n")
        elif kind == "img":
            out.append(f"![{content[1]}]({content[0]})\n")
    return "\n".join(out)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table (cells as given: nothing escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:0.8em 0;font-size:0.9em}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3} td{font-variant-numeric:tabular-nums;white-space:nowrap}
figure{margin:1em 0} img{max-width:100%} figcaption{color:#555;font-size:0.9em}
"""


def to_html(report: Report) -> str:
    """The report as one self-contained HTML page (plots embedded as data URIs)."""
    e = html.escape
    body = []
    for kind, *content in report.blocks:
        if kind in ("h1", "h2", "p"):
            body.append(f"<{kind}>{e(content[0])}</{kind}>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in content[0]) + "</ul>")
        elif kind == "table":
            header, rows = content
            head = "".join(f"<th>{e(h)}</th>" for h in header)
            cells = "".join(
                "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows
            )
            body.append(f'<table class="results"><tr>{head}</tr>{cells}</table>')
        elif kind == "img":
            name, caption = content
            data = base64.b64encode(report.images[name]).decode()
            body.append(
                f'<figure><img alt="{e(caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{e(caption)}</figcaption></figure>"
            )
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f"<title>{e(report.title)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def report_files(report: Report) -> dict[str, str | bytes]:
    """The files a report is logged as: report.md, report.html and report_plots/<name>.png."""
    return {"report.md": markdown(report), "report.html": to_html(report), **report.images}
