"""MkDocs hook: Sphinx roles in the docstrings render as plain code on the API reference pages.

Some docstrings name other objects the Sphinx way, ``:func:`pop_failure_counts` `` or ``:mod:`~pkg.mod` ``.
mkdocstrings renders docstrings as Markdown, where the role stays as text before the code span
(``:func:<code>pop_failure_counts</code>``); this hook drops the role, and the ``~`` that asks Sphinx to show only
the last component, from the pages' HTML.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:py:)?(?:func|mod|class|meth|attr|data|obj|exc|const):(<code>)~?")


def strip_roles(html: str) -> str:
    return _ROLE.sub(r"\1", html)


def on_page_content(html: str, **kwargs) -> str:
    return strip_roles(html)
