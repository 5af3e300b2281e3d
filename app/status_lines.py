"""Status lines that name files stay one line whatever the files are named."""

import sys
from pathlib import Path

# C0 control characters and DEL, as a status line shows them (a file may be named "a\nb.wav").
_CONTROL_ESCAPES = {code: ascii(chr(code))[1:-1] for code in [*range(0x20), 0x7F]}


# Files status lines name otherwise than by their path: {path: name} (`show_as`).
_SHOWN_AS: dict[str, str] = {}


def show_as(path: Path, name: str) -> None:
    """Status lines name `path` as `name` from now on (a recording spooled from standard input
    as `-`, the name it was given by)."""
    _SHOWN_AS[str(path)] = name


def one_line(text: str) -> str:
    """`text` with control characters escaped as Python writes them (newline as \\n): a status
    line that names a file stays one line, whatever the file's name, so scripts reading
    the "== FILE" headers and "failed" lines can split them. A file `show_as` names gets that
    name."""
    for path, name in _SHOWN_AS.items():
        text = text.replace(path, name)
    return text.translate(_CONTROL_ESCAPES)


def tell(line: str) -> None:
    """Prints a status line on stderr, one line (`one_line`)."""
    print(one_line(line), file=sys.stderr)
