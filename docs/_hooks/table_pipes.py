"""MkDocs hook: a pipe inside a table cell's code span renders the same on the site as on GitHub.

GitHub splits table cells at every unescaped pipe, code spans included, so the pages write `a\\|b` there and GitHub
shows `a|b`. Python-Markdown never splits inside a code span and would show the backslash; this hook drops it on
table rows before Python-Markdown reads the page.
"""

from __future__ import annotations

import re

_CODE_SPAN = re.compile(r"`[^`\n]*`")


def on_page_markdown(markdown: str, **kwargs) -> str:
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            line = _CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
        lines.append(line)
    return "\n".join(lines)
