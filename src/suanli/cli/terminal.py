"""What reaches the user's terminal from strings other people wrote: e-mail addresses, org and file names, events,
logs. A terminal obeys control characters (ESC starts sequences that set the window title, write the clipboard
(OSC 52), make links (OSC 8), hide text or move the cursor to print over what was shown) and a bidi override shows
`report\u202egpj.sh` as `reporths.jpg`; Rich reads `[...]` as markup (`[/]` stopped a whole listing). So every
string the CLI renders has its control and invisible format characters shown as escapes (`Console.render_str`
below, for every table cell and printed string), and strings other people wrote are markup-escaped where they are
put in a table or a message (`shown`)."""

from __future__ import annotations

import unicodedata
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

_HIDDEN = frozenset(("Cc", "Cf", "Zl", "Zp", "Co", "Cs"))  # controls, format (bidi, zero-width), separators, private


def visible(text: str, keep: str = "\n\t") -> str:
    """`text` with its control and invisible format characters (but those in `keep`) written as `\\xNN` or `\\uNNNN`."""
    if text.isprintable():  # none of them is printable: the common case costs one scan
        return text
    out = []
    for c in text:
        if c not in keep and unicodedata.category(c) in _HIDDEN:
            out.append(
                f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"
            )
        else:
            out.append(c)
    return "".join(out)


def shown(value: Any) -> str:
    """A string someone else wrote, for a table cell or a message: markup shown as written, controls as escapes."""
    return escape(visible(str(value)))


class SafeConsole(Console):
    """Rich's console, showing control and invisible format characters of every string it renders as escapes
    (markup Rich itself turns into styles is unaffected: styles are not characters of the string)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(text), **kwargs)
