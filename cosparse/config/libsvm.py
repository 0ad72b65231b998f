"""``data.libsvm``: how ``reader: libsvm`` reads its lines (``cosparse.features.libsvm_source``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LibsvmFormat = Literal["auto", "svm", "ffm"]


@dataclass
class LibsvmConfig:
    """``format``: ``svm`` for libSVM/libFM lines (``label idx:val ...``), ``ffm`` for libFFM
    lines (``label field:idx:val ...``), ``auto`` to tell them apart by each file's first
    feature token."""

    format: LibsvmFormat = "auto"
