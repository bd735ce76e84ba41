"""Activation and parameter loggers for PyTorch models (qcal.torch; docs/python.md).

The shape of torchao's prototype quant_logger (log_parameter_info, add_activation_loggers),
with qcal's sinks: statistics through qcal's numeric logger (the CSV columns of `qcal stats`),
tensors as a qcal dump directory `qcal calibrate` reads, or straight into a qcal.Session.
"""
import fnmatch as _fnmatch
import os as _os
import urllib.parse as _urlparse

import numpy as _np
import torch as _torch

import qcal as _qcal
from qcal import _qcal as _ext

_DEFAULT_TYPES = (_torch.nn.Linear, _torch.nn.Conv1d, _torch.nn.Conv2d, _torch.nn.Conv3d)


def _rank_and_size(rank, world_size):
    """The process's rank and the number of ranks: given, else torch.distributed's (when
    initialised), else MPI's environment (Open MPI, MPICH/PMI, PMIx), else (0, 1)."""
    if rank is not None:
        return int(rank), int(world_size if world_size is not None else rank + 1)
    dist = getattr(_torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    for r, s in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                 ("PMIX_RANK", "PMIX_SIZE")):
        if r in _os.environ:
            return int(_os.environ[r]), int(_os.environ.get(s, "0")) or int(_os.environ[r]) + 1
    return 0, 1


def _shard_path(path, rank, size):
    """stats.csv -> stats.rank00001.csv on a run of several ranks (each writes its own)."""
    if size <= 1 or path is None:
        return path
    root, ext = _os.path.splitext(path)
    return "%s.rank%05d%s" % (root, rank, ext)


def _dump_name(name):
    """A tensor name as a dump directory entry: '%' and '/' (and bytes a file name cannot
    hold) percent-encoded, as `qcal calibrate` decodes them."""
    return _urlparse.quote(name, safe="._-:+=,@")


def _f32(x):
    return x.detach().to(dtype=_torch.float32, device="cpu").contiguous()


def log_parameter_info(model, csv=None, names=None):
    """Logs every parameter of model (optionally only names matching the fnmatch globs in
    `names`) as one 'param' record of qcal's numeric logger; csv: the CSV (columns of
    `qcal stats`) written atomically. Returns the records as a list of dicts (fqn, op,
    shape, numel, min, max, absmax, mean, std)."""
    lg = _ext.NumericLogger(csv=csv)
    rows = []
    for fqn, p in model.named_parameters():
        if names is not None and not any(_fnmatch.fnmatchcase(fqn, g) for g in names):
            continue
        mod = model.get_submodule(fqn.rsplit(".", 1)[0]) if "." in fqn else model
        op = type(mod).__name__
        x = _f32(p)
        lg.log("param", fqn, op, x)
        a = x.numpy().astype(_np.float64)
        fin = a[_np.isfinite(a)]
        rows.append(dict(fqn=fqn, op=op, shape=tuple(p.shape), numel=p.numel(),
                         min=float(fin.min()) if fin.size else None,
                         max=float(fin.max()) if fin.size else None,
                         absmax=float(_np.abs(fin).max()) if fin.size else None,
                         mean=float(fin.mean()) if fin.size else None,
                         std=float(fin.std(ddof=1)) if fin.size > 1 else 0.0))
    lg.finish()
    return rows


class ActivationLoggers:
    """The handle add_activation_loggers returns: remove() (or leaving a `with` block)
    takes every hook off the model and commits the statistics CSV; the model is then the
    one it was (no attribute, buffer or hook of qcal's is left)."""

    def __init__(self, hooks, logger, csv, dump_dir, names):
        self._hooks = hooks
        self._logger = logger
        self.csv = csv
        self.dump_dir = dump_dir
        self.names = names          # module fqns logged
        self.calls = 0              # forward calls seen (over every logged module)

    def remove(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._logger is not None:
            self._logger.finish()
            self._logger = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def add_activation_loggers(model, module_types=None, *, names=None, outputs=(),
                           stats_csv=None, dump_dir=None, session=None, rank=None,
                           world_size=None):
    """Hooks every module of model that is an instance of module_types (default: Linear
    and Conv1d/2d/3d; any module types may be given) and whose name matches one of the
    fnmatch globs in `names` (default: all). Each forward call of such a module M logs its
    input as the tensor "M.input", and when M matches a glob of `outputs` its output as
    "M.output" (the KV-cache scales of an FP8 checkpoint come from "*.k_proj" and
    "*.v_proj" outputs). Sinks, any combination:
      - stats_csv: one record per call through qcal's numeric logger, the columns of
        `qcal stats` (t=act, op "linear" with extra "MKN=M|K|N", or the module type);
      - dump_dir: the tensors as a qcal dump directory: dump_dir/<tensor>/<call, 6
        digits>.npy (float32), which `qcal calibrate dump_dir` reads;
      - session: a qcal.Session fed each tensor (session.observe(name, x)).
    With several ranks (torch.distributed initialised, an MPI launcher's environment, or
    rank/world_size given) each rank writes its own shard: dump_dir/rank<r, 5 digits>/ and
    stats CSV name.rank<r>.csv; calibrate each dump with --save-state and join them with
    `qcal merge` (docs/python.md). Returns an ActivationLoggers handle."""
    types = tuple(module_types) if module_types is not None else _DEFAULT_TYPES
    r, size = _rank_and_size(rank, world_size)
    csv = _shard_path(stats_csv, r, size)
    ddir = None
    if dump_dir is not None:
        ddir = _os.path.join(dump_dir, "rank%05d" % r) if size > 1 else dump_dir
        _os.makedirs(ddir, exist_ok=True)
    logger = _ext.NumericLogger(csv=csv) if csv is not None else None
    counts = {}
    hooks, logged = [], []
    handle = ActivationLoggers(hooks, logger, csv, ddir, logged)

    def emit(tname, module, x, op):
        xf = _f32(x)
        if logger is not None:
            if isinstance(module, _torch.nn.Linear) and xf.dim() >= 1:
                k = xf.shape[-1]
                logger.log("act", tname, op, xf,
                           (xf.numel() // k if k else 0, k, module.out_features))
            else:
                logger.log("act", tname, op, xf)
        if session is not None:
            session.observe(tname, xf)
        if ddir is not None:
            i = counts.get(tname, 0)
            counts[tname] = i + 1
            d = _os.path.join(ddir, _dump_name(tname))
            if i == 0:
                _os.makedirs(d, exist_ok=True)
            _np.save(_os.path.join(d, "%06d.npy" % i), xf.numpy())

    for fqn, mod in model.named_modules():
        if not fqn or not isinstance(mod, types):
            continue
        if names is not None and not any(_fnmatch.fnmatchcase(fqn, g) for g in names):
            continue
        op = "linear" if isinstance(mod, _torch.nn.Linear) else type(mod).__name__.lower()
        want_out = any(_fnmatch.fnmatchcase(fqn, g) for g in outputs)

        def pre(module, args, fqn=fqn, op=op):
            handle.calls += 1
            if args and isinstance(args[0], _torch.Tensor):
                emit(fqn + ".input", module, args[0], op)

        hooks.append(mod.register_forward_pre_hook(pre))
        if want_out:
            def post(module, args, out, fqn=fqn, op=op):
                if isinstance(out, _torch.Tensor):
                    emit(fqn + ".output", None, out, op)
            hooks.append(mod.register_forward_hook(post))
        logged.append(fqn)
    return handle
