"""dtype mapping between savepoint's on-disk names, torch dtypes and numpy dtypes.

torch is optional: it is imported only when a torch tensor is saved or torch tensors are loaded.
ml_dtypes (a dependency of the package) gives numpy the bf16 and fp8 types; without it those
dtypes load as torch tensors (savepoint.load) or raise TypeError when numpy arrays are asked for.
"""

import sys

import numpy as np

try:  # bf16 / fp8 for numpy
    import ml_dtypes
except ImportError:  # pragma: no cover - a declared dependency, but numpy works without it
    ml_dtypes = None

# savepoint name -> numpy dtype name (ml_dtypes names for the ones numpy lacks).
_NUMPY_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
    "C128": "complex128",
}
_FROM_NUMPY_NAME = {v: k for k, v in _NUMPY_NAMES.items()}
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")

# savepoint name -> torch dtype attribute (torch uses the same names as numpy / ml_dtypes).
_TORCH_NAMES = dict(_NUMPY_NAMES)

# Bytes per element, by savepoint name.
ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8,
    "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8, "C128": 16,
}  # fmt: skip


def torch_module():
    """The torch module if it is importable (or already imported), else None."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    try:
        import torch
    except ImportError:
        return None
    return torch


def from_numpy_dtype(dtype):
    """savepoint name of a numpy dtype, or None if savepoint cannot store it."""
    if not dtype.isnative or dtype.fields is not None or dtype.subdtype is not None:
        return None
    name = dtype.name
    if name in _ML_DTYPES:  # ml_dtypes' bfloat16 / float8 (numpy kind "V")
        return _FROM_NUMPY_NAME[name]
    if dtype.kind not in "biufc":
        return None
    return _FROM_NUMPY_NAME.get(name)


def numpy_can_hold(name):
    """Whether numpy can hold savepoint dtype `name` here (bf16 and fp8 need ml_dtypes)."""
    return name is None or ml_dtypes is not None or _NUMPY_NAMES[name] not in _ML_DTYPES


def to_numpy_dtype(name):
    """numpy dtype for a savepoint name (bf16 and fp8 need ml_dtypes)."""
    np_name = _NUMPY_NAMES[name]
    if np_name in _ML_DTYPES:
        if ml_dtypes is None:
            raise TypeError(
                f"dtype {name} needs the ml_dtypes package for numpy (pip install ml_dtypes); "
                "or load it as torch tensors (framework='pt')")
        return np.dtype(getattr(ml_dtypes, np_name))
    return np.dtype(np_name)


def from_torch_dtype(dtype):
    """savepoint name of a torch dtype, or None if savepoint cannot store it."""
    return _from_torch_table().get(dtype)


def to_torch_dtype(name):
    torch = torch_module()
    return getattr(torch, _TORCH_NAMES[name])


_TORCH_TABLE = None


def _from_torch_table():
    global _TORCH_TABLE
    if _TORCH_TABLE is None:
        torch = torch_module()
        _TORCH_TABLE = {
            getattr(torch, attr): name for name, attr in _TORCH_NAMES.items() if hasattr(torch, attr)
        }
    return _TORCH_TABLE


def view_bytes(raw, dtype, shape, to_torch):
    """The tensor (to_torch) or array of savepoint dtype `dtype` and `shape` over the uint8 numpy
    array `raw`, without a copy."""
    if to_torch:
        torch = torch_module()
        t = torch.from_numpy(raw) if raw.size else torch.empty(0, dtype=torch.uint8)
        return t.view(to_torch_dtype(dtype)).reshape(tuple(shape))
    return raw.view(to_numpy_dtype(dtype)).reshape(tuple(shape))
