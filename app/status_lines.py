"""Status lines that name files stay one line whatever the files are named."""

import sys

# C0 control characters and DEL, as a status line shows them (a file may be named "a\nb.wav").
_CONTROL_ESCAPES = {code: ascii(chr(code))[1:-1] for code in [*range(0x20), 0x7F]}


def one_line(text: str) -> str:
    """`text` with control characters escaped as Python writes them (newline as \\n): a status
    line that names a file stays one line, whatever the file's name, so scripts reading
    the "== FILE" headers and "failed" lines can split them."""
    return text.translate(_CONTROL_ESCAPES)


def tell(line: str) -> None:
    """Prints a status line on stderr, one line (`one_line`)."""
    print(one_line(line), file=sys.stderr)
