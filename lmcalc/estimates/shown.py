"""An estimate shown as its command shows it: ``str()`` and ``show()`` print the command's tables (``explain``: its
``--explain`` derivation), and a notebook shows the same tables (``_repr_html_``). The renderers import
``lmcalc.result``, so what calls them lives here, above both; ``result.Estimate`` keeps the data and the short
``repr``."""

from __future__ import annotations

import io
from html import escape

from lmcalc import render, result


class Estimate(result.Estimate):
    """What a command computes, for Python, shown as the command shows it. Each command's estimate derives from it."""

    def shown(self, explain: bool = False) -> result.Result:
        """The result the command prints: its table, or with ``explain`` its derivation (``--explain``)."""
        return self.report

    def text(self, explain: bool = False) -> str:
        """What the command prints, as text: its tables, or with ``explain`` its derivation."""
        out = io.StringIO()
        (render.print_explain if explain else render.print_table)(self.shown(explain), out)
        return out.getvalue()

    def show(self, explain: bool = False) -> None:
        """Print what the command prints: its tables, or with ``explain`` its derivation."""
        print(self.text(explain), end="")

    def __str__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        """A notebook's view: the command's tables, laid out as the terminal prints them."""
        return f"<pre style='line-height: 1.25'>{escape(self.text())}</pre>"
