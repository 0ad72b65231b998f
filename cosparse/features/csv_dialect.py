"""The layout of a text table that its config leaves open: the delimiter (sniffed when
``data.csv.delimiter`` is not set) and whether the first line is a header.

The delimiter is sniffed by a count-consistency check of our own over the first
``SNIFF_LINES`` lines (header included): a candidate (tab, comma, semicolon, pipe, space)
qualifies when it occurs the same number of times, at least once, on every one of them, quoted
text (``data.csv.quote``) left out. Of those that qualify the first in ``CANDIDATES`` order wins
(a tab before a comma, a comma before a ``|`` list separator, a space last); when none
qualifies the file is read as before: tab for ``.tsv``/``.tab``, else comma. Python's
``csv.Sniffer`` was not used: it works on decoded text (we read raw bytes, gzip or not),
guesses the quoting too, accepts a candidate that is consistent on only most lines, prefers a
comma to a tab when both qualify (a TSV with a comma in a text column reads wrongly) and raises
when it cannot decide; a dozen lines of counting is simpler to predict and to document.
"""

from __future__ import annotations

import re
from collections import Counter

from cosparse.config import CsvConfig
from cosparse.data.lines import line_chunks

SNIFF_LINES = 50
CANDIDATES = ("\t", ",", ";", "|", " ")
NAME_OF = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe", " ": "space"}


def first_lines(path: str, n: int) -> bytes:
    """The first ``n`` lines of a plain or gzip file (fewer if it has fewer)."""
    for _, _, data in line_chunks(path, 1, n, n):
        return data
    return b""


def sniff_delimiter(sample: bytes, quote: str | None = '"') -> str | None:
    """The delimiter of ``sample`` (whole lines) by the check of the module docstring, or
    None when no candidate splits every line alike."""
    text = sample.decode("utf-8", "replace")
    if quote:
        q = re.escape(quote)
        text = re.sub(f"{q}[^{q}]*{q}", "", text)  # quoted text holds no delimiter
    lines = [ln.rstrip("\r") for ln in text.split("\n")]
    lines = [ln for ln in lines if ln.strip()]
    for d in CANDIDATES:
        counts = {ln.count(d) for ln in lines}
        if len(counts) == 1 and counts != {0}:
            return d
    return None


def pick_delimiter(path: str, csv: CsvConfig) -> tuple[str, str | None]:
    """(the delimiter of ``path``, the start-up line saying it was sniffed, None when
    ``data.csv.delimiter`` set it)."""
    if csv.delimiter:
        return csv.delimiter, None
    sniffed = sniff_delimiter(first_lines(path, SNIFF_LINES), csv.quote)
    if sniffed is not None:
        return sniffed, (f"data.csv.delimiter: {NAME_OF[sniffed]} ({sniffed!r}), sniffed from "
                         f"the first lines of {path} (set data.csv.delimiter to choose)")
    fallback = "\t" if path.endswith((".tsv", ".tsv.gz", ".tab")) else ","
    return fallback, (f"data.csv.delimiter: none of tab , ; | space splits the first lines of "
                      f"{path} alike; reading it with {fallback!r} (set data.csv.delimiter)")


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def no_header_advice(count: int) -> str:
    """The config that reads a file of ``count`` columns without a header."""
    return (f"if the file has no header, set data.csv.header: none and name its {count} "
            "columns with data.csv.names: [...] (or leave names out for f0, f1, ...)")


def header_doubt(path: str, names: list[str]) -> str | None:
    """Why the first line of ``path``, read as the header ``names``, seems to be data (None:
    it looks like a header): a name repeats, or most names are numbers (more than half; column
    numbers 0..n-1 or 1..n are names). A header-less file rarely passes both: its first line
    would need a distinct value in every column and text in half of them."""
    repeated = [n for n, k in Counter(names).items() if k > 1]
    numbers = [n for n in names if is_number(n)]
    if repeated:
        why = f"{', '.join(map(repr, repeated[:5]))} repeated"
        fix = "; if it is the header, give each column a name of its own"
    elif 2 * len(numbers) > len(names) and names not in (
            [str(i) for i in range(len(names))], [str(i + 1) for i in range(len(names))]):
        count = ("every name is a number" if len(numbers) == len(names)
                 else f"{len(numbers)} of {len(names)} names are numbers")
        why = f"{count}: {', '.join(numbers[:5])}{', ...' * (len(numbers) > 5)}"
        fix = ""
    else:
        return None
    return (f"{path}: line 1 seems to be data, not a header ({why}); "
            f"{no_header_advice(len(names))}{fix}")
