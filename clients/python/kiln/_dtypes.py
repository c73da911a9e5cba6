"""Element types: numpy dtypes, their HLO spellings and wire codes.

As JAX without x64, 64-bit values are canonicalized to 32 bits (float64 to
float32, int64 to int32) when they enter a program.
"""
import numpy as np

try:
    import ml_dtypes as _ml

    bfloat16 = np.dtype(_ml.bfloat16)
except ImportError:  # bfloat16 is then unavailable
    _ml = None
    bfloat16 = None

float16 = np.dtype("float16")
float32 = np.dtype("float32")
float64 = np.dtype("float64")
int8 = np.dtype("int8")
int16 = np.dtype("int16")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
uint8 = np.dtype("uint8")
uint16 = np.dtype("uint16")
uint32 = np.dtype("uint32")
uint64 = np.dtype("uint64")
bool_ = np.dtype("bool")
complex64 = np.dtype("complex64")

# numpy dtype -> (HLO text spelling, wire ElementType suffix)
_TABLE = [
    (bool_, "pred", "PRED"), (int8, "s8", "S8"), (int16, "s16", "S16"), (int32, "s32", "S32"),
    (int64, "s64", "S64"), (uint8, "u8", "U8"), (uint16, "u16", "U16"), (uint32, "u32", "U32"),
    (uint64, "u64", "U64"), (float16, "f16", "F16"), (float32, "f32", "F32"),
    (float64, "f64", "F64"), (complex64, "c64", "C64"),
]
if bfloat16 is not None:
    _TABLE.append((bfloat16, "bf16", "BF16"))
HLO_NAME = {d: h for d, h, _ in _TABLE}
WIRE_NAME = {d: w for d, _, w in _TABLE}
FROM_WIRE = {w: d for d, _, w in _TABLE}

_CANON = {float64: float32, int64: int32, uint64: uint32, np.dtype("complex128"): complex64}


def canonical(dt):
    dt = np.dtype(dt)
    dt = _CANON.get(dt, dt)
    if dt not in HLO_NAME:
        raise TypeError(f"kiln: dtype {dt} is not supported")
    return dt


def is_float(dt):
    dt = np.dtype(dt)
    return dt.kind == "f" or dt == bfloat16 or dt.kind == "c"


def is_int(dt):
    return np.dtype(dt).kind in "iu"


def result_type(*dts):
    """numpy promotion without x64, bfloat16 kept (bf16 with f16 -> f32)."""
    dts = [np.dtype(d) for d in dts]
    if bfloat16 is not None and bfloat16 in dts:
        others = [d for d in dts if d != bfloat16]
        if all(not is_float(d) for d in others):
            return bfloat16
        if all(d == bfloat16 or not is_float(d) for d in others):
            return bfloat16
        return canonical(np.result_type(*[float32 if d == bfloat16 else d for d in dts]))
    return canonical(np.result_type(*dts))


def finfo(dt):
    if bfloat16 is not None and np.dtype(dt) == bfloat16:
        return _ml.finfo(bfloat16)
    return np.finfo(dt)


def iinfo(dt):
    return np.iinfo(dt)
