"""Type aliases of the public signatures. The annotations that use them are never evaluated at
import time (`from __future__ import annotations` in every module); importing the aliases lets
typing.get_type_hints resolve them. The bottom layer: it imports nothing of savepoint."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Sequence, Union

#: A file or directory path: str or os.PathLike.
StrPath = Union[str, "os.PathLike[str]"]

#: An encryption key: the raw bytes, a key file path, or a provider returning the bytes.
Key = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", Callable[[], bytes]]

#: savepoint.save's compression: None, "zstd", "lz4", or {"codec", "shuffle", "level"}.
Compression = Union[str, Dict[str, Any]]

#: Entry, table or slot names and glob patterns: one, or several.
Names = Union[str, Sequence[str]]

#: CheckpointManager's include= / exclude=: category names or aliases (or "*").
Categories = Union[str, Sequence[str]]

#: CheckpointManager's metrics: {name: value}.
Metrics = Mapping[str, float]

#: A statistics or description dict (bytes, seconds, ...).
Stats = Dict[str, Any]

#: A list of records (checkpoints, chain links, ...).
Records = List[Dict[str, Any]]

__all__ = ["Categories", "Compression", "Key", "Metrics", "Names", "Records", "Stats", "StrPath"]
