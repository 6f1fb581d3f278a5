"""The one exception type the CLI turns into a one-line message and exit code 2.

Below the command line, code speaks in quantities and settings, never in flags: a message names a setting
with ``setting("virtual_stages")``, and each front end says it in its own words when the error is shown
(``LmcalcError.message``): the Python API by its keyword argument (``keyword``: a field's name, or where the
two differ the name ``KEYWORDS`` gives), the command line by its flag (``flag``: the keyword with
dashes).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters: no user input or preset name spells them
_SETTING = re.compile(f"{_OPEN}(\\w+){_CLOSE}")


def setting(name: str) -> str:
    """A placeholder for the setting ``name`` (a field or keyword name) inside an error message."""
    return f"{_OPEN}{name}{_CLOSE}"


KEYWORDS = {
    "seq_len": "seq",
    "overhead_bytes": "overhead",
    "quant_group_size": "quant_group",
    "embedding_in_split": "account_for_embedding_in_pipeline_split",
    "loss_in_split": "account_for_loss_in_pipeline_split",
}
"""The fields whose keyword in the Python API (and flag on the command line) is not their own name."""


def keyword(name: str) -> str:
    """How the Python API names a setting: the keyword argument that sets the field ``name``."""
    return KEYWORDS.get(name, name)


def flag(name: str) -> str:
    """How the command line names a setting: its keyword with dashes (``virtual_stages`` → ``--virtual-stages``)."""
    return "--" + keyword(name).replace("_", "-")


class LmcalcError(Exception):
    """A problem with the user's input: the message names what was wrong and what is accepted."""

    def message(self, name_of: Callable[[str], str] = keyword) -> str:
        """The message, each setting named by ``name_of`` (its keyword by default), and any long quotation of the
        user's input cut short (``cut_echoes``)."""
        text = str(self.args[0]) if self.args else ""
        return cut_echoes(_SETTING.sub(lambda match: name_of(match.group(1)), text))

    def __str__(self) -> str:
        return self.message()

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings the message names, by keyword, in its order (the page marks their fields)."""
        text = str(self.args[0]) if self.args else ""
        return tuple(keyword(name) for name in _SETTING.findall(text))


ECHO_LIMIT = 100
"""The most characters of the user's own input an error message repeats (a flag's value, a preset's name): enough to
recognise it, and a 100,000-character name still gives a one-line message, not a 100 kB one."""


def token(value: object, limit: int = 40) -> str:
    """``value`` as a message quotes something read from a file: its ``repr``, cut to ``limit`` characters. A message
    names the file and the problem; of the file's content it shows at most this short, delimited token."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 2] + "…" + text[-1]


def as_given(value: object) -> str:
    """What a file gave where a number or a boolean belongs, as YAML and JSON spell it (a short token at most)."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"the text {token(value)}"
    return token(value) if isinstance(value, int | float) else type(value).__name__


_LONG_QUOTE = re.compile(f"(?<!\\w)'([^'\\n]{{{ECHO_LIMIT},}})'(?!\\w)")  # not an apostrophe: "the model's"
_LONG_RUN = re.compile(f"[^\\s']{{{2 * ECHO_LIMIT},}}")


def cut_echoes(message: str) -> str:
    """``message`` with what it quotes of the user's input cut to about ``ECHO_LIMIT`` characters, wherever it was
    written: a quotation ('…', as ``repr`` and most messages quote a value) of more than ``ECHO_LIMIT`` characters, and
    any unquoted run without a space of more than twice that (a value given as it was typed; a file's path is rarely so
    long). Each keeps its start and its last few characters, joined by "…"."""

    def cut(text: str) -> str:
        return text[: ECHO_LIMIT - 12] + "…" + text[-10:]

    message = _LONG_QUOTE.sub(lambda match: f"'{cut(match.group(1))}'", message)
    return _LONG_RUN.sub(lambda match: cut(match.group(0)), message)


def echo(value: object) -> str:
    """``value`` as a message quotes what the user typed (a flag's value, a name): its ``repr``, cut to
    ``ECHO_LIMIT`` characters."""
    return token(value, ECHO_LIMIT)


def printable(text: str) -> str:
    """``text`` on one printable line: control characters (a newline in a file name) are escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def warn(message: str) -> None:
    """One line on stderr for a problem that does not stop the command (a broken file among the user's presets)."""
    print(f"lmcalc: warning: {printable(cut_echoes(message))}", file=sys.stderr)
