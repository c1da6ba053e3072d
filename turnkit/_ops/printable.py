"""Text from the record made safe to print on an operator's terminal (``turnkit events``, ``turnkit show``).

Messages, tool arguments and results, errors and even agent names hold what models, tools and users wrote. Printed
raw, an escape sequence in them would be obeyed by the terminal: it could clear the screen, rewrite the line above
(a forged ``completed``), set the window title, or hide text. :func:`printable` removes every escape sequence and
turns any other control character (and the bidirectional overrides that reorder what is shown) into a visible
replacement character, so what is printed is exactly what is shown.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["printable"]

#: ESC-introduced sequences (7-bit) and their 8-bit C1 forms: CSI (``ESC [`` / 0x9b) up to its final byte; OSC,
#: DCS, SOS, PM and APC strings (``ESC ] P X ^ _`` / 0x9d 0x90 0x98 0x9e 0x9f) up to BEL or the string terminator
#: (``ESC \\`` / 0x9c), or to the end of the text when unterminated; any other ``ESC`` + intermediates + final byte.
_ESCAPES: Final = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])(?:(?!\x1b\\|\x9c|\x07).)*(?:\x1b\\|\x9c|\x07)?"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?",
    re.DOTALL,
)
#: Whatever control is left (C0 but tab and newline, DEL, C1) and the bidirectional embeddings, overrides and isolates.
_CONTROLS: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_REPLACEMENT: Final = "\ufffd"


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` without terminal escape sequences, its other control characters replaced by U+FFFD.

    Tabs and newlines are kept unless ``one_line``: then each becomes a space, so that no value can start a line of
    its own (a forged line of output).
    """
    cleaned = _CONTROLS.sub(_REPLACEMENT, _ESCAPES.sub("", text))
    return cleaned.replace("\n", " ").replace("\t", " ") if one_line else cleaned
