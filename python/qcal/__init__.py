"""qcal: static-quantization calibration from Python, on libqcal.

The numpy API (``qcal.Observer``, ``qcal.quantize``, ``qcal.fake_quant``, ``qcal.sqnr``,
``qcal.Session``, ...) needs numpy only; ``qcal.torch`` holds drop-in ``torch.ao``
observers and needs PyTorch; ``qcal.onnx`` calibrates an ONNX model by running it in ONNX
Runtime (loaded at run time), writes its Q/DQ model (keeping the most sensitive ops float
until an accuracy target holds) and compares a Q/DQ model with float. Every library failure raises a ``qcal.Error`` subclass with
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
    BackendError, NotFoundError, NoDataError, Observer, sqnr, l2, cosine, set_num_threads,
    get_num_threads,
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
        if str(x.layout) != "torch.strided":
            raise TypeError(f"expected a dense (strided) tensor, got layout {x.layout}")
        x = x.detach().resolve_neg()
        if x.dtype != __import__("torch").float32:
            x = x.float()
        return x.contiguous().numpy()
    if not isinstance(x, _np.ndarray):
        if isinstance(x, _np.generic) or (isinstance(x, (list, tuple, float, int))
                                          and not isinstance(x, bool)):
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


def _rules_text(rules=None, rules_text=None, observer=None, config=None, caller="Session"):
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
        raise TypeError(f"{caller}() got unexpected keyword argument"
                        f"{'s' if len(config) > 1 else ''} {', '.join(map(repr, config))}: "
                        "observer options (bins=, qscheme=, ...) need observer=KIND")
    return "\n".join(p.rstrip("\n") for p in parts) + "\n" if parts else None


def _size_text(n):
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


class Session(_qcal.Session):
    """Session(rules=None, rules_text=None, observer=None, max_memory=2**31, **config): a
    calibration session.

    ``rules`` is a rules-file path and ``rules_text`` its text ("GLOB ROLE OBSERVER
    key=value ..." per line, first match wins); ``observer`` + config set the activation
    observer after them, as ``qcal calibrate --observer KIND --key value`` does. Feed
    batches with ``observe(name, x, role="activation", step=None)`` and the weights of a
    ``.safetensors`` file with ``observe_safetensors(path)``; ``table()`` returns a
    ``Table`` that writes every format the CLI writes (json, tensorrt, onnxruntime, ncnn).
    A tensor that saw no finite value makes ``table()`` raise ``NoDataError`` naming every
    such tensor unless ``table(allow_empty=True)`` (then one ``RuntimeWarning`` each and the
    entry is kept with ``no_data=True``), as ``qcal calibrate --allow-empty``.
    ``max_memory`` (bytes, 0 = no limit) caps the observers' estimated memory, as
    ``--max-memory``: the ``observe`` call that would create a tensor past it raises
    ``OutOfMemoryError`` naming it (docs/observers.md, "Memory")."""

    def __init__(self, rules=None, rules_text=None, observer=None,
                 max_memory=2 ** 31, **config):
        super().__init__(_rules_text(rules, rules_text, observer, config), max_memory)
        desc = []
        if rules is not None:
            desc.append(f"rules={str(rules)!r}")
        if rules_text is not None:
            n = sum(1 for ln in rules_text.splitlines()
                    if ln.strip() and not ln.lstrip().startswith("#"))
            desc.append(f"rules_text=<{n} rule{'' if n == 1 else 's'}>")
        if observer is not None:
            desc.append(f"observer={observer!r}")
            desc.extend(f"{k}={v!r}" for k, v in config.items() if v is not None)
        if max_memory != 2 ** 31:
            desc.append(f"max_memory={_size_text(max_memory)}")
        self._desc = " ".join(desc)

    def __repr__(self):
        n = len(self)
        desc = getattr(self, "_desc", "")
        return (f"<qcal.Session: {n} tensor{'' if n == 1 else 's'}"
                f"{'; ' + desc if desc else ''}>")


Table = _qcal.Table


def _dump_tensors(directory):
    """(name, role, [files]) of a dump directory, as `qcal calibrate DIR` reads it
    (percent-decoded names, or DIR/manifest.json)."""
    import os
    return _qcal._dump_scan(os.fspath(directory))


def calibrate(directory=None, output=None, format="json", rules=None, rules_text=None,
              observer=None, allow_empty=False, max_memory=2 ** 31, weights=None,
              trt_version=None, trt_algorithm=None, skip_unrepresentable=False, **config):
    """Calibrates a dump directory as `qcal calibrate DIR` does and returns the Table
    (written to ``output`` in ``format`` when given: one name, "json,tensorrt" or a list,
    with the CLI's ``trt_version``, ``trt_algorithm`` and ``skip_unrepresentable``; see
    ``Table.write``). ``weights``: a ``.safetensors`` path or a list of them, every tensor of
    2+ dimensions observed as a weight, as ``--weights`` (``directory`` may then be None).
    A tensor that saw no finite value raises ``NoDataError`` (nothing written) unless
    ``allow_empty=True``."""
    import os
    if isinstance(weights, (str, bytes, os.PathLike)):
        weights = [weights]
    weights = list(weights or [])
    if directory is None and not weights:
        raise TypeError("calibrate() needs a dump directory, weights=FILE.safetensors or both")
    if trt_version is not None or trt_algorithm is not None or skip_unrepresentable:
        if output is None:
            raise TypeError("trt_version, trt_algorithm and skip_unrepresentable shape the "
                            "written table: give output=PATH too (or pass them to "
                            "Table.write)")
    if config and observer is None:
        _rules_text(config=config, caller="calibrate")   # raises the TypeError
    s = Session(rules=rules, rules_text=rules_text, observer=observer,
                max_memory=max_memory, **config)
    if directory is not None:
        for fqn, role, files in _dump_tensors(directory):
            for step, f in enumerate(files):
                s.observe(fqn, _np.load(f, allow_pickle=False), role=role, step=step)
    for w in weights:
        s.observe_safetensors(w)
    t = s.table(allow_empty=allow_empty)
    if output is not None:
        t.write(output, format, skip_unrepresentable=skip_unrepresentable,
                trt_version=trt_version, trt_algorithm=trt_algorithm)
    return t


_QDTYPES = {"quint8": _np.uint8, "qint8": _np.int8, "qint32": _np.int32,
            "float8_e4m3fn": _np.uint8, "float8_e5m2": _np.uint8}
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_NP_TO_Q = {_np.dtype(_np.uint8): "quint8", _np.dtype(_np.int8): "qint8",
            _np.dtype(_np.int32): "qint32"}


def _dtype_name(dtype):
    name = str(dtype)
    name = name[6:] if name.startswith("torch.") else name
    if name not in _QDTYPES:
        raise ValueError("dtype must be quint8, qint8, qint32, float8_e4m3fn or float8_e5m2, "
                         f"not {dtype!r}")
    return name


def _qp_arrays(scale, zero_point, dtype=_np.int32):
    s = _np.ascontiguousarray(_np.asarray(scale, dtype=_np.float32).reshape(-1))
    z = _np.ascontiguousarray(_np.asarray(zero_point).reshape(-1))
    if z.dtype.kind not in "iu" or _np.any(z != z.astype(_np.int32)):
        raise TypeError("zero_point must hold integers")
    return s, _np.ascontiguousarray(z.astype(_np.int32))


def _as_f32(x):
    return x if (isinstance(x, _np.ndarray) and x.dtype == _np.float32
                 and x.flags.c_contiguous) else _coerce_f32(x)


def quantize(x, scale, zero_point, dtype, axis=None):
    """Integer representation of x (numpy uint8/int8/int32 of x's shape), as
    torch.quantize_per_tensor / quantize_per_channel(...).int_repr(); per channel along
    axis when given (scale and zero_point then hold one value per channel).
    dtype "float8_e4m3fn" / "float8_e5m2": the FP8 codes of x / scale as a uint8 array
    (zero_point 0), bit-identical to ONNX Runtime's QuantizeLinear (docs/fp8.md)."""
    name = _dtype_name(dtype)
    x = _as_f32(x)
    s, z = _qp_arrays(scale, zero_point)
    out = _np.empty(x.shape, _QDTYPES[name])
    _qcal._quantize(x, s, z, name, axis, out)
    return out


def dequantize(q, scale, zero_point, axis=None, dtype=None):
    """float32 values (q - zero_point) * scale of an integer array (uint8 -> quint8, int8
    -> qint8, int32 -> qint32), per channel along axis when given. dtype "float8_e4m3fn" /
    "float8_e5m2": q is a uint8 array of FP8 codes, the values value(code) * scale
    (zero_point 0; docs/fp8.md)."""
    q = _np.asarray(q)
    if q.dtype not in _NP_TO_Q:
        raise TypeError(f"expected a uint8, int8 or int32 array, got dtype {q.dtype}")
    name = _NP_TO_Q[q.dtype]
    if dtype is not None:
        name = _dtype_name(dtype)
        if _np.dtype(_QDTYPES[name]) != q.dtype:
            raise TypeError(f"dtype {name} needs a {_np.dtype(_QDTYPES[name])} array, got {q.dtype}")
    q = _np.ascontiguousarray(q)
    s, z = _qp_arrays(scale, zero_point)
    out = _np.empty(q.shape, _np.float32)
    _qcal._dequantize(q, name, s, z, axis, out)
    return out


def fake_quant(x, scale, zero_point, quant_min=None, quant_max=None, axis=None,
               return_mask=False, dtype=None):
    """Quantize-dequantize as torch.fake_quantize_per_tensor_affine / _per_channel_affine
    (float32, x's shape); with return_mask, also the uint8 mask of values inside
    [quant_min, quant_max] (the straight-through backward's mask).
    dtype "float8_e4m3fn" / "float8_e5m2" (no quant_min / quant_max, zero_point 0): FP8
    fake-quant, value(code of x / scale) * scale as ONNX Runtime's Q + DQ; the mask is 1
    where |x / scale| did not saturate (<= 464, < 61440; docs/fp8.md)."""
    x = _as_f32(x)
    s, z = _qp_arrays(scale, zero_point)
    out = _np.empty(x.shape, _np.float32)
    mask = _np.empty(x.shape, _np.uint8)
    if dtype is not None:
        name = _dtype_name(dtype)
        if name not in _FP8:
            raise ValueError(f"fake_quant dtype must be float8_e4m3fn or float8_e5m2, not "
                             f"{dtype!r} (integer ranges: quant_min / quant_max)")
        if quant_min is not None or quant_max is not None:
            raise ValueError(f"{name} takes no quant_min / quant_max")
        _qcal._fake_quant(x, s, z, 0, 0, axis, out, mask, name)
    else:
        if quant_min is None or quant_max is None:
            raise TypeError("fake_quant needs quant_min and quant_max (or an FP8 dtype)")
        _qcal._fake_quant(x, s, z, int(quant_min), int(quant_max), axis, out, mask)
    return (out, mask) if return_mask else out


fakequant = fake_quant   # the spelling of the CLI subcommand


def fake_quant_backward(grad, mask):
    """Straight-through backward: grad where mask is set, 0 elsewhere (float32)."""
    g = _as_f32(grad)
    m = _np.ascontiguousarray(_np.asarray(mask, dtype=_np.uint8))
    if m.shape != g.shape:
        raise MismatchError(f"mask shape {m.shape} differs from grad shape {g.shape}")
    out = _np.empty(g.shape, _np.float32)
    _qcal._fake_quant_backward(g, m, out)
    return out


def _lsq_arrays(scale, zero_point):
    s = _np.ascontiguousarray(_np.asarray(scale, dtype=_np.float32).reshape(-1))
    z = _np.asarray(zero_point)
    if z.dtype.kind not in "iuf":
        raise TypeError(f"zero_point must hold numbers, got dtype {z.dtype}")
    return s, _np.ascontiguousarray(z.astype(_np.float32).reshape(-1))


def fake_quant_learnable(x, scale, zero_point, quant_min, quant_max, axis=None,
                         return_mask=False):
    """LSQ forward, as torch._fake_quantize_learnable_per_tensor_affine / _per_channel_affine:
    the float zero points are rounded half to even and clamped to [quant_min, quant_max],
    then x is fake-quantized (float32, x's shape); with return_mask, also the uint8 mask of
    values inside the range."""
    x = _as_f32(x)
    s, z = _lsq_arrays(scale, zero_point)
    out = _np.empty(x.shape, _np.float32)
    mask = _np.empty(x.shape, _np.uint8)
    _qcal._fake_quant_learnable(x, s, z, int(quant_min), int(quant_max), axis, out, mask)
    return (out, mask) if return_mask else out


def fake_quant_learnable_backward(x, grad, scale, zero_point, quant_min, quant_max,
                                  axis=None, grad_factor=1.0):
    """LSQ backward of fake_quant_learnable(x, ...) for the output gradient ``grad``:
    ``(grad_x, grad_scale, grad_zero_point)``, float32; grad_x has x's shape, grad_scale and
    grad_zero_point one value per tensor (shape [1]) or per channel along axis. The same
    per-element terms as PyTorch 1.13's ATen kernel (its FMAs included), summed in double
    (PyTorch sums in float: results agree to float rounding of the sum); NaN inputs add no
    term and get grad_x 0."""
    x = _as_f32(x)
    g = _as_f32(grad)
    if g.shape != x.shape:
        raise MismatchError(f"grad shape {g.shape} differs from x shape {x.shape}")
    s, z = _lsq_arrays(scale, zero_point)
    gx = _np.empty(x.shape, _np.float32)
    gs = _np.empty(s.shape, _np.float32)
    gz = _np.empty(s.shape, _np.float32)
    if z.shape != s.shape:
        raise MismatchError(f"{s.size} scales and {z.size} zero points")
    _qcal._fake_quant_learnable_backward(x, g, s, z, int(quant_min), int(quant_max), axis,
                                         float(grad_factor), gx, gs, gz)
    return gx, gs, gz
