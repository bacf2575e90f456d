"""HTML preprocessing for the llmstxt plugin (mkdocs.yml: llmstxt.preprocess), before it writes Markdown.

The plugin turns each page's HTML into Markdown (llms-full.txt and the per-page ``index.md`` copies agents
read). The HTML shows data strings (a baseline's summary, config, command) as text; the conversion writes
text as it is, so a ``<script>`` a baseline carries would reach the Markdown as a tag, and a ``[x](y)`` as a
link. Agents that render Markdown are readers too, so text outside code is escaped here:

* a ``<`` that could open a tag becomes ``&lt;`` (shown as ``<`` by any Markdown renderer);
* ``[`` and ``]`` are backslash-escaped (no link or image can form from text);
* a ``|`` in a table cell's text is escaped as ``\\|``: an unescaped one would end the cell there and drop
  the rest of the row (the commands page's ``flag a metric when |change| > PCT`` lost everything after "when").

Code spans keep their text: the conversion writes them between backticks (longer runs when the text holds
one), where Markdown shows everything literally.
"""

from __future__ import annotations

import re

from bs4 import NavigableString

_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")
_BRACKET = re.compile(r"[\[\]]")


def escape_text(text: str, *, in_cell: bool = False) -> str:
    """Text of a page as Markdown shows it literally (see the module docstring)."""
    text = _BRACKET.sub(lambda m: "\\" + m.group(0), _TAG_OPEN.sub("&lt;", text))
    return text.replace("|", "\\|") if in_cell else text


def preprocess(soup, output: str) -> None:  # noqa: ARG001 - the plugin's signature
    for node in list(soup.find_all(string=True)):
        if node.find_parent(["code", "pre", "script", "style"]):
            if "|" in node and node.find_parent(["td", "th"]):
                node.replace_with(NavigableString(str(node).replace("|", "\\|")))
            continue
        text = escape_text(str(node), in_cell=node.find_parent(["td", "th"]) is not None)
        if text != str(node):
            node.replace_with(NavigableString(text))
