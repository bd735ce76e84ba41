"""qcal: static-quantization calibration from Python, on libqcal.

The numpy API (``qcal.Observer``, ``qcal.quantize``, ``qcal.fake_quant``, ``qcal.sqnr``,
``qcal.Session``, ...) needs numpy only; ``qcal.torch`` holds drop-in ``torch.ao``
observers and needs PyTorch. Every library failure raises a ``qcal.Error`` subclass with
the library's message; wrong Python types raise ``TypeError``. See docs/python.md.

Inputs: numpy arrays and CPU torch tensors. A C-contiguous float32 array is read in place
(no copy); float16/float64 data and non-contiguous or Fortran-ordered arrays are converted
to a C-contiguous float32 copy; anything else (integers, booleans, complex, objects,
strings, bytes, None) is refused with ``TypeError``.
"""
import numpy as _np

from . import _qcal
from ._qcal import (  # noqa: F401  (re-exported)
    Error, InvalidArgumentError, FormatError, UnsupportedError, NonFiniteError,
    MismatchError, EmptyError, FileError, OutOfMemoryError, SizeOverflowError, StateError,
    BackendError, NotFoundError, Observer, sqnr, l2, cosine,
)

__version__ = _qcal.version()

KINDS = (
    "minmax", "moving_average_minmax", "per_channel_minmax",
    "moving_average_per_channel_minmax", "histogram", "percentile", "entropy", "mse",
)


def _coerce_f32(x):
    """Returns x as a C-contiguous float32 numpy array, or raises TypeError."""
    if x is None:
        raise TypeError("expected a float array or tensor, got None")
    if isinstance(x, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"expected a float array or tensor, got {type(x).__name__}")
    mod = type(x).__module__
    if mod.startswith("torch"):
        if getattr(x, "is_quantized", False):
            raise TypeError("quantized torch tensors are not accepted: dequantize() first")
        if x.device.type != "cpu":
            raise TypeError(f"expected a CPU tensor, got one on {x.device}")
        if not x.is_floating_point():
            raise TypeError(f"expected a floating-point tensor, got {x.dtype}")
        x = x.detach()
        if x.dtype != __import__("torch").float32:
            x = x.float()
        return x.contiguous().numpy()
    if not isinstance(x, _np.ndarray):
        if isinstance(x, (list, tuple, float, int)) and not isinstance(x, bool):
            x = _np.asarray(x)
        else:
            raise TypeError(f"expected a float array or tensor, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise TypeError(f"expected a floating-point array, got dtype {x.dtype}")
    return _np.ascontiguousarray(x, dtype=_np.float32)


_qcal._set_coercer(_coerce_f32)
