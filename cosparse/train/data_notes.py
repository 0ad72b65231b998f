"""Start-up lines about the data that a run would otherwise keep to itself: the delimiter
sniffed from a text file (``data.csv.delimiter`` unset), and the features the training reader
produces that no table reads (dropped: they train nothing)."""

from __future__ import annotations

from cosparse.config import Config, DataConfig
from cosparse.data.reader import Reader


def delimiter_notes(data: DataConfig) -> list[str]:
    """The line saying which delimiter was sniffed from ``data.path`` (none when
    ``data.csv.delimiter`` sets it, or the reader reads no text table)."""
    path = str(data.path or "")
    text_table = data.reader == "csv" or (
        data.reader == "interactions" and data.events.layout == "rows"
        and not path.endswith((".parquet", ".pq")))
    if not text_table or not path or data.stream is not None:
        return []
    from cosparse.features.csv_dialect import pick_delimiter
    from cosparse.features.csv_source import resolve_files

    note = pick_delimiter(resolve_files(path)[0], data.csv)[1]
    return [note] if note else []


def unread_features(cfg: Config, reader: Reader) -> list[str]:
    """The line naming the features ``reader`` produces that no table of ``cfg`` reads
    (none under ``features: auto``, which takes them all)."""
    read = {f for t in cfg.tables for f in t.features}
    unread = [k for k in reader.keys if k not in read]
    if not unread:
        return []
    source = (f"feature consumer '{cfg.features.consumer}'" if cfg.features.spec
              else f"data.reader '{cfg.data.reader}'")
    return [f"tables: no table reads {', '.join(unread)} of {source}, so "
            f"{'they are' if len(unread) > 1 else 'it is'} dropped (name "
            f"{'them' if len(unread) > 1 else 'it'} in a table's features, or set a table's "
            "features: auto)"]


def data_notes(cfg: Config, reader: Reader) -> list[str]:
    """The start-up lines of this module (see its docstring)."""
    return delimiter_notes(cfg.data) + unread_features(cfg, reader)
