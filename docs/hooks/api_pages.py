"""MkDocs hook: the API pages are the ``api/<module>.md`` entries of ``nav`` in mkdocs.yml.

Each such entry without a file of its own becomes a generated page holding ``::: <module>``,
which mkdocstrings renders from the module's docstrings. The list of documented modules is
therefore the nav alone: to document another module, or follow one that moved, edit that line.

The docstrings name objects with Sphinx roles (``:class:`Tracker```); the Google-style parser
keeps the role as text before the code, so the pages drop it and show the code alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from mkdocs.structure.files import File, Files

PREFIX = "api/"
ROLE = re.compile(r":(?:py:)?(?:attr|class|data|exc|func|meth|mod|obj):(?=<code>)")


def nav_paths(nav: Any) -> Iterator[str]:
    """Every page path named in a nav (strings, ``{title: path}`` and nested sections)."""
    items = nav if isinstance(nav, list) else [nav]
    for item in items:
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for value in item.values():
                yield from nav_paths(value)


def on_files(files: Files, config: Any) -> Files:
    for path in nav_paths(config["nav"] or []):
        if (
            path.startswith(PREFIX)
            and path.endswith(".md")
            and files.get_file_from_path(path) is None
        ):
            module = path[len(PREFIX) : -len(".md")]
            page = f"# `{module}`\n\n::: {module}\n"
            files.append(File.generated(config, path, content=page))
    return files


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    return ROLE.sub("", html) if page.file.src_uri.startswith(PREFIX) else html
