"""Encryption keys as the C++ core takes them (python/ext/key.cc).

A key is given as bytes (the raw key; bytearray and memoryview too), a str or os.PathLike (a file
holding the raw key bytes) or a callable returning bytes (a provider: a KMS or secret-store lookup,
called when the key is needed, possibly from another thread). Keys are never logged or printed.
"""

import os


def normalize(key, what):
    """None, bytes, a path str or a callable; TypeError naming `what` for anything else."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    if isinstance(key, (str, os.PathLike)):
        return os.fspath(key)
    if callable(key):
        return key
    raise TypeError(f"{what}: a key is bytes (the raw key), a path (a key file) or a callable "
                    f"returning bytes, not {type(key).__name__}")  # fmt: skip
