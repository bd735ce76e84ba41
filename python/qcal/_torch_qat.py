"""qcal.torch's fake-quant modules, default objects and qconfig helpers (docs/python.md).

``FakeQuantize`` is torch.ao's with qcal.torch's MovingAverageMinMaxObserver as its default
observer. ``FusedMovingAvgObsFakeQuantize`` does what torch 1.13's fused kernel
(``torch.fused_moving_avg_obs_fake_quant``, aten fused_obs_fake_quant.cpp) does, with the
moving average kept by qcal's observer: observe when ``observer_enabled``; when
``fake_quant_enabled``, qparams from the running range by the kernel's rule (ATen's
``ChooseQuantizationParams``, written below) and the fake-quant of x with them.

The ``default_*`` objects and ``get_default_*`` helpers are torch.ao's, with every torch.ao
observer or fake-quant class that qcal.torch has replaced by qcal.torch's (the same
arguments; torch's HistogramObserver becomes qcal.torch's with grid="torch", PyTorch's
numbers); fixed-qparams, placeholder and no-op observers stay torch's.

The observers and ``_define_op`` come from python/qcal/_torch_observers.py, not from
qcal.torch, which re-exports this module's names.
"""
import functools as _functools
import math as _math

import numpy as _np
import torch as _torch
import torch.ao.quantization as _tq
from torch.ao.quantization import fake_quantize as _tfq
from torch.ao.quantization import observer as _tob
from torch.ao.quantization import qconfig as _tqc
from torch.ao.quantization import qconfig_mapping as _tqm

from qcal import _torch_observers as _obs

_SMALL_SCALE = _np.float32(6.1e-5)     # ATen's SMALL_SCALE_THRESHOLD (a float)


def _choose_qparams(mn, mx, qmin, qmax, preserve_sparsity):
    """ATen's quant_utils::ChooseQuantizationParams (QuantUtils.h, torch 1.13) with
    force_scale_power_of_two and reduce_range false: float min/max, double arithmetic,
    a float scale, the zero point nudged with nearbyint. Returns (scale, zero_point)."""
    f32, f64 = _np.float32, _np.float64
    mn, mx = f32(mn), f32(mx)
    if not mn <= mx:
        raise RuntimeError("In ChooseQuantizationParams, min should be less than or equal "
                           "to max")
    if mn < 0 and mx > 0 and preserve_sparsity:
        sym_qmin = -((qmax - qmin) // 2 + 1)
        sym_qmax = (qmax - qmin) // 2
        max_scale = f64(max(abs(mn / f32(sym_qmin)), abs(mx / f32(sym_qmax))))
        mn = f32(max_scale * sym_qmin)
        mx = f32(max_scale * sym_qmax)
    mn = min(mn, f32(0.0))
    mx = max(mx, f32(0.0))
    if not qmin < qmax:
        raise RuntimeError("In ChooseQuantizationParams, qmin should be less than qmax")
    scale = (f64(mx) - f64(mn)) / (qmax - qmin)
    with _np.errstate(divide="ignore", over="ignore"):
        if f32(scale) == 0 or _math.isinf(f32(1.0) / f32(scale)):
            scale = 0.1
    if scale < f64(_SMALL_SCALE):
        org_scale = f32(scale)
        scale = f64(_SMALL_SCALE)
        if mn == 0:
            mx = f32(_SMALL_SCALE * f32(qmax - qmin))
        elif mx == 0:
            mn = f32(-_SMALL_SCALE * f32(qmax - qmin))
        else:
            amplifier = f32(_SMALL_SCALE / org_scale)
            mn = f32(mn * amplifier)
            mx = f32(mx * amplifier)
    zp_min = qmin - f64(mn) / scale
    zp_max = qmax - f64(mx) / scale
    err_min = abs(qmin) - abs(f64(mn) / scale)
    err_max = abs(qmax) - abs(f64(mx) / scale)
    initial = zp_min if err_min < err_max else zp_max
    if mn < 0 and mx > 0 and preserve_sparsity:
        initial = f64(qmin + qmax) / 2
    if initial < qmin:
        zp = qmin
    elif initial > qmax:
        zp = qmax
    else:
        zp = int(_np.rint(initial))          # nearbyint: ties to even
    return f32(scale), zp


def _op_fused_qparams(min_val, max_val, scale, zero_point, quant_min, quant_max, symmetric):
    lo = min_val.detach().cpu().reshape(-1).numpy()
    hi = max_val.detach().cpu().reshape(-1).numpy()
    n = lo.size
    if n == 0:
        raise RuntimeError("In ChooseQuantizationParams, min should be less than or equal "
                           "to max (the observer has seen no data)")
    s = _np.empty(n, dtype=_np.float32)
    z = _np.empty(n, dtype=_np.int64)
    for i in range(n):
        s[i], z[i] = _choose_qparams(lo[i], hi[i], quant_min, quant_max, symmetric)
    shape = (n,) if min_val.dim() > 0 else scale.shape
    for buf, v in ((scale, s), (zero_point, z)):
        if tuple(buf.shape) != tuple(shape):
            buf.resize_(shape)
        buf.copy_(_torch.from_numpy(v).reshape(shape))


_obs._define_op("fused_qparams(Tensor min_val, Tensor max_val, Tensor(a!) scale, "
               "Tensor(b!) zero_point, int quant_min, int quant_max, bool symmetric) -> ()",
               _op_fused_qparams)


class FakeQuantize(_tq.FakeQuantize):
    """torch.ao.quantization.FakeQuantize with qcal.torch's MovingAverageMinMaxObserver as
    the default observer (any observer class may be passed, as in torch)."""

    def __init__(self, observer=_obs.MovingAverageMinMaxObserver, quant_min=None,
                 quant_max=None, **observer_kwargs):
        super().__init__(observer, quant_min, quant_max, **observer_kwargs)


class FusedMovingAvgObsFakeQuantize(_tq.FakeQuantize):
    """torch.ao.quantization.FusedMovingAvgObsFakeQuantize on qcal.torch's moving-average
    observers: the same buffers (``observer_enabled``, ``fake_quant_enabled`` as int64,
    ``scale``, ``zero_point``), the same numbers as torch's fused kernel (moving average,
    its ChooseQuantizationParams rule, fake-quant); scriptable. As torch's kernel, qparams
    are recomputed only while fake-quant is enabled, and per-channel works on axis 0."""

    def __init__(self, observer=_obs.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                 **observer_kwargs):
        super().__init__(observer, quant_min, quant_max, **observer_kwargs)
        assert isinstance(self.activation_post_process,
                          (_obs.MovingAverageMinMaxObserver,
                           _obs.MovingAveragePerChannelMinMaxObserver)), \
            "Fused observer+fake_quant module only works with MovingAverageMinMaxObserver"
        self.register_buffer("fake_quant_enabled", _torch.tensor([1], dtype=_torch.long))
        self.register_buffer("observer_enabled", _torch.tensor([1], dtype=_torch.long))
        self.is_symmetric_quant = self.activation_post_process.qscheme in (
            _torch.per_tensor_symmetric, _torch.per_channel_symmetric)
        if self.is_per_channel and self.ch_axis != 0:
            raise RuntimeError("Per-channel FakeQuant in fused_moving_avg_obs_fake_quant is "
                               "only supported on axis == 0")

    @_torch.jit.export
    def calculate_qparams(self):
        return self.activation_post_process.calculate_qparams()

    @_torch.jit.export
    def extra_repr(self) -> str:
        return (
            "fake_quant_enabled={}, observer_enabled={}, scale={}, zero_point={}, "
            "dtype={}, quant_min={}, quant_max={}, qscheme={}, reduce_range={}".format(
                self.fake_quant_enabled, self.observer_enabled, self.scale,
                self.zero_point, self.dtype, self.activation_post_process.quant_min,
                self.activation_post_process.quant_max, self.qscheme,
                self.activation_post_process.reduce_range))

    def forward(self, X):
        if X.numel() == 0:
            return X.clone()
        if self.observer_enabled[0] == 1:
            self.activation_post_process(X.detach())
        if self.fake_quant_enabled[0] == 1:
            _torch.ops.qcal.fused_qparams(
                self.activation_post_process.min_val, self.activation_post_process.max_val,
                self.scale, self.zero_point, self.activation_post_process.quant_min,
                self.activation_post_process.quant_max, self.is_symmetric_quant)
            if self.is_per_channel:
                return _torch.fake_quantize_per_channel_affine(
                    X, self.scale, self.zero_point, self.ch_axis,
                    self.activation_post_process.quant_min,
                    self.activation_post_process.quant_max)
            return _torch.fake_quantize_per_tensor_affine(
                X, self.scale, self.zero_point, self.activation_post_process.quant_min,
                self.activation_post_process.quant_max)
        return X.clone()


# -- torch.ao's defaults with qcal.torch's classes --------------------------------------
_CLASSES = {
    _tob.MinMaxObserver: _obs.MinMaxObserver,
    _tob.MovingAverageMinMaxObserver: _obs.MovingAverageMinMaxObserver,
    _tob.PerChannelMinMaxObserver: _obs.PerChannelMinMaxObserver,
    _tob.MovingAveragePerChannelMinMaxObserver: _obs.MovingAveragePerChannelMinMaxObserver,
    _tob.HistogramObserver: _obs.HistogramObserver,
    _tfq.FakeQuantize: FakeQuantize,
    _tfq.FusedMovingAvgObsFakeQuantize: FusedMovingAvgObsFakeQuantize,
}


def qcal_qconfig(obj):
    """torch.ao observer / fake-quant class, ``with_args`` factory, QConfig or
    QConfigMapping with every torch.ao class that qcal.torch has replaced by qcal.torch's
    (same arguments; torch's HistogramObserver becomes qcal.torch's with grid="torch",
    which gives torch's numbers). Anything else is returned as it is."""
    if obj is _tob.HistogramObserver:       # torch's numbers: the torch-compatible grid
        return _obs.HistogramObserver.with_args(grid="torch")
    if isinstance(obj, type):
        return _CLASSES.get(obj, obj)
    if isinstance(obj, _tob._PartialWrapper):
        p = obj.p
        keywords = {k: qcal_qconfig(v) for k, v in p.keywords.items()}
        func = p.func
        if func is _tob.HistogramObserver:
            keywords.setdefault("grid", "torch")
        new = _tob._PartialWrapper(_functools.partial(qcal_qconfig(func) if isinstance(
            func, _tob._PartialWrapper) else _CLASSES.get(func, func), *p.args, **keywords))
        new.callable_args = {k: qcal_qconfig(v) for k, v in obj.callable_args.items()}
        return new
    if isinstance(obj, _tq.QConfig):
        return _tq.QConfig(activation=qcal_qconfig(obj.activation),
                           weight=qcal_qconfig(obj.weight))
    if isinstance(obj, _tq.QConfigDynamic):
        return _tq.QConfigDynamic(activation=qcal_qconfig(obj.activation),
                                  weight=qcal_qconfig(obj.weight))
    if isinstance(obj, _tq.QConfigMapping):
        m = _tq.QConfigMapping()
        m.set_global(qcal_qconfig(obj.global_qconfig))
        for k, v in obj.object_type_qconfigs.items():
            m.set_object_type(k, qcal_qconfig(v))
        for k, v in obj.module_name_regex_qconfigs.items():
            m.set_module_name_regex(k, qcal_qconfig(v))
        for k, v in obj.module_name_qconfigs.items():
            m.set_module_name(k, qcal_qconfig(v))
        for (name, typ, idx), v in obj.module_name_object_type_order_qconfigs.items():
            m.set_module_name_object_type_order(name, typ, idx, qcal_qconfig(v))
        return m
    return obj


def get_default_qconfig(backend="fbgemm", version=0):
    """torch.ao.quantization.get_default_qconfig with qcal.torch's observers."""
    return qcal_qconfig(_tqc.get_default_qconfig(backend, version))


def get_default_qat_qconfig(backend="fbgemm", version=1):
    """torch.ao.quantization.get_default_qat_qconfig with qcal.torch's fake-quants and
    observers (version 1: FusedMovingAvgObsFakeQuantize)."""
    return qcal_qconfig(_tqc.get_default_qat_qconfig(backend, version))


def get_default_qconfig_mapping(backend="fbgemm", version=0):
    """torch.ao.quantization.get_default_qconfig_mapping with qcal.torch's observers."""
    return qcal_qconfig(_tqm.get_default_qconfig_mapping(backend, version))


def get_default_qat_qconfig_mapping(backend="fbgemm", version=1):
    """torch.ao.quantization.get_default_qat_qconfig_mapping with qcal.torch's classes."""
    return qcal_qconfig(_tqm.get_default_qat_qconfig_mapping(backend, version))


DEFAULT_NAMES = [
    "default_observer", "default_weight_observer", "default_histogram_observer",
    "default_per_channel_weight_observer", "default_dynamic_quant_observer",
    "default_float_qparams_observer", "default_fake_quant", "default_weight_fake_quant",
    "default_per_channel_weight_fake_quant", "default_dynamic_fake_quant",
    "default_embedding_fake_quant", "default_fused_act_fake_quant",
    "default_fused_wt_fake_quant", "default_fused_per_channel_wt_fake_quant",
    "default_qconfig", "default_qat_qconfig", "default_per_channel_qconfig",
    "default_debug_qconfig", "default_dynamic_qconfig", "default_qat_qconfig_v2",
    "default_weight_only_qconfig", "default_activation_only_qconfig",
    "default_embedding_qat_qconfig", "default_embedding_qat_qconfig_4bit",
    "default_embedding_fake_quant_4bit", "default_float_qparams_observer_4bit",
    "default_symmetric_qnnpack_qconfig", "default_symmetric_qnnpack_qat_qconfig",
    "default_per_channel_symmetric_qnnpack_qconfig",
    "default_per_channel_symmetric_qnnpack_qat_qconfig", "default_dynamic_qat_qconfig",
    "default_reuse_input_qconfig",
]
# (from torch's submodules, where they are defined, not the package's attributes)
_SOURCES = (_tob, _tfq, _tqc)
DEFAULTS = {n: qcal_qconfig(getattr(m, n)) for n in DEFAULT_NAMES for m in _SOURCES
            if hasattr(m, n)}

FakeQuantize.__module__ = FusedMovingAvgObsFakeQuantize.__module__ = "qcal.torch"


def _script_names():
    # torch 1.13's enable/disable_fake_quant and enable/disable_observer recognise a
    # scripted fake-quant module by its TorchScript qualified name (with any
    # ___torch_mangle_N removed): these two take torch's names (TorchScript mangles the
    # second class of one name), subclasses their own.
    def own_name(cls, **kwargs):
        cls._jit_override_qualname = f"__torch__.{cls.__module__}.{cls.__qualname__}"
    for cls in (FakeQuantize, FusedMovingAvgObsFakeQuantize):
        cls._jit_override_qualname = \
            f"__torch__.torch.ao.quantization.fake_quantize.{cls.__name__}"
        cls.__init_subclass__ = classmethod(own_name)


_script_names()
