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


def _rule_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, (int, float)) else str(v)


def _rules_text(rules=None, rules_text=None, observer=None, config=None):
    parts = []
    if rules is not None:
        with open(rules, "r", encoding="utf-8") as f:
            parts.append(f.read())
    if rules_text is not None:
        parts.append(rules_text)
    if observer is not None:
        kv = " ".join(f"{k}={_rule_value(v)}" for k, v in (config or {}).items()
                      if v is not None)
        parts.append(f"* activation {observer} {kv}".rstrip())
    elif config:
        raise TypeError("observer options need observer=KIND")
    return "\n".join(p.rstrip("\n") for p in parts) + "\n" if parts else None


class Session(_qcal.Session):
    """Session(rules=None, rules_text=None, observer=None, **config): a calibration session.

    ``rules`` is a rules-file path and ``rules_text`` its text ("GLOB ROLE OBSERVER
    key=value ..." per line, first match wins); ``observer`` + config set the activation
    observer after them, as ``qcal calibrate --observer KIND --key value`` does. Feed
    batches with ``observe(name, x, role="activation", step=None)``; ``table()`` returns a
    ``Table`` that writes every format the CLI writes (json, tensorrt, onnxruntime, ncnn)."""

    def __init__(self, rules=None, rules_text=None, observer=None, **config):
        super().__init__(_rules_text(rules, rules_text, observer, config))


Table = _qcal.Table


def _dump_tensors(directory):
    """(name, role, [files]) of a dump directory, as `qcal calibrate DIR` reads it."""
    import os
    if not os.path.isdir(directory):
        raise FileError(f"'{directory}' is not a directory")
    out = []
    for name in sorted(os.listdir(directory), key=os.fsencode):
        if name.startswith("."):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            files = [os.path.join(path, f) for f in sorted(os.listdir(path), key=os.fsencode)
                     if f.endswith(".npy") and not f.startswith(".")]
            if not files:
                raise FormatError(f"'{path}' holds no .npy file")
            fqn = name
        elif name.endswith(".npy"):
            files, fqn = [path], name[:-4]
        else:
            continue
        out.append((fqn, "weight" if fqn.endswith(".weight") else "activation", files))
    if not out:
        raise FormatError(f"'{directory}' holds no tensor")
    return out


def calibrate(directory, output=None, format="json", rules=None, rules_text=None,
              observer=None, **config):
    """Calibrates a dump directory as `qcal calibrate DIR` does and returns the Table
    (written to ``output`` in ``format`` when given)."""
    s = Session(rules=rules, rules_text=rules_text, observer=observer, **config)
    for fqn, role, files in _dump_tensors(directory):
        for step, f in enumerate(files):
            s.observe(fqn, _np.load(f, allow_pickle=False), role=role, step=step)
    t = s.table()
    if output is not None:
        t.write(output, format)
    return t
