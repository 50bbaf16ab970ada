"""MkDocs hook: Sphinx cross-reference roles in docstrings become links (or plain code), and none stays raw.

The docstrings use Sphinx roles (``:class:`~smoeweather.config.Arguments```, ``:func:``, ``:mod:`` …), which
griffe's Google parser leaves as text: the page would show ``:class:`` before a code span. Each role is
rewritten here to an *optional* mkdocs-autorefs reference: a link when the target is a documented object of
the site, plain code otherwise (a private helper, a third-party class), never a warning. ``~`` keeps only
the last name as the title, as in Sphinx. After each page is written, any role still left outside code
blocks is logged as a warning, which fails ``mkdocs build --strict`` (``make docs``).
"""

from __future__ import annotations

import html
import logging
import re

from mkdocs.plugins import event_priority

log = logging.getLogger("mkdocs.hooks.docstring_roles")

ROLES = r"(?:py:)?(?:class|mod|func|meth|attr|data|obj|exc|const|type)"
# As rendered: the role's text before the code span Markdown made of its backquoted target.
ROLE = re.compile(rf":{ROLES}:<code>(?P<target>[^<]+)</code>")
RAW = re.compile(rf":{ROLES}:(?:<code>|`)")  # a role left over (rendered or not)
PRE = re.compile(r"<pre\b.*?</pre>", re.S)


def _autoref(match: re.Match) -> str:
    target = html.unescape(match.group("target")).strip()
    title_text = target
    if target.startswith("~"):
        target = target[1:]
        title_text = target.rsplit(".", 1)[-1]
    target = target.lstrip(".").removesuffix("()")
    title = html.escape(title_text.lstrip("."))
    return f'<autoref identifier="{html.escape(target)}" optional><code>{title}</code></autoref>'


def rewrite_roles(text: str) -> str:
    """``:class:<code>~a.b.C</code>`` → an optional autoref titled ``C`` to ``a.b.C``."""
    return ROLE.sub(_autoref, text)


def raw_roles(text: str) -> list[str]:
    """Raw roles in ``text`` outside ``<pre>`` blocks (each with 40 characters of context)."""
    body = PRE.sub("", text)
    return [body[max(0, m.start() - 40) : m.end() + 40] for m in RAW.finditer(body)]


def on_page_content(html_text: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs hook signature)
    return rewrite_roles(html_text)


AUTOREF_ID = re.compile(r'<autoref identifier="(?P<id>[^"]+)" optional>')


def qualify(text: str, known: set[str]) -> str:
    """A short target (``SpatialMoE2d``, ``module.func``) that ends the identifier of a documented object
    becomes that identifier (the shortest, i.e. the public re-export, when several match); anything else
    stays as written."""

    def full(match: re.Match) -> str:
        ident = html.unescape(match.group("id"))
        if ident in known:
            return match.group(0)
        hits = [k for k in known if k.endswith("." + ident)]
        if not hits:
            return match.group(0)
        return f'<autoref identifier="{html.escape(min(hits, key=lambda k: (len(k), k)))}" optional>'

    return AUTOREF_ID.sub(full, text)


@event_priority(0)  # before mkdocs-autorefs resolves references (its on_env runs at -50)
def on_env(env, config, files):  # noqa: ANN001, ANN201 (MkDocs hook signature)
    autorefs = config.plugins.get("autorefs")
    known = set(getattr(autorefs, "_primary_url_map", {})) | set(getattr(autorefs, "_secondary_url_map", {}))
    for file in files:
        if file.page is not None and file.page.content:
            file.page.content = qualify(file.page.content, known)
    return env


def on_post_page(output: str, page, config) -> str:  # noqa: ARG001
    for hit in raw_roles(output):
        log.warning("%s: raw Sphinx role left in the page: …%s…", page.file.src_uri, hit)
    return output
