"""MkDocs hook: links between a notebook and the other pages, checked and rewritten like Markdown links.

mkdocs-jupyter renders a notebook straight to HTML, so MkDocs never sees its links: ``../guide/data.md`` would
stay a link to a Markdown file, and a wrong one would not be reported. This hook resolves every relative
``.md`` / ``.ipynb`` link of a notebook page against the site's files, rewrites it to the built page's URL and
logs a warning (which fails the strict build) for a link to a page that does not exist.
"""

from __future__ import annotations

import logging
import posixpath
import re

log = logging.getLogger("mkdocs.hooks.notebook_links")
LINK = re.compile(r'href="(?![a-z][a-z0-9+.-]*:|#|/)([^"#]+?\.(?:md|ipynb))(#[^"]*)?"')


def on_page_content(html: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs hook signature)
    if not page.file.src_uri.endswith(".ipynb"):
        return html

    def rewrite(match: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(page.file.src_uri), match.group(1)))
        found = files.get_file_from_path(target)
        if found is None:
            log.warning("%s links to '%s', which is not a page of the site", page.file.src_uri, match.group(1))
            return match.group(0)
        return f'href="{found.url_relative_to(page.file)}{match.group(2) or ""}"'

    return LINK.sub(rewrite, html)
