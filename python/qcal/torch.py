"""qcal.torch: drop-in ``torch.ao.quantization`` observers computed by libqcal.

Each class takes PyTorch 1.13's constructor arguments and works wherever torch's observers
do: ``QConfig(activation=qcal.torch.HistogramObserver.with_args(reduce_range=True), ...)``
with ``prepare_fx`` / ``convert_fx``. The min/max kinds give PyTorch's numbers bit for bit;
the histogram family (``HistogramObserver``, ``PercentileObserver``, ``EntropyObserver``,
``MSEObserver``) gives exactly what ``qcal observe`` gives on the same batches.

TorchScript: every observer scripts; scripted, the update, ``calculate_qparams`` and
``reset_min_max_vals`` run through the custom ops ``qcal::observe``,
``qcal::calculate_qparams`` and ``qcal::reset`` (Python kernels registered with
torch.library on import), with the data kept in the module's tensors, so prepare_jit /
convert_jit, torch.jit.save / load and clones work. Fake-quant modules, the ``default_*``
objects and the ``get_default_*`` qconfig helpers are in python/qcal/_torch_qat.py.

State: ``min_val`` / ``max_val`` are registered buffers (PyTorch's shapes: 0-d per tensor,
1-d per channel, +inf/-inf when empty) and ``qcal_state`` is a uint8 buffer with the
observer's qcal state bytes, so ``state_dict`` / ``load_state_dict`` / ``.to()`` work.

Across ``torch.distributed`` ranks, ``all_reduce_observer(obs)`` all-gathers every rank's
state bytes and merges them in rank order, so every rank ends with the same observer;
exact for every kind except the two moving-average ones (their merge is refused unless
all but one rank is empty: use one rank's observer, or average outside qcal).
"""
# The implementation sits in three private modules, none of which imports this one:
# _torch_observers.py (the observer classes, the torch.library ops, all_reduce_observer),
# _torch_loggers.py (activation and parameter loggers) and _torch_qat.py (fake-quant modules,
# torch.ao's default objects and qconfig helpers on the observers). The classes name this
# module as theirs (pickles, reprs, TorchScript names say qcal.torch.X).
try:
    import torch as _torch  # noqa: F401
except ImportError as _e:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "qcal.torch needs PyTorch (Debian: apt-get install python3-torch); the numpy API "
        "in `qcal` works without it") from _e

# The private classes that name qcal.torch as their module come along: the two bases
# (isinstance checks) and _Buffers, the observers' buffer dict (torch.save pickles it).
from qcal._torch_observers import (  # noqa: F401
    EntropyObserver, HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver, MSEObserver, PercentileObserver,
    PerChannelMinMaxObserver, _Buffers, _HistogramFamily, _QcalObserver, all_reduce_observer)

__all__ = [
    "MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver", "HistogramObserver", "PercentileObserver",
    "EntropyObserver", "MSEObserver", "all_reduce_observer",
]

# Activation and parameter loggers (torchao's quant_logger shape; python/qcal/_torch_loggers.py).
from qcal._torch_loggers import (  # noqa: E402
    ActivationLoggers, add_activation_loggers, log_parameter_info)

__all__ += ["ActivationLoggers", "add_activation_loggers", "log_parameter_info"]

# Fake-quant modules, torch.ao's default objects and qconfig helpers on qcal.torch's classes
# (python/qcal/_torch_qat.py).
from qcal._torch_qat import (  # noqa: E402
    DEFAULTS as _DEFAULTS, FakeQuantize, FusedMovingAvgObsFakeQuantize, get_default_qat_qconfig,
    get_default_qat_qconfig_mapping, get_default_qconfig, get_default_qconfig_mapping,
    qcal_qconfig)

globals().update(_DEFAULTS)
__all__ += ["FakeQuantize", "FusedMovingAvgObsFakeQuantize", "get_default_qconfig",
            "get_default_qat_qconfig", "get_default_qconfig_mapping",
            "get_default_qat_qconfig_mapping", "qcal_qconfig", *sorted(_DEFAULTS)]
