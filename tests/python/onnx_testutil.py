"""What the qcal.onnx tests share (tests/python/test_onnx_calibrate.py, test_onnx_accuracy.py):
the committed MobileNet-style model and image batch, the skip reason, and the GIL check's
counting loop."""
import os
import sys
import threading
import time

import qcal
import qcal.onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "examples", "mobilenet", "mobilenet.onnx")
BATCH = os.path.join(ROOT, "examples", "data", "fmnist_test_batch.npy")
BIN = os.environ.get("QCAL_BIN")


def skip_reason():
    """Why the tests cannot run here (one line), or None."""
    if not qcal._qcal._onnx_available():
        return "libqcal built without ONNX support"
    if not BIN:
        return "QCAL_BIN not set"
    try:
        qcal.onnx.engine_info()
    except qcal.Error as e:
        return f"ONNX Runtime not found: {e}"
    return None


def _solo_rate(sec=0.2):
    """This thread's counting rate (per second, the loop of count_beside) alone."""
    counter, t0 = [0], time.perf_counter()
    while time.perf_counter() - t0 < sec:
        counter[0] += 1
    return counter[0] / (time.perf_counter() - t0)


def count_beside(work, counter):
    """Runs work() on another thread while this one adds 1 to counter[0] as fast as it can
    (switch interval 0.5 ms); returns this thread's solo counting rate (the mean of one
    measured before and one after) and the seconds work took. work's exception is raised
    here."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        rate = _solo_rate()
        done, errors = threading.Event(), []

        def run():
            try:
                work()
            except BaseException as e:   # noqa: B902  (reported by the main thread)
                errors.append(e)
            done.set()

        th = threading.Thread(target=run)
        t0 = time.perf_counter()
        th.start()
        while not done.is_set():
            counter[0] += 1
        dt = time.perf_counter() - t0
        th.join()
        rate = (rate + _solo_rate()) / 2
    finally:
        sys.setswitchinterval(old)
    if errors:
        raise errors[0]
    return rate, dt
