"""qcal.torch: drop-in ``torch.ao.quantization`` observers computed by libqcal.

Each class takes PyTorch 1.13's constructor arguments and works wherever torch's observers
do: ``QConfig(activation=qcal.torch.HistogramObserver.with_args(reduce_range=True), ...)``
with ``prepare_fx`` / ``convert_fx``. The min/max kinds give PyTorch's numbers bit for bit;
the histogram family (``HistogramObserver``, ``PercentileObserver``, ``EntropyObserver``,
``MSEObserver``) gives exactly what ``qcal observe`` gives on the same batches.

State: ``min_val`` / ``max_val`` are registered buffers (PyTorch's shapes: 0-d per tensor,
1-d per channel, +inf/-inf when empty) and ``qcal_state`` is a uint8 buffer with the
observer's qcal state bytes, so ``state_dict`` / ``load_state_dict`` / ``.to()`` work.

Across ``torch.distributed`` ranks, ``all_reduce_observer(obs)`` all-gathers every rank's
state bytes and merges them in rank order, so every rank ends with the same observer;
exact for every kind except the two moving-average ones (their merge is refused unless
all but one rank is empty: use one rank's observer, or average outside qcal).
"""
import warnings as _warnings

try:
    import torch as _torch
    from torch.ao.quantization.observer import UniformQuantizationObserverBase as _Base
except ImportError as _e:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "qcal.torch needs PyTorch (Debian: apt-get install python3-torch); the numpy API "
        "in `qcal` works without it") from _e

import qcal as _qcal

__all__ = [
    "MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver", "HistogramObserver", "PercentileObserver",
    "EntropyObserver", "MSEObserver", "all_reduce_observer",
]

_DTYPES = {_torch.quint8: "quint8", _torch.qint8: "qint8", _torch.qint32: "qint32"}
_QSCHEMES = {
    _torch.per_tensor_affine: "per_tensor_affine",
    _torch.per_tensor_symmetric: "per_tensor_symmetric",
    _torch.per_channel_affine: "per_channel_affine",
    _torch.per_channel_symmetric: "per_channel_symmetric",
    _torch.per_channel_affine_float_qparams: "per_channel_affine_float_qparams",
}
_PER_TENSOR = (_torch.per_tensor_affine, _torch.per_tensor_symmetric)
_SYMMETRIC = (_torch.per_tensor_symmetric, _torch.per_channel_symmetric)


class _QcalObserver(_Base):
    """Common part: a qcal.Observer behind PyTorch's observer interface."""

    _kind = None          # qcal kind name
    _per_channel = False

    def __init__(self, dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs,
                 eps, **qcal_config):
        if dtype not in _DTYPES:
            raise NotImplementedError(f"{type(self).__name__} supports quint8, qint8 and "
                                      f"qint32, not {dtype}")
        if (qscheme in _PER_TENSOR) == self._per_channel:
            raise NotImplementedError(
                f"{type(self).__name__}'s qscheme must be "
                f"{'per-channel' if self._per_channel else 'per-tensor'}, not {qscheme}")
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range,
                         quant_min=quant_min, quant_max=quant_max,
                         factory_kwargs=factory_kwargs, eps=eps)
        if (qscheme in (_torch.per_tensor_symmetric, _torch.per_channel_symmetric)
                and reduce_range and dtype == _torch.quint8):
            raise NotImplementedError("Cannot reduce range for symmetric quantization "
                                      "for quint8")
        cfg = dict(dtype=_DTYPES[dtype], qscheme=_QSCHEMES[qscheme],
                   reduce_range=bool(reduce_range), eps=float(eps), **qcal_config)
        if self.has_customized_qrange:
            cfg["quant_min"] = int(quant_min)
            cfg["quant_max"] = int(quant_max)
        self.__dict__["_qcal_obs"] = _qcal.Observer(self._kind, **cfg)
        self.__dict__["_qcal_dirty"] = False
        factory_kwargs = _torch.nn.factory_kwargs(factory_kwargs)
        if self._per_channel:
            self.register_buffer("min_val", _torch.tensor([], **factory_kwargs))
            self.register_buffer("max_val", _torch.tensor([], **factory_kwargs))
        else:
            self.register_buffer("min_val", _torch.tensor(float("inf"), **factory_kwargs))
            self.register_buffer("max_val", _torch.tensor(float("-inf"), **factory_kwargs))
        self.register_buffer("qcal_state", _torch.zeros(0, dtype=_torch.uint8))

    # -- the qcal observer ------------------------------------------------------------
    @property
    def qcal_observer(self):
        """The underlying qcal.Observer (shared, not a copy)."""
        return self.__dict__["_qcal_obs"]

    def forward(self, x_orig):
        """Observes x (CPU float tensor) and returns it unchanged; empty tensors are skipped."""
        if not isinstance(x_orig, _torch.Tensor):
            self.__dict__["_qcal_obs"].update(x_orig)   # numpy input, or a clear TypeError
            self.__dict__["_qcal_dirty"] = True
            return x_orig
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach()
        if x.dtype == _torch.float32 and x.device.type == "cpu" and x.is_contiguous():
            self.__dict__["_qcal_obs"].update(x.numpy())
        else:
            self.__dict__["_qcal_obs"].update(x)
        self.__dict__["_qcal_dirty"] = True
        return x_orig

    def _qcal_sync(self):
        """Copies the qcal observer's running range into the min_val / max_val buffers."""
        d = self.__dict__
        d["_qcal_dirty"] = False
        obs = d["_qcal_obs"]
        bufs = self._buffers
        if self._per_channel and obs.batches == 0:
            mn = _torch.tensor([])
            mx = _torch.tensor([])
        else:
            lo, hi = obs.data_range()
            mn, mx = _torch.from_numpy(lo), _torch.from_numpy(hi)
            if not self._per_channel:
                mn, mx = mn.reshape(()), mx.reshape(())
        for name, v in (("min_val", mn), ("max_val", mx)):
            b = bufs[name]
            if b.shape != v.shape:
                b.resize_(v.shape)
            b.copy_(v)

    def __getattr__(self, name):
        if name in ("min_val", "max_val") and self.__dict__.get("_qcal_dirty"):
            self._qcal_sync()
        return super().__getattr__(name)

    @_torch.jit.unused
    def calculate_qparams(self):
        """(scale, zero_point) tensors as PyTorch's observer returns them (float32 / int64;
        shape [1] per tensor, [C] per channel)."""
        obs = self.__dict__["_qcal_obs"]
        device = self._buffers["eps"].device
        if obs.batches == 0:
            _warnings.warn("must run observer before calling calculate_qparams. "
                           "Returning default scale and zero point ")
            return (_torch.tensor([1.0], device=device.type),
                    _torch.tensor([0], device=device.type))
        scale, zp = obs.qparams()
        s = _torch.from_numpy(scale).to(device)
        z = _torch.from_numpy(zp)
        # PyTorch's dtypes: int32 for affine schemes (quant_min - round(min/scale)), int64
        # for symmetric ones (a new_full of the int64 zeros), float32 for float qparams.
        if z.dtype != _torch.float32:
            z = z.to(_torch.int64 if self.qscheme in _SYMMETRIC else _torch.int32)
        return s, z.to(device)

    def reset_min_max_vals(self):
        """Forgets all data."""
        self.__dict__["_qcal_obs"].reset()
        self.__dict__["_qcal_dirty"] = True

    def merge(self, other):
        """Folds another observer's data (same class and config) into this one."""
        src = other.__dict__["_qcal_obs"] if isinstance(other, _QcalObserver) else other
        self.__dict__["_qcal_obs"].merge(src)
        self.__dict__["_qcal_dirty"] = True

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}"

    # -- state_dict -----------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self.__dict__.get("_qcal_dirty"):
            self._qcal_sync()
        blob = self.__dict__["_qcal_obs"].save()
        self._buffers["qcal_state"] = _torch.frombuffer(bytearray(blob), dtype=_torch.uint8)
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        # Shapes change with the data (per-channel buffers, state bytes): take them from
        # the incoming state before the generic copy checks them.
        for name in ("min_val", "max_val", "qcal_state"):
            key = prefix + name
            if key in state_dict and name in self._buffers:
                v = state_dict[key]
                b = self._buffers[name]
                if b.shape != v.shape:
                    self._buffers[name] = _torch.empty(v.shape, dtype=b.dtype,
                                                       device=b.device)
        self.__dict__["_qcal_dirty"] = False
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, unexpected_keys, error_msgs)
        key = prefix + "qcal_state"
        if key in state_dict:
            data = self._buffers["qcal_state"].cpu().numpy().tobytes()
            try:
                obs = _qcal.Observer.load(data)
            except _qcal.Error as e:
                error_msgs.append(f"{key}: {e}")
                return
            if obs.kind != self._kind:
                error_msgs.append(f"{key}: state of a {obs.kind} observer cannot be loaded "
                                  f"into {type(self).__name__} ({self._kind})")
                return
            self.__dict__["_qcal_obs"] = obs
            self.__dict__["_qcal_dirty"] = True


class MinMaxObserver(_QcalObserver):
    """torch.ao.quantization.MinMaxObserver computed by qcal (same numbers)."""
    _kind = "minmax"

    def __init__(self, dtype=_torch.quint8, qscheme=_torch.per_tensor_affine,
                 reduce_range=False, quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=_torch.finfo(_torch.float32).eps):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs,
                         eps)


class MovingAverageMinMaxObserver(_QcalObserver):
    """torch.ao.quantization.MovingAverageMinMaxObserver computed by qcal (order matters
    by definition)."""
    _kind = "moving_average_minmax"

    def __init__(self, averaging_constant=0.01, dtype=_torch.quint8,
                 qscheme=_torch.per_tensor_affine, reduce_range=False, quant_min=None,
                 quant_max=None, eps=_torch.finfo(_torch.float32).eps, **kwargs):
        self.averaging_constant = averaging_constant
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max,
                         kwargs.get("factory_kwargs"), eps,
                         averaging_constant=float(averaging_constant))


class PerChannelMinMaxObserver(_QcalObserver):
    """torch.ao.quantization.PerChannelMinMaxObserver computed by qcal (same numbers)."""
    _kind = "per_channel_minmax"
    _per_channel = True

    def __init__(self, ch_axis=0, dtype=_torch.quint8, qscheme=_torch.per_channel_affine,
                 reduce_range=False, quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=_torch.finfo(_torch.float32).eps):
        self.ch_axis = ch_axis
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs,
                         eps, axis=int(ch_axis))


class MovingAveragePerChannelMinMaxObserver(_QcalObserver):
    """torch.ao.quantization.MovingAveragePerChannelMinMaxObserver computed by qcal."""
    _kind = "moving_average_per_channel_minmax"
    _per_channel = True

    def __init__(self, averaging_constant=0.01, ch_axis=0, dtype=_torch.quint8,
                 qscheme=_torch.per_channel_affine, reduce_range=False, quant_min=None,
                 quant_max=None, eps=_torch.finfo(_torch.float32).eps, **kwargs):
        self.averaging_constant = averaging_constant
        self.ch_axis = ch_axis
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max,
                         kwargs.get("factory_kwargs"), eps, axis=int(ch_axis),
                         averaging_constant=float(averaging_constant))


class _HistogramFamily(_QcalObserver):
    def __init__(self, bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                 factory_kwargs, eps, **extra):
        self.bins = bins
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs,
                         eps, bins=int(bins), **extra)


class HistogramObserver(_HistogramFamily):
    """HistogramObserver with qcal's order-independent histogram and L2 search: the same
    arguments as torch's (upsample_rate is accepted and unused); results depend on the
    data only, and equal `qcal observe --observer histogram` on the same batches."""
    _kind = "histogram"

    def __init__(self, bins=2048, upsample_rate=128, dtype=_torch.quint8,
                 qscheme=_torch.per_tensor_affine, reduce_range=False, quant_min=None,
                 quant_max=None, factory_kwargs=None, eps=_torch.finfo(_torch.float32).eps,
                 **qcal_config):
        self.upsample_rate = upsample_rate
        super().__init__(bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                         factory_kwargs, eps, **qcal_config)


class PercentileObserver(_HistogramFamily):
    """Clips at a percentile of |x| (percentile_mode="abs") or of each tail ("two_tails")."""
    _kind = "percentile"

    def __init__(self, percentile=99.99, percentile_mode="abs", bins=2048,
                 dtype=_torch.quint8, qscheme=_torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=_torch.finfo(_torch.float32).eps, **qcal_config):
        self.percentile = percentile
        self.percentile_mode = percentile_mode
        super().__init__(bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                         factory_kwargs, eps, percentile=float(percentile),
                         percentile_mode=str(percentile_mode), **qcal_config)


class EntropyObserver(_HistogramFamily):
    """Clips at the KL-divergence optimum (TensorRT's entropy calibration)."""
    _kind = "entropy"

    def __init__(self, bins=2048, entropy_levels=128, dtype=_torch.quint8,
                 qscheme=_torch.per_tensor_affine, reduce_range=False, quant_min=None,
                 quant_max=None, factory_kwargs=None, eps=_torch.finfo(_torch.float32).eps,
                 **qcal_config):
        self.entropy_levels = entropy_levels
        super().__init__(bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                         factory_kwargs, eps, entropy_levels=int(entropy_levels),
                         **qcal_config)


class MSEObserver(_HistogramFamily):
    """Clips at the threshold with the smallest quantize-dequantize mean squared error."""
    _kind = "mse"

    def __init__(self, bins=2048, dtype=_torch.quint8, qscheme=_torch.per_tensor_affine,
                 reduce_range=False, quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=_torch.finfo(_torch.float32).eps, **qcal_config):
        super().__init__(bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                         factory_kwargs, eps, **qcal_config)


def all_reduce_observer(observer, group=None):
    """Makes every rank's observer the merge of all ranks' observers (torch.distributed).

    All-gathers the state bytes and merges them in rank order on every rank, so every
    rank ends with identical state and qparams. Exact for every kind but the moving
    averages (merging two non-empty moving-average observers raises qcal.Error)."""
    import torch.distributed as dist
    obs = observer.qcal_observer if isinstance(observer, _QcalObserver) else observer
    states = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, obs.save(), group=group)
    merged = _qcal.Observer.load(states[0])
    for s in states[1:]:
        merged.merge(_qcal.Observer.load(s))
    if isinstance(observer, _QcalObserver):
        observer.__dict__["_qcal_obs"] = merged
        observer.__dict__["_qcal_dirty"] = True
        return observer
    return merged
