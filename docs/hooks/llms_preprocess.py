"""HTML preprocessing for the llmstxt plugin (mkdocs.yml: llmstxt.preprocess), before it writes Markdown.

A ``|`` in a table cell's text is escaped as ``\\|``: the HTML-to-Markdown conversion writes cell text as it
is, and an unescaped ``|`` would end the cell there and drop the rest of the row (the commands page's
``flag a metric when |change| > PCT`` lost everything after "when").
"""

from __future__ import annotations

from bs4 import NavigableString


def preprocess(soup, output: str) -> None:  # noqa: ARG001 - the plugin's signature
    for cell in soup.find_all(["td", "th"]):
        for node in list(cell.find_all(string=True)):
            if "|" in node:
                node.replace_with(NavigableString(str(node).replace("|", "\\|")))
