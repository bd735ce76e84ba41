"""qcal.torch's observer classes, their TorchScript ops and all_reduce_observer.

python/qcal/torch.py is the public module (its docstring describes these classes,
docs/python.md the rest): it re-exports everything here users reach as ``qcal.torch.X``,
with the loggers of python/qcal/_torch_loggers.py and the fake-quant modules and qconfig
helpers of python/qcal/_torch_qat.py, which are built on these observers. This file imports
neither of the two, so the package has no import circle. The classes and
all_reduce_observer name ``qcal.torch`` as their ``__module__``: pickles and TorchScript
names are the same as when they were defined in torch.py.
"""
import json as _json
import re as _re
import sys as _sys
import types as _types
from typing import Dict as _Dict, List as _List
import struct as _struct
import warnings as _warnings
import weakref as _weakref

import numpy as _np

import torch as _torch
from torch.ao.quantization.observer import UniformQuantizationObserverBase as _Base

import qcal as _qcal

# The public module the classes and all_reduce_observer below name as theirs (pickles,
# reprs, TorchScript names): they are reached as qcal.torch.X.
_PUBLIC_MODULE = "qcal.torch"

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


class _Buffers(dict):
    """The observer module's buffer dict. Reading ``min_val`` / ``max_val`` by any path
    (attribute, ``state_dict``, ``named_buffers``, ``.to()``) first copies the qcal
    observer's running range into them if it changed since the last copy, so forward
    does no per-call buffer work. Pickled with the module (torch.save): named
    qcal.torch._Buffers, as the observer classes."""
    __module__ = _PUBLIC_MODULE
    __slots__ = ("owner",)

    def __getitem__(self, key):
        if key in _RANGE_BUFFERS:
            self.owner._qcal_sync()
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        if key in _RANGE_BUFFERS:
            self.owner._qcal_sync()
        return dict.get(self, key, default)

    def items(self):
        self.owner._qcal_sync()
        return dict.items(self)

    def values(self):
        self.owner._qcal_sync()
        return dict.values(self)


_RANGE_BUFFERS = ("min_val", "max_val")
# Kinds whose state is the same torch buffers (torch loads one's state_dict into the other).
_FAMILY = {"minmax": "t", "moving_average_minmax": "t", "per_channel_minmax": "c",
           "moving_average_per_channel_minmax": "c"}


def _range_into(obs, mn, mx, per_channel):
    """Writes obs's running range into the min_val / max_val tensors (in place when they
    are float32 CPU buffers of the right size; +inf/-inf or empty without data)."""
    try:
        done = obs._data_range_into(mn, mx)    # in place: float32 CPU buffers
    except TypeError:                          # moved to another dtype or device
        done = False
    if done is None and not per_channel:
        mn.fill_(float("inf"))
        mx.fill_(float("-inf"))
    elif done is None:
        mn.resize_(0)
        mx.resize_(0)
    elif not done:
        lo, hi = obs.data_range()
        lo, hi = _torch.from_numpy(lo), _torch.from_numpy(hi)
        if not per_channel:
            lo, hi = lo.reshape(()), hi.reshape(())
        for b, v in ((mn, lo), (mx, hi)):
            if b.shape != v.shape:
                b.resize_(v.shape)
            b.copy_(v)


def _qparams_tensors(obs, device, config):
    """(scale, zero_point) tensors of obs as PyTorch's observers return them; ``config``:
    the observer's parsed ``qcal_config``."""
    symmetric = config["symmetric"]
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
        z = z.to(_torch.int64 if symmetric else _torch.int32)
    c = config["config"]
    if (c.get("grid") == "torch" and c["dtype"] == "quint8" and c["reduce_range"]
            and c["qscheme"] == "per_tensor_symmetric" and "quant_min" not in c):
        # PyTorch's HistogramObserver gives zero-point 128 on its range [0, 127] (outside
        # it: a defect qcal does not copy, its own answer is 64); grid="torch" is the
        # exact-PyTorch mode, so it returns PyTorch's number.
        z = _torch.full_like(z, 128)
    return s, z.to(device)


# -- TorchScript ---------------------------------------------------------------------
# A scripted observer keeps its data in tensors (torch.jit.save / load, and the clones
# prepare_jit makes, copy tensors only): ``qcal_state`` holds the qcal state bytes, rewritten
# after every update, ``min_val`` / ``max_val`` the running range. The live qcal.Observer
# behind a state tensor is cached here, keyed by that tensor and checked against its
# version counter: a state tensor written by anything else (a clone, a load) is re-read.
_BOUND = {}     # id(state tensor) -> [weak reference to it, qcal.Observer, its version]
_CONFIGS = {}   # config string -> its parsed dict


def _config(config):
    cfg = _CONFIGS.get(config)
    if cfg is None:
        cfg = _CONFIGS[config] = _json.loads(config)
    return cfg


def _dropper(table, key):
    """A weakref callback that removes table[key] if it still holds that reference."""
    def drop(ref):
        hit = table.get(key)
        if hit is not None and hit[0] is ref:
            del table[key]
    return drop


def _unbind(key):
    return _dropper(_BOUND, key)


def _bind_state(state, obs):
    """Writes obs's state bytes into the uint8 tensor ``state`` (resized in place) and
    binds the two."""
    blob = obs.save()
    key = id(state)
    hit = _BOUND.get(key)
    if hit is None or hit[0]() is not state or hit[1] is not obs or len(hit[3]) != len(blob):
        if state.numel() != len(blob):  # set_: the storage may not be resizable (frombuffer)
            state.set_(_torch.empty(len(blob), dtype=_torch.uint8, device=state.device))
        view = state.detach().numpy() if state.device.type == "cpu" else None
        hit = _BOUND[key] = [_weakref.ref(state, _unbind(key)), obs, 0, view]
    if hit[3] is not None:
        # a numpy write leaves the version counter alone: the version recorded below is
        # the one an outside write (a load, a copy_) would move
        hit[3][:] = _np.frombuffer(blob, dtype=_np.uint8)
    else:
        state.copy_(_torch.frombuffer(bytearray(blob), dtype=_torch.uint8))
    hit[2] = state._version


def _bound_observer(state, config):
    """The qcal.Observer a scripted observer's state tensor stands for."""
    hit = _BOUND.get(id(state))
    if hit is not None and hit[0]() is state and hit[2] == state._version:
        return hit[1]
    cfg = _config(config)
    if state.numel() > 0:
        obs = _qcal.Observer.load(state.cpu().numpy().tobytes())
        if obs.kind != cfg["kind"]:
            raise RuntimeError(f"qcal_state holds a {obs.kind} observer, the module is a "
                               f"{cfg['kind']} one")
    else:
        obs = _qcal.Observer(cfg["kind"], **cfg["config"])
    key = id(state)
    _BOUND[key] = [_weakref.ref(state, _unbind(key)), obs, state._version, ()]
    return obs


def _op_observe(x, state, min_val, max_val, config):
    obs = _bound_observer(state, config)
    version = obs._version
    obs._torch_forward(x)
    if obs._version != version:
        _bind_state(state, obs)
        _range_into(obs, min_val, max_val, _config(config)["per_channel"])
    return x


_HIST_SYNCED = {}  # id(histogram tensor) -> [weak reference to it, qcal.Observer, version]


def _histogram_counts(obs, bins):
    """HistogramObserver.histogram's value for obs: a float32 tensor of ``bins`` counts."""
    if obs.config["grid"] == "torch":
        return _torch.from_numpy(obs._torch_histogram()[0])
    edges, counts = obs._histogram_bins()
    if not counts:
        return _torch.zeros(int(bins))
    return _torch.tensor(counts, dtype=_torch.float64).to(_torch.float32)


def _op_histogram(state, histogram, config):
    """Writes the observer's histogram (the eager ``histogram`` property's value) into the
    float32 tensor ``histogram`` if the observer changed since the last write."""
    obs = _bound_observer(state, config)
    key = id(histogram)
    hit = _HIST_SYNCED.get(key)
    if (hit is not None and hit[0]() is histogram and hit[1] is obs
            and hit[2] == (obs._version, histogram._version)):
        return
    h = _histogram_counts(obs, _config(config)["config"]["bins"])
    with _torch.no_grad():
        if histogram.shape != h.shape or histogram.dtype != h.dtype:
            histogram.set_(_torch.empty(h.shape, dtype=h.dtype, device=histogram.device))
        histogram.copy_(h)
    _HIST_SYNCED[key] = [_weakref.ref(histogram, _unsync_hist(key)), obs,
                         (obs._version, histogram._version)]


def _unsync_hist(key):
    return _dropper(_HIST_SYNCED, key)


def _op_reset(state, min_val, max_val, config):
    obs = _bound_observer(state, config)
    obs.reset()
    _bind_state(state, obs)
    _range_into(obs, min_val, max_val, _config(config)["per_channel"])


def _op_calculate_qparams(state, eps, config):
    obs = _bound_observer(state, config)
    return _qparams_tensors(obs, eps.device, _config(config))


# torch 1.13 allows one "DEF" library per namespace and process: it is kept in a holder
# module, so a second import of this file (importlib.reload, two copies on sys.path) keeps
# the first one's kernels (they compute the same) instead of failing.
_HOLDER = _sys.modules.setdefault("_qcal_torch_ops", _types.ModuleType("_qcal_torch_ops"))
if not hasattr(_HOLDER, "library"):
    _HOLDER.library = _torch.library.Library("qcal", "DEF")
    _HOLDER.defined = set()
_LIB = _HOLDER.library


def _define_op(schema, kernel):
    """Defines the op qcal::<name> with a Python kernel (CompositeImplicitAutograd: the
    kernel sees the caller's tensors, requires_grad ones too), once per process."""
    name = schema.split("(", 1)[0]
    if name not in _HOLDER.defined:
        _LIB.define(schema)
        _LIB.impl(name, kernel, "CompositeImplicitAutograd")
        _HOLDER.defined.add(name)


# observe returns x itself, as the eager forward does.
_define_op("observe(Tensor(a) x, Tensor(b!) qcal_state, Tensor(c!) min_val, "
           "Tensor(d!) max_val, str config) -> Tensor(a)", _op_observe)
_define_op("reset(Tensor(a!) qcal_state, Tensor(b!) min_val, Tensor(c!) max_val, "
           "str config) -> ()", _op_reset)
_define_op("histogram(Tensor qcal_state, Tensor(a!) histogram, str config) -> ()",
           _op_histogram)
_define_op("calculate_qparams(Tensor qcal_state, Tensor eps, str config) -> (Tensor, Tensor)",
           _op_calculate_qparams)


class _QcalObserver(_Base):
    """Common part: a qcal.Observer behind PyTorch's observer interface."""

    __module__ = _PUBLIC_MODULE
    __jit_unused_properties__ = ["qcal_observer"]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:
            # Defined in this file: named qcal.torch.X, where users reach it (pickles
            # made when the classes lived in torch.py load, the TorchScript name below
            # is unchanged). A subclass defined elsewhere keeps its own module.
            cls.__module__ = _PUBLIC_MODULE
        # TorchScript name. torch 1.13's load_observer_state_dict tells scripted observers
        # by their qualified name: "quantization.observer" in it marks an observer, and
        # "quantization.observer.PerChannelMinMaxObserver" makes it call the module's
        # _load_from_state_dict_script hook, which may resize buffers (qcal's state bytes
        # change size with the data). Each class, subclasses too, gets its own name, made
        # of identifiers (torch.jit.load cannot parse the "<locals>" of a class defined in
        # a function).
        cls._jit_override_qualname = (
            f"__torch__.{cls.__module__}.quantization.observer.PerChannelMinMaxObserver."
            + ".".join(_re.sub(r"\W", "_", p) for p in cls.__qualname__.split(".")))

    @_torch.jit.export
    def _load_from_state_dict_script(self, state_dict: _Dict[str, _torch.Tensor], prefix: str,
                                     local_metadata: _Dict[str, _torch.Tensor], strict: bool,
                                     missing_keys: _List[str], unexpected_keys: _List[str],
                                     error_msgs: _List[str]):
        """Scripted modules' state load (torch.ao's load_observer_state_dict): min_val,
        max_val and qcal_state take the incoming shapes and values; the next scripted call
        re-reads the observer from qcal_state."""
        for name in ["min_val", "max_val", "qcal_state"]:
            key = prefix + name
            if key in state_dict:
                val = state_dict[key]
                if name == "min_val":
                    self.min_val.resize_(val.shape)
                    self.min_val.copy_(val)
                elif name == "max_val":
                    self.max_val.resize_(val.shape)
                    self.max_val.copy_(val)
                else:
                    self.qcal_state.resize_(val.shape)
                    self.qcal_state.copy_(val)
            elif strict:
                missing_keys.append(key)

    _kind = None          # qcal kind name
    _per_channel = False

    def __init__(self, dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs,
                 eps, **qcal_config):
        quint4x2 = dtype == _torch.quint4x2 and not isinstance(self, _HistogramFamily)
        if dtype not in _DTYPES and not quint4x2:
            raise NotImplementedError(f"{type(self).__name__} supports quint8, qint8 and "
                                      f"qint32{'' if isinstance(self, _HistogramFamily) else ' and quint4x2'}, not {dtype}")
        if (qscheme in _PER_TENSOR) == self._per_channel:
            raise NotImplementedError(
                f"{type(self).__name__}'s qscheme must be "
                f"{'per-channel' if self._per_channel else 'per-tensor'}, not {qscheme}")
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range,
                         quant_min=quant_min, quant_max=quant_max,
                         factory_kwargs=factory_kwargs, eps=eps)
        if (qscheme in (_torch.per_tensor_symmetric, _torch.per_channel_symmetric)
                and reduce_range and dtype == _torch.quint8
                and not isinstance(self, _HistogramFamily)):
            # As torch's MinMax family; its HistogramObserver accepts it ([0, 127], zp 128).
            raise NotImplementedError("Cannot reduce range for symmetric quantization "
                                      "for quint8")
        cfg = dict(dtype=_DTYPES.get(dtype, "quint8"), qscheme=_QSCHEMES[qscheme],
                   reduce_range=bool(reduce_range), eps=float(eps), **qcal_config)
        if quint4x2 and qscheme in _SYMMETRIC:
            raise NotImplementedError(
                "quint4x2 with a symmetric qscheme is not supported (torch gives zero-point "
                "0 on [0, 15]; qcal would give 7): use an affine or float-qparams scheme")
        if quint4x2:
            # torch.quint4x2 (4-bit embeddings): torch's [quant_min, quant_max] ([0, 15])
            # on quint8 storage; the qparams formulas are the same.
            cfg.update(reduce_range=False, quant_min=int(self.quant_min),
                       quant_max=int(self.quant_max))
        elif self.has_customized_qrange:
            cfg["quant_min"] = int(quant_min)
            cfg["quant_max"] = int(quant_max)
        d = self.__dict__
        d["_qcal_obs"] = _qcal.Observer(self._kind, **cfg)
        # What the scripted ops need to rebuild this observer (clones, torch.jit.load).
        self.qcal_config = _json.dumps(dict(kind=self._kind, config=cfg,
                                            per_channel=self._per_channel,
                                            symmetric=qscheme in _SYMMETRIC),
                                       sort_keys=True)
        d["_qcal_synced"] = None
        bufs = _Buffers(d["_buffers"])
        bufs.owner = self
        d["_buffers"] = bufs
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

    def _qcal_set(self, obs):
        self.__dict__["_qcal_obs"] = obs
        self.__dict__["_qcal_synced"] = None

    def forward(self, x_orig):
        """Observes x (a CPU float tensor, or a numpy array) and returns it unchanged; empty
        inputs are skipped. A contiguous float32 tensor is read in place (no copy).
        Scripted (TorchScript), the same update runs through the ``qcal::observe`` op."""
        if _torch.jit.is_scripting():
            return _torch.ops.qcal.observe(x_orig, self.qcal_state, self.min_val,
                                           self.max_val, self.qcal_config)
        return self._qcal_eager_forward(x_orig)

    @_torch.jit.unused
    def _qcal_eager_forward(self, x_orig):
        return self.__dict__["_qcal_obs"]._torch_forward(x_orig)

    def __prepare_scriptable__(self):
        """torch.jit.script: writes the observer's state into the ``qcal_state`` buffer and
        binds it to this observer, so the scripted module goes on from the same data."""
        obs = self.__dict__["_qcal_obs"]
        self._qcal_sync()
        _bind_state(dict.__getitem__(self._buffers, "qcal_state"), obs)
        return self

    def _qcal_sync(self):
        """Copies the qcal observer's running range into the min_val / max_val buffers if
        the observer changed since the last copy."""
        d = self.__dict__
        obs = d["_qcal_obs"]
        synced = d["_qcal_synced"]
        version = obs._version
        if synced is not None and synced[0] is obs and synced[1] == version:
            return
        bufs = d["_buffers"]
        _range_into(obs, dict.__getitem__(bufs, "min_val"), dict.__getitem__(bufs, "max_val"),
                    self._per_channel)
        d["_qcal_synced"] = (obs, version)

    @_torch.jit.export
    def calculate_qparams(self):
        """(scale, zero_point) tensors as PyTorch's observer returns them (float32 / int64;
        shape [1] per tensor, [C] per channel)."""
        if _torch.jit.is_scripting():
            return _torch.ops.qcal.calculate_qparams(self.qcal_state, self.eps,
                                                     self.qcal_config)
        return self._qcal_eager_qparams()

    @_torch.jit.unused
    def _qcal_eager_qparams(self):
        return _qparams_tensors(self.__dict__["_qcal_obs"],
                                dict.__getitem__(self._buffers, "eps").device,
                                _config(self.qcal_config))

    @_torch.jit.export
    def reset_min_max_vals(self):
        """Forgets all data."""
        if _torch.jit.is_scripting():
            _torch.ops.qcal.reset(self.qcal_state, self.min_val, self.max_val,
                                  self.qcal_config)
        else:
            self._qcal_eager_reset()

    @_torch.jit.unused
    def _qcal_eager_reset(self):
        self.__dict__["_qcal_obs"].reset()

    def merge(self, other):
        """Folds another observer's data (same class and config) into this one."""
        src = other.__dict__["_qcal_obs"] if isinstance(other, _QcalObserver) else other
        self.__dict__["_qcal_obs"].merge(src)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}"

    # -- state_dict -----------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        blob = self.__dict__["_qcal_obs"].save()
        self._buffers["qcal_state"] = _torch.frombuffer(bytearray(blob), dtype=_torch.uint8)
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        # Shapes change with the data (per-channel buffers, state bytes): take them from
        # the incoming state before the generic copy checks them (and no sync from the
        # current observer in between: the loaded values win).
        obs = self.__dict__["_qcal_obs"]
        self.__dict__["_qcal_synced"] = (obs, obs._version)
        bufs = self._buffers
        for name in ("min_val", "max_val", "qcal_state"):
            key = prefix + name
            if key in state_dict and name in bufs:
                v = state_dict[key]
                b = dict.__getitem__(bufs, name)
                if b.shape != v.shape:
                    bufs[name] = _torch.empty(v.shape, dtype=b.dtype, device=b.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, unexpected_keys, error_msgs)
        key = prefix + "qcal_state"
        if key in state_dict:
            data = dict.__getitem__(bufs, "qcal_state").cpu().numpy().tobytes()
            try:
                obs = _qcal.Observer.load(data)
            except _qcal.Error as e:
                error_msgs.append(f"{key}: {e}")
                return
            if obs.kind == self._kind:
                self._qcal_set(obs)
                return
            if obs.kind not in _FAMILY or _FAMILY.get(obs.kind) != _FAMILY.get(self._kind):
                error_msgs.append(f"{key}: state of a {obs.kind} observer cannot be loaded "
                                  f"into {type(self).__name__} ({self._kind})")
                return
            # Same min/max family (MovingAverage <-> MinMax): as torch, the buffers carry over.
        elif prefix + "min_val" not in state_dict or prefix + "max_val" not in state_dict:
            return
        else:
            # torch.ao's keys: no qcal_state to miss; its histogram buffer is read below.
            for lst, k in ((missing_keys, key), (unexpected_keys, prefix + "histogram")):
                if k in lst:
                    lst.remove(k)
        # A torch.ao state_dict (or one of the other min/max kind): rebuild the qcal state
        # from PyTorch's buffers, or refuse; never keep an empty observer silently.
        try:
            self._qcal_from_torch_buffers(state_dict, prefix)
        except (_qcal.Error, ValueError) as e:
            error_msgs.append(f"{prefix}: {e}")

    def _qcal_from_torch_buffers(self, state_dict, prefix):
        mn = state_dict[prefix + "min_val"].detach().cpu().to(_torch.float32).reshape(-1)
        mx = state_dict[prefix + "max_val"].detach().cpu().to(_torch.float32).reshape(-1)
        fresh = _qcal.Observer.load(self._qcal_obs.save())
        fresh.reset()
        if self._kind in ("minmax", "moving_average_minmax", "per_channel_minmax",
                          "moving_average_per_channel_minmax"):
            if mn.shape != mx.shape:
                raise ValueError(f"min_val {tuple(mn.shape)} and max_val {tuple(mx.shape)} "
                                 "differ in shape")
            empty = bool(((mn == float("inf")) & (mx == float("-inf"))).all())
            if self._per_channel:
                pairs = _torch.stack([mn, mx], 1).numpy().astype("<f4").tobytes()
                payload = _struct.pack("<Q", mn.numel()) + pairs
            else:
                if mn.numel() != 1:
                    raise ValueError(f"per-tensor min_val has {mn.numel()} values")
                payload = _struct.pack("<ff", float(mn[0]), float(mx[0]))
            blob = fresh.save()
            # docs/state.md: batches at 92, payload length at 100, payload at 108.
            blob = (blob[:92] + _struct.pack("<QQ", 0 if empty else 1, len(payload)) +
                    payload)
            self._qcal_set(_qcal.Observer.load(blob))
            return
        hist_key = prefix + "histogram"
        if self._kind == "histogram" and fresh.config["grid"] == "torch":
            if hist_key not in state_dict:
                raise ValueError("a grid='torch' HistogramObserver needs the 'histogram' "
                                 "buffer of torch's state_dict")
            h = state_dict[hist_key].detach().cpu().to(_torch.float32).contiguous()
            if mn.numel() != 1 or mx.numel() != 1:
                raise ValueError("histogram min_val / max_val must be scalars")
            fresh._torch_histogram_set(h, float(mn[0]), float(mx[0]))
            self._qcal_set(fresh)
            return
        raise ValueError(f"{type(self).__name__} (grid={getattr(self, 'grid', None)!r}) "
                         "cannot rebuild its state from torch.ao's min_val / max_val"
                         + (" / histogram: load it into HistogramObserver(grid='torch'), "
                            "which reproduces PyTorch's histogram" if hist_key in state_dict
                            else ""))


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
    """Histogram-family common part. ``grid``: "lattice" (qcal's default: cells of width
    2^e anchored at zero, results independent of batch order and split), "first_batch"
    (bins over the first batch's exact range, grown by doubling) or, HistogramObserver
    only, "torch" (PyTorch 1.13's HistogramObserver bit for bit); "-" and "_" are one
    character. Other qcal config keys (rules-file spellings) pass through
    ``**qcal_config``."""

    def __init__(self, bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                 factory_kwargs, eps, grid, **extra):
        self.bins = bins
        self.grid = grid
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs,
                         eps, bins=int(bins), grid=str(grid), **extra)


class HistogramObserver(_HistogramFamily):
    """HistogramObserver with qcal's order-independent histogram and L2 search: the same
    arguments as torch's plus ``grid``. grid="lattice" (default): results depend on the
    data only and equal `qcal observe --observer histogram` on the same batches
    (upsample_rate is unused). grid="torch": PyTorch 1.13's HistogramObserver bit for bit
    (histogram, min_val, max_val, scale and zero-point after every batch; upsample_rate
    must be 128, PyTorch's default)."""
    _kind = "histogram"
    __jit_unused_properties__ = ["qcal_observer", "histogram"]

    def __init__(self, bins=2048, upsample_rate=128, dtype=_torch.quint8,
                 qscheme=_torch.per_tensor_affine, reduce_range=False, quant_min=None,
                 quant_max=None, factory_kwargs=None, eps=_torch.finfo(_torch.float32).eps,
                 grid="lattice", **qcal_config):
        self.upsample_rate = upsample_rate
        if str(grid) == "torch" and upsample_rate != 128:
            raise NotImplementedError("grid='torch' reproduces PyTorch's default "
                                      f"upsample_rate=128, not {upsample_rate}")
        super().__init__(bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                         factory_kwargs, eps, grid, **qcal_config)

    @property
    def histogram(self):
        """The histogram as a float32 tensor of ``bins`` counts. grid="torch": PyTorch's
        own ``histogram`` buffer (bins equal bins over [min_val, max_val], counts
        resampled on growth, as torch's). Other grids: the histogram the L2 search runs
        on, ``bins`` equal bins over the data range [min, max] (on the lattice re-binned
        from its cells; edges: ``histogram_edges()``). Zeros before any data. Scripted:
        a tensor attribute the ``qcal::histogram`` op rewrites after every forward and
        reset (saved by torch.jit.save)."""
        return _histogram_counts(self.__dict__["_qcal_obs"], self.bins)

    def __prepare_scriptable__(self):
        """torch.jit.script: as the base class, plus the ``histogram`` tensor attribute of
        the scripted module (an instance entry; the eager property still wins)."""
        super().__prepare_scriptable__()
        self.__dict__["histogram"] = self.histogram.clone()
        return self

    def forward(self, x_orig):
        """Observes x and returns it unchanged (see the base class); scripted, the
        ``histogram`` attribute is rewritten after the update."""
        if _torch.jit.is_scripting():
            x = _torch.ops.qcal.observe(x_orig, self.qcal_state, self.min_val,
                                        self.max_val, self.qcal_config)
            _torch.ops.qcal.histogram(self.qcal_state, self.histogram, self.qcal_config)
            return x
        return self._qcal_eager_forward(x_orig)

    @_torch.jit.export
    def reset_min_max_vals(self):
        """Forgets all data."""
        if _torch.jit.is_scripting():
            _torch.ops.qcal.reset(self.qcal_state, self.min_val, self.max_val,
                                  self.qcal_config)
            _torch.ops.qcal.histogram(self.qcal_state, self.histogram, self.qcal_config)
        else:
            self._qcal_eager_reset()

    def histogram_edges(self):
        """The ``bins + 1`` bin edges of ``histogram`` (float64; empty before any data)."""
        obs = self.__dict__["_qcal_obs"]
        if obs.config["grid"] == "torch":
            _, mn, mx = obs._torch_histogram()
            if mn > mx:
                return _torch.zeros(0, dtype=_torch.float64)
            return _torch.linspace(mn, mx, int(self.bins) + 1, dtype=_torch.float64)
        return _torch.tensor(obs._histogram_bins()[0], dtype=_torch.float64)


class PercentileObserver(_HistogramFamily):
    """Clips at a percentile of |x| (percentile_mode="abs") or of each tail ("two_tails");
    "auto" (default): two tails for an affine integer target, abs for a symmetric one."""
    _kind = "percentile"

    def __init__(self, percentile=99.99, percentile_mode="auto", bins=2048,
                 dtype=_torch.quint8, qscheme=_torch.per_tensor_affine, reduce_range=False,
                 quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=_torch.finfo(_torch.float32).eps, grid="lattice", **qcal_config):
        self.percentile = percentile
        self.percentile_mode = percentile_mode
        super().__init__(bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                         factory_kwargs, eps, grid, percentile=float(percentile),
                         percentile_mode=str(percentile_mode), **qcal_config)


class EntropyObserver(_HistogramFamily):
    """Clips at the KL-divergence optimum (TensorRT's entropy calibration)."""
    _kind = "entropy"

    def __init__(self, bins=2048, entropy_levels=128, dtype=_torch.quint8,
                 qscheme=_torch.per_tensor_affine, reduce_range=False, quant_min=None,
                 quant_max=None, factory_kwargs=None, eps=_torch.finfo(_torch.float32).eps,
                 grid="lattice", **qcal_config):
        self.entropy_levels = entropy_levels
        super().__init__(bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                         factory_kwargs, eps, grid, entropy_levels=int(entropy_levels),
                         **qcal_config)


class MSEObserver(_HistogramFamily):
    """Clips at the threshold with the smallest quantize-dequantize mean squared error."""
    _kind = "mse"

    def __init__(self, bins=2048, dtype=_torch.quint8, qscheme=_torch.per_tensor_affine,
                 reduce_range=False, quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=_torch.finfo(_torch.float32).eps, grid="lattice", **qcal_config):
        super().__init__(bins, dtype, qscheme, reduce_range, quant_min, quant_max,
                         factory_kwargs, eps, grid, **qcal_config)


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
        observer._qcal_set(merged)
        return observer
    return merged


all_reduce_observer.__module__ = _PUBLIC_MODULE
