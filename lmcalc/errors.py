"""The one exception type the CLI turns into a one-line message and exit code 2."""


class LmcalcError(Exception):
    """A problem with the user's input: the message names what was wrong and what is accepted."""
