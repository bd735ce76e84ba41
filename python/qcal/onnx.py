"""qcal.onnx: calibrate an ONNX model by running it in ONNX Runtime, and write its Q/DQ model.

``calibrate(model, data)`` returns the ``qcal.Table`` that ``qcal calibrate MODEL.onnx
--data SPEC`` writes; ``qdq(model, out, data=... | table=...)`` writes the model ``qcal qdq
MODEL.onnx --data SPEC -o OUT`` (or ``--table``) writes, byte for byte, and with
``min_output_sqnr=`` / ``max_drop=`` keeps the most sensitive ops float as ``qcal qdq
--min-output-sqnr / --max-drop`` does; ``compare(float_model, qdq_model, data)`` returns what
``qcal compare --format json`` writes (docs/accuracy.md). ONNX Runtime is loaded
at run time through its C API (libonnxruntime.so.1: ``ort_lib``, else $QCAL_ORT_LIB, the
loader's path, then the npm cache ./run.sh fills; docs/engine.md); neither the ``onnx`` nor
the ``onnxruntime`` Python package is needed.

``model``: a path (str / os.PathLike), the bytes of a serialized model, or an object with
``SerializeToString()`` (``onnx.ModelProto``). BatchNormalizations are folded into the Conv
before them first, as the CLI does, so tensor names agree between calibration and qdq.

``data``: what the model runs on, one of
  - an iterable of ``{input name: array}`` dicts, each dict one run (numpy arrays, or any
    buffer-protocol object, or CPU torch tensors): every model input, with exactly the dtype
    the model declares (no casts: a float64 array for a float32 input raises
    ``MismatchError`` naming the input and both types) and a shape the model accepts; arrays
    are read in place when C-contiguous (else copied once, dtype kept);
  - an object with ONNX Runtime's ``CalibrationDataReader`` protocol: ``get_next()``
    returns such a dict, or None at the end (``rewind()`` is not called);
  - a data spec (str / os.PathLike): a directory or .npy / .npz / .safetensors file, as the
    CLI's ``--data`` (docs/onnx.md, "Calibration data"); ``batch`` samples per run there.
The GIL is released while the model runs and while the tensors are observed.
``compare`` and the keep-float search read their data as a data spec: runs given as arrays
(an iterable or a reader) are written to a temporary directory first, one .npz file per run
(removed afterwards); labels are read in place.
"""
import contextlib as _contextlib
import os as _os
import tempfile as _tempfile
import zipfile as _zipfile

import numpy as _np

from . import _qcal
from . import Error, Session, Table, _rules_text

__all__ = ["calibrate", "observe", "qdq", "compare", "tensors", "engine_info"]


def _model(model, fold_bn=True, opset=0):
    if isinstance(model, (str, _os.PathLike)):
        return _qcal._OnnxModel(path=_os.fspath(model), fold_bn=fold_bn, opset=opset)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _qcal._OnnxModel(data=model, fold_bn=fold_bn, opset=opset)
    if hasattr(model, "SerializeToString"):
        return _qcal._OnnxModel(data=model.SerializeToString(), fold_bn=fold_bn, opset=opset)
    raise TypeError("model must be a path, the bytes of an ONNX model or an onnx.ModelProto, "
                    f"not {type(model).__name__}")


def _names(v, what):
    """None, one str or an iterable of str -> list or None."""
    if v is None:
        return None
    if isinstance(v, str):
        return [v]
    v = list(v)
    for s in v:
        if not isinstance(s, str):
            raise TypeError(f"{what}: expected str items, got {type(s).__name__}")
    return v


def _op_types(v):
    if v is None or isinstance(v, str):
        return v
    return ",".join(_names(v, "op_types"))


def _carry(carry):
    if carry is None:
        return None
    if isinstance(carry, dict):
        pairs = [f"{o}={i}" for o, i in carry.items()]
    else:
        pairs = _names(carry, "carry")
    for p in pairs:
        o, eq, i = p.partition("=")
        if not o or not eq or not i:
            raise ValueError(f"carry '{p}': expected OUTPUT=INPUT")
    return pairs


def _batch(batch):
    if batch is None:
        return 0
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1 (or None: automatic), not {batch!r}")
    return batch


def _array(name, v):
    """A buffer the C side reads in place: C-contiguous, the dtype kept."""
    if isinstance(v, _np.ndarray):
        return v if v.flags.c_contiguous else _np.ascontiguousarray(v)
    if type(v).__module__.startswith("torch"):
        if v.device.type != "cpu":
            raise TypeError(f"input '{name}': expected a CPU tensor, got one on {v.device}")
        return _np.ascontiguousarray(v.detach().resolve_conj().resolve_neg().numpy())
    if isinstance(v, (bytes, bytearray, str)) or v is None:
        raise TypeError(f"input '{name}': expected an array, got {type(v).__name__}")
    return _np.ascontiguousarray(_np.asarray(v))


def _runs(data):
    """The runs of an iterable or a CalibrationDataReader."""
    if hasattr(data, "get_next") and callable(data.get_next):
        while True:
            d = data.get_next()
            if d is None:
                return
            yield d
    else:
        yield from data


def _is_spec(data):
    return isinstance(data, (str, _os.PathLike))


@_contextlib.contextmanager
def _spec(data, what="data"):
    """The data as a spec path for the accuracy calls, whose C functions open it themselves:
    a spec as given, or the runs of an iterable / reader written to a temporary directory,
    one .npz per run (stored, not compressed; names sort in run order), removed on exit."""
    if data is None:
        raise TypeError(f"{what}: an iterable of {{input: array}} dicts, a "
                        "CalibrationDataReader or a data spec path")
    if _is_spec(data):
        yield _os.fspath(data)
        return
    if isinstance(data, dict):
        raise TypeError(f"{what} is one dict: give a list of dicts (each one run)")
    with _tempfile.TemporaryDirectory(prefix="qcal-data-") as d:
        for n, run in enumerate(_runs(data)):
            if not isinstance(run, dict):
                raise TypeError("each run must be a dict {input name: array}, got "
                                f"{type(run).__name__}")
            with _zipfile.ZipFile(_os.path.join(d, f"run{n:09d}.npz"), "w",
                                  _zipfile.ZIP_STORED) as z:
                for k, v in run.items():
                    if not isinstance(k, str):
                        raise TypeError(f"input names must be str, got {type(k).__name__}")
                    with z.open(k + ".npy", "w", force_zip64=True) as f:
                        _np.lib.format.write_array(f, _array(k, v), allow_pickle=False)
        yield d


def _labels(labels):
    """None, a .npy path or an array of integer labels -> a C-contiguous array (the C side
    takes int64 or int32 and says so otherwise)."""
    if labels is None:
        return None
    if isinstance(labels, (str, _os.PathLike)):
        labels = _np.load(_os.fspath(labels), allow_pickle=False)
    return _array("labels", labels)


def _count(v, what):
    """None (the default: -1 to the C side) or an int >= 0."""
    if v is None:
        return -1
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what} must be an int >= 0 (or None: the default), not {v!r}")
    return v


def _path_name(model):
    """What the CLI's JSON records for a model: its path as given ("" for bytes)."""
    return _os.fspath(model) if isinstance(model, (str, _os.PathLike)) else ""


def observe(model, data, session, *, profile="ort", op_types=None, exclude=None, batch=None,
            carry=None, ort_lib=None, threads=0, observer_auto=False, overlap=False,
            _loaded=None):
    """Runs ``model`` on ``data`` in ONNX Runtime and observes every tensor ``profile`` quantizes
    into ``session`` (a ``qcal.Session``; role activation, step = the run's index). Returns a
    report dict: tensors (observed per run), files, samples, runs, batch, max_run_bytes,
    empty, engine_seconds, wait_seconds, engine_version, engine_library, passes, chosen,
    auto_samples, auto_choice, auto_sqnr_db (observer_auto at the outputs: the samples the
    whole-model candidates ran on, the one chosen, "per-tensor" or a kind, each one's output
    SQNR and its samples whose argmax agrees with float's everywhere; docs/accuracy.md).
    ``carry`` ("OUT=IN" strings or {OUT: IN}): output OUT of a run is input IN of the next
    (zeros at the start; an iterable's runs are one sequence, a data spec's files one each).
    ``observer_auto``: each tensor's observer chosen by the exact SQNR of every commuting
    candidate (``qcal calibrate --observer auto``): the data is run twice, so it must be a
    data spec, a sequence (list, tuple) or a reader with ``rewind()``; ``chosen`` counts the
    tensors each observer kind won. ``overlap``: each run's tensors are observed while the
    engine computes the next run (``qcal calibrate --overlap``: up to two runs' outputs in
    memory; default: observed and released before it); the same table either way."""
    if data is None:
        raise TypeError("observe() needs data: an iterable of {input: array} dicts, a "
                        "CalibrationDataReader or a data spec path")
    if not isinstance(session, _qcal.Session):
        raise TypeError(f"session must be a qcal.Session, not {type(session).__name__}")
    spec = _is_spec(data)
    if batch is not None and not spec:
        raise ValueError("batch= splits a data spec's files into runs; each item of an "
                         "iterable (or each get_next()) is one run as given")
    if isinstance(data, dict):
        raise TypeError("data is one dict: give a list of dicts (each one run)")
    reader = hasattr(data, "get_next") and callable(data.get_next)
    if observer_auto and not spec and not (
            isinstance(data, (list, tuple)) or (reader and callable(getattr(data, "rewind", None)))):
        raise TypeError("observer='auto' runs the data twice: give a data spec path, a list or "
                        "tuple of runs, or a CalibrationDataReader with rewind()")
    carry = _carry(carry)
    m = _loaded if _loaded is not None else _model(model)
    mc = _qcal._ModelCalib(m, session, profile=profile, op_types=_op_types(op_types),
                           exclude=_names(exclude, "exclude"), batch=_batch(batch),
                           carry=carry, ort_lib=ort_lib, threads=threads,
                           observer_auto=bool(observer_auto), overlap=bool(overlap))
    if spec:
        optional = [p.partition("=")[2] for p in carry] if carry else None
        mc.feed_data(_os.fspath(data), None, optional)   # both passes with observer_auto
    else:
        for p in range(2 if observer_auto else 1):
            if p:
                mc.next_pass()
                mc.reset()
                if reader:
                    data.rewind()
            for d in _runs(data):
                if not isinstance(d, dict):
                    raise TypeError("each run must be a dict {input name: array}, got "
                                    f"{type(d).__name__}")
                mc.feed({k: _array(k, v) for k, v in d.items()})
    return mc.finish()


def _auto(observer, rules, rules_text, config):
    """Whether the observers are chosen (observer="auto"; qdq's default with data); refuses
    auto with rules or observer options, as ``qcal qdq --observer auto`` does."""
    if observer != "auto":
        return False
    if rules is not None or rules_text is not None or config:
        given = sorted(config) + [k for k, v in (("rules", rules), ("rules_text", rules_text))
                                  if v is not None]
        raise TypeError("observer='auto' chooses every tensor's observer: it takes no "
                        "rules or observer options (%s)" % ", ".join(given))
    return True


def calibrate(model, data, *, observer=None, rules=None, rules_text=None, profile="ort",
              op_types=None, exclude=None, batch=None, carry=None, ort_lib=None,
              overlap=False, allow_empty=False, max_memory=2 ** 31, **config):
    """Calibrates ``model`` on ``data`` (see the module's doc) and returns the ``qcal.Table``,
    the table ``qcal calibrate MODEL.onnx --data SPEC`` writes for the same runs.
    ``observer`` + config (bins=, qscheme=, ...), ``rules`` (a rules file) and
    ``rules_text`` set the observers as ``qcal.Session`` does (default histogram);
    ``observer="auto"`` chooses each tensor's observer (see ``observe``; the data run twice);
    ``profile`` ("ort" or "tensorrt"), ``op_types`` and ``exclude`` (globs) choose the tensors
    as ``qdq`` will; ``batch``: samples per run of a data spec (default automatic; ranges do
    not depend on it); ``carry``: recurrent state and ``overlap`` (see ``observe``);
    ``ort_lib``: the path of libonnxruntime.so.1. A tensor that saw no finite value raises ``NoDataError`` unless
    ``allow_empty``."""
    auto = _auto(observer, rules, rules_text, config)
    if config and observer is None:
        _rules_text(config=config, caller="calibrate")   # raises the TypeError
    s = Session(rules=rules, rules_text=rules_text, observer=None if auto else observer,
                max_memory=max_memory, **config)
    observe(model, data, s, profile=profile, op_types=op_types, exclude=exclude, batch=batch,
            carry=carry, ort_lib=ort_lib, observer_auto=auto, overlap=overlap)
    return s.table(allow_empty=allow_empty, profile=profile)


def qdq(model, out, data=None, table=None, *, profile="ort", observer=None, rules=None,
        rules_text=None, op_types=None, exclude=None, weight_observer=None,
        weight_qscheme=None, float_weights=False, strict=False, equalize=False, batch=None,
        carry=None, ort_lib=None, overlap=False, allow_empty=False, min_output_sqnr=None,
        max_drop=None, labels=None, metric=None, eval_data=None, sensitivity_samples=None,
        **config):
    """Writes ``model`` with QuantizeLinear/DequantizeLinear nodes to ``out`` (atomically), as
    ``qcal qdq``: activations from ``table`` (a ``qcal.Table`` or a JSON table path) or from
    calibrating on ``data`` (exactly one of them; with data the observer options of
    ``calibrate`` apply, ``batch``, ``carry`` and ``overlap`` too; default
    ``observer="auto"`` unless rules, rules_text or observer options are given, as
    ``qcal qdq --data``), weights from the model's own initializers
    (``weight_observer``,
    ``weight_qscheme``, or ``float_weights=True`` to leave them float). ``strict``: tensors
    missing from the table raise ``NotFoundError`` (default: they stay float, listed in the
    report). ``equalize``: cross-layer equalization first (``qcal qdq --equalize``).
    Returns a report dict: profile, ops, tensors, weights, biases, missing, skipped; with
    data also table (the ``qcal.Table`` made), samples, runs, engine_version, passes, chosen,
    auto_samples, auto_choice, auto_sqnr_db, auto_agree (as ``observe``'s; the candidates are quantized with
    the default weight options).

    The keep-float search (``qcal qdq --min-output-sqnr DB`` / ``--max-drop POINTS``,
    docs/accuracy.md): with ``min_output_sqnr`` (dB over every float output) and/or
    ``max_drop`` (float's metric minus the quantized model's, in points; needs ``labels``,
    ``metric`` as ``compare``), the most sensitive ops (ranked one at a time on the first
    ``sensitivity_samples`` samples, default 8) stay float, fewest first, until the target
    holds on ``eval_data`` (default: ``data``; needed with ``table=``), measured on the
    real QDQ model against float; their node names join ``exclude``. The report then has
    keep_float: float_ops (most sensitive first), ops (quantized before), met, sqnr_db,
    metric (with labels), accuracy_float, accuracy_quantized (fractions; None without
    labels), runs, checks, seconds. When the target does not hold even with every op float, nothing is
    written: ``qcal.Error`` (its ``keep_float`` attribute holds that dict)."""
    if (data is None) == (table is None):
        raise TypeError("qdq() needs exactly one of data= (calibrate by running the model) "
                        "and table= (a qcal.Table or a JSON table path)")
    keep_float = min_output_sqnr is not None or max_drop is not None
    if table is not None and (observer is not None or rules is not None or rules_text is not None
                              or config or (batch is not None and not keep_float)
                              or carry is not None or equalize or allow_empty):
        raise TypeError("observer, rules, rules_text, observer options, batch, carry, "
                        "equalize and allow_empty go with data=, not table=")
    if not keep_float and (labels is not None or metric is not None or eval_data is not None
                           or sensitivity_samples is not None):
        raise TypeError("labels, metric, eval_data and sensitivity_samples go with "
                        "min_output_sqnr or max_drop")
    if keep_float and data is None and eval_data is None:
        raise TypeError("min_output_sqnr and max_drop judge the model on data: give data= or "
                        "eval_data=")
    if keep_float and carry is not None:
        raise TypeError("carry does not go with min_output_sqnr / max_drop (their runs stand "
                        "alone)")
    if table is not None and not isinstance(table, Table):
        table = Table.read_json(_os.fspath(table))
    m = _model(model)
    rep = {}
    if equalize:
        m.equalize()
    if data is not None:
        if keep_float and eval_data is None and not _is_spec(data):
            data = list(_runs(data))   # run twice: calibration, then the search
        if observer is None and rules is None and rules_text is None and not config:
            observer = "auto"
        auto = _auto(observer, rules, rules_text, config)
        if config and observer is None:
            _rules_text(config=config, caller="qdq")   # raises the TypeError
        s = Session(rules=rules, rules_text=rules_text, observer=None if auto else observer,
                    **config)
        crep = observe(None, data, s, profile=profile, op_types=op_types, exclude=exclude,
                       batch=batch, carry=carry, ort_lib=ort_lib, observer_auto=auto,
                       overlap=overlap, _loaded=m)
        table = s.table(allow_empty=allow_empty, profile=profile)
        rep = {"table": table, "samples": crep["samples"], "runs": crep["runs"],
               "engine_version": crep["engine_version"], "passes": crep["passes"],
               "chosen": crep["chosen"], "auto_samples": crep["auto_samples"],
               "auto_choice": crep["auto_choice"], "auto_sqnr_db": crep["auto_sqnr_db"],
               "auto_agree": crep["auto_agree"]}
    exclude = _names(exclude, "exclude")
    if keep_float:
        kf = _keep_float(m, table, data if eval_data is None else eval_data, profile=profile,
                         weight_observer=weight_observer, exclude=exclude,
                         op_types=_op_types(op_types), strict=bool(strict),
                         weight_qscheme=weight_qscheme, float_weights=bool(float_weights),
                         min_output_sqnr=min_output_sqnr, max_drop=max_drop, labels=labels,
                         metric=metric, sensitivity_samples=sensitivity_samples, batch=batch,
                         ort_lib=ort_lib)
        exclude = (exclude or []) + [_qcal._keep_float_exclude(n) for n in kf["float_ops"]]
        rep["keep_float"] = kf
    res = m.qdq_save(table, _os.fspath(out), profile, weight_observer, exclude,
                     _op_types(op_types), strict=bool(strict),
                     weight_qscheme=weight_qscheme, float_weights=bool(float_weights))
    res.update(rep)
    return res


def _target(v, what, lo):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= lo) \
            or v in (float("inf"), float("-inf")):
        raise ValueError(f"{what} must be a finite number >= {lo:g}, not {v!r}")
    return float(v)


def _keep_float(m, table, data, *, min_output_sqnr, max_drop, labels, metric,
                sensitivity_samples, batch, **qdq_options):
    """qcal_accuracy_keep_float on the loaded model m (left as it is) -> the keep_float dict;
    raises qcal.Error, as ``qcal qdq`` exits 1, when the target does not hold with every op
    float."""
    sqnr = float("nan") if min_output_sqnr is None else _target(min_output_sqnr,
                                                                "min_output_sqnr", -1e9)
    drop = float("nan") if max_drop is None else _target(max_drop, "max_drop", 0)
    lab = _labels(labels)
    with _spec(data, "eval_data") as spec:
        kf = m.keep_float(table, spec, min_output_sqnr=sqnr, max_drop=drop, labels=lab,
                          metric=metric,
                          sensitivity_samples=_count(sensitivity_samples, "sensitivity_samples"),
                          batch=_batch(batch), **qdq_options)
    kf = {"float_ops": kf["float_ops"], "ops": kf["ops"], "met": kf["met"],
          "sqnr_db": kf["sqnr_db"], "metric": (metric or "top1") if lab is not None else None,
          "accuracy_float": kf["accuracy_float"],
          "accuracy_quantized": kf["accuracy_quantized"], "runs": kf["runs"],
          "checks": kf["checks"], "seconds": kf["seconds"]}
    if not kf["met"]:
        e = Error("the target does not hold even with every op float (output SQNR %.2f dB): "
                  "nothing written" % kf["sqnr_db"])
        e.keep_float = kf
        raise e
    return kf


def compare(float_model, qdq_model, data, *, labels=None, metric=None,
            sensitivity_samples=None, batch=None, label_output=0, others=True,
            max_samples=None, threads=0, ort_lib=None):
    """Runs ``float_model`` and ``qdq_model`` in ONNX Runtime on ``data`` (see the module's
    doc) and compares them at every model output, then measures each quantized op's
    sensitivity on the first ``sensitivity_samples`` samples (default 8; 0: none), as ``qcal
    compare FLOAT QDQ --data SPEC --format json``. Returns that JSON as a dict, the same keys
    in the same order: float, quantized (the paths as given, "" for bytes), engine, samples,
    metric, sqnr_db, outputs (one dict per output: name, samples, positions, nonfinite,
    sqnr_db, cosine, top1_agreement, exact_agreement, accuracy_float, accuracy_quantized),
    sensitivity_samples, gated_sqnr_db, ops (name, op_type, sqnr_alone_db, sqnr_all_but_db;
    most sensitive first, as the CLI lists them), runs, seconds. Figures that do not apply
    are None (the JSON's null), +inf is ``float("inf")`` (the JSON's "inf").
    ``labels``: integer labels (int64 / int32 array or .npy path), one row per sample in
    data order, for output ``label_output``; ``metric``: "top1" (the default) or "exact",
    with labels only. ``batch``: samples per run where the data can be split (default 8; the
    per-op runs take one sample each); ``others=False`` skips the all-but-one runs
    (sqnr_all_but_db None); ``max_samples``: only the first ones. ``float_model`` is also
    read as ``qdq`` reads it (opset raised to 13, BatchNormalizations folded) to find the
    float weights of the QDQ model's quantized ones; the float model run is the model as
    given."""
    fm = _model(float_model, fold_bn=False)
    qm = _model(qdq_model, fold_bn=False)
    ref = _model(float_model, fold_bn=True, opset=13)
    lab = _labels(labels)
    sens = _count(sensitivity_samples, "sensitivity_samples")
    with _spec(data) as spec:
        return _qcal._model_compare(
            fm, qm, ref, spec, labels=lab, label_output=label_output, metric=metric,
            sensitivity_samples=sens, batch=_batch(batch), threads=threads,
            max_samples=max(_count(max_samples, "max_samples"), 0), others=bool(others),
            ort_lib=ort_lib, float_name=_path_name(float_model),
            quantized_name=_path_name(qdq_model))


def tensors(model, *, profile="ort", op_types=None, exclude=None):
    """The tensors ``profile`` quantizes in ``model`` (BatchNormalizations folded first), in
    graph order: the names ``calibrate`` observes and ``qdq`` looks up in the table, as
    ``qcal onnx-expose --list`` writes them."""
    return _model(model).list(profile, _op_types(op_types), _names(exclude, "exclude"))


def engine_info(ort_lib=None):
    """(version, library path) of the ONNX Runtime qcal loads; raises (``NotFoundError``
    naming every place tried) when there is none."""
    return _qcal._engine_info(ort_lib)
