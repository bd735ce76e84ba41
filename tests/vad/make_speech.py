#!/usr/bin/python3
"""Labelled speech for voice-activity detection, made offline and seeded (docs/models.md,
"Silero VAD").

Each set is one 16 kHz float32 stream of clips. A clip is: a gap (silence or noise only),
then utterances from espeak-ng (voice, speed, pitch and sentence drawn from the seed), each
followed by a gap; the whole clip gets one background noise from sox (white, pink or brown
noise, or none) at an SNR drawn from 0-20 dB against the clip's speech, and every utterance
its own level (0 to -24 dB). Frame labels (one per 512 samples, the VAD's window) follow
from the assembly: a frame is speech when the clean utterance placed there has energy
within 35 dB of that utterance's loudest frame, with pauses shorter than 200 ms inside an
utterance counted as speech (word gaps); frames outside utterances are non-speech.

    make_speech.py OUT_DIR [--seed N] [--calib-seconds S] [--eval-seconds S]

writes OUT_DIR/{calib,eval}.npy (float32 samples), {calib,eval}_labels.npy (uint8 per
frame) and speech.json (the clips, voices, SNRs). The calibration and evaluation sets use
disjoint sentences and different seeds. Needs espeak-ng and sox on PATH."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

SR = 16000
FRAME = 512

# Two disjoint sentence pools: calibration and evaluation never share a sentence.
CALIB_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A quantized network stores its weights in eight bits.",
    "The train to the coast leaves at seven in the morning.",
    "We measured every number in this table on the same machine.",
    "Rain is expected over the hills by the end of the afternoon.",
    "Turn left at the second light, then keep going until the bridge.",
    "She sells sea shells by the sea shore.",
    "Nobody here trained this model, but everyone uses it.",
    "The library returns a status and never prints anything.",
    "Open the window, it is getting warm in here.",
    "Twelve plus thirty is forty two.",
    "Der schnelle braune Fuchs springt ueber den faulen Hund.",
    "Le petit chat dort sur le canape pres de la fenetre.",
    "El tren sale de la estacion a las ocho de la noche.",
    "Il pleut depuis trois jours sur la ville.",
]
EVAL_SENTENCES = [
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "The museum opens its new wing to visitors next Tuesday.",
    "Could you repeat the last part of the question, please?",
    "Four hundred and sixty seven people signed the letter.",
    "The calibration set and the evaluation set never share a sentence.",
    "A gentle breeze moved the curtains back and forth.",
    "My grandmother kept every letter she ever received.",
    "Bring an umbrella, the forecast says it will pour tonight.",
    "The engine stalled twice before we reached the top of the pass.",
    "Voice activity detection decides, frame by frame, whether someone is talking.",
    "Heute Abend gehen wir zusammen ins Kino.",
    "Nous avons visite le vieux port avant le dejeuner.",
    "La biblioteca cierra a las seis los domingos.",
    "Ich habe meinen Schluessel im Buero vergessen.",
    "Les enfants jouent dans le jardin apres l'ecole.",
    "Mi hermano vive cerca del mar desde hace diez anos.",
]
VOICES = ["en", "en-us", "en+m3", "en+f2", "en+f4", "en-us+m7", "en+klatt", "de", "fr", "es",
          "en-gb-scotland", "en+croak"]
NOISES = [None, "whitenoise", "pinknoise", "brownnoise"]


def espeak(text, voice, speed, pitch, work):
    """The utterance at 16 kHz (espeak-ng writes 22050 Hz; sox resamples)."""
    wav, raw = os.path.join(work, "u.wav"), os.path.join(work, "u.raw")
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", wav, text],
                   check=True, capture_output=True)
    subprocess.run(["sox", "-R", "-D", wav, "-r", str(SR), "-c", "1", "-b", "16", "-e", "signed-integer", "-t", "raw", raw],
                   check=True, capture_output=True)
    x = np.fromfile(raw, dtype="<i2").astype(np.float32) / 32768.0
    # espeak-ng pads with silence: trim to the voiced part (a little margin kept)
    e = np.abs(x) > 1e-3
    if not e.any():
        return x[:0]
    i0, i1 = max(int(np.argmax(e)) - 160, 0), min(len(x) - int(np.argmax(e[::-1])) + 160, len(x))
    return x[i0:i1]


def noise(kind, n, seed, work):
    raw = os.path.join(work, "n.raw")
    dur = "%.4f" % (n / SR + 0.01)
    subprocess.run(["sox", "-R", "-n", "-r", str(SR), "-c", "1", "-b", "16", "-e", "signed-integer",
                    "-t", "raw", raw, "synth", dur, kind, "vol", "0.5"],
                   check=True, capture_output=True, env=dict(os.environ, SOX_OPTS="--no-dither"))
    x = np.fromfile(raw, dtype="<i2").astype(np.float32)[:n] / 32768.0
    if len(x) < n:
        x = np.pad(x, (0, n - len(x)))
    # sox -R: the same noise every run; a seeded rotation gives each clip its own stretch
    r = np.random.default_rng(seed)
    return np.roll(x, int(r.integers(0, max(n, 1))))


def frame_labels(clean, start, total_frames, lab):
    """Marks the frames of one clean utterance placed at sample `start` (see module doc)."""
    nf = len(clean) // FRAME + 1
    off = start % FRAME
    # energy per frame of the stream grid: place the utterance on the grid first
    grid = np.zeros((nf + 1) * FRAME, np.float32)
    grid[off:off + len(clean)] = clean
    e = (grid.reshape(-1, FRAME) ** 2).mean(1)
    db = 10 * np.log10(e + 1e-20)
    on = db > db.max() - 35.0
    idx = np.flatnonzero(on)
    if len(idx):
        gap = int(round(0.2 * SR / FRAME))
        for a, b in zip(idx[:-1], idx[1:]):
            if b - a <= gap:
                on[a:b] = True
    f0 = start // FRAME
    for i, v in enumerate(on):
        if v and f0 + i < total_frames:
            lab[f0 + i] = 1


def make_set(seconds, sentences, seed, work):
    rng = random.Random(seed)
    audio, clips = [], []
    total = 0
    utt_pos = []   # (start sample, clean utterance scaled)
    while total < seconds * SR:
        clip_len_target = rng.uniform(12.0, 30.0) * SR
        parts, pos = [], 0
        speech = []
        g = int(rng.uniform(0.3, 2.5) * SR)
        parts.append(np.zeros(g, np.float32))
        pos += g
        info = {"utterances": []}
        while pos < clip_len_target:
            text = rng.choice(sentences)
            voice = rng.choice(VOICES)
            speed = rng.randint(120, 230)
            pitch = rng.randint(25, 75)
            u = espeak(text, voice, speed, pitch, work)
            if len(u) == 0:
                continue
            gain_db = rng.uniform(-24.0, 0.0)
            u = u / max(float(np.abs(u).max()), 1e-6) * 0.7 * 10 ** (gain_db / 20)
            speech.append((pos, u))
            parts.append(u)
            pos += len(u)
            info["utterances"].append({"text": text, "voice": voice, "speed": speed, "pitch": pitch,
                                       "gain_db": round(gain_db, 2)})
            g = int(rng.uniform(0.2, 3.0) * SR)
            parts.append(np.zeros(g, np.float32))
            pos += g
        clean = np.concatenate(parts)
        kind = rng.choice(NOISES)
        snr = rng.uniform(0.0, 20.0)
        x = clean.copy()
        if kind:
            nz = noise(kind, len(x), rng.randrange(1 << 30), work)
            sp = np.concatenate([u for _, u in speech])
            p_s = float((sp ** 2).mean())
            p_n = float((nz ** 2).mean()) + 1e-20
            nz *= np.sqrt(p_s / (p_n * 10 ** (snr / 10)))
            x += nz
        peak = float(np.abs(x).max())
        if peak > 0.99:
            x *= 0.99 / peak
            speech = [(s, u * 0.99 / peak) for s, u in speech]
        for s, u in speech:
            utt_pos.append((total + s, u))
        info.update({"start": total, "samples": len(x), "noise": kind or "none",
                     "snr_db": round(snr, 2) if kind else None})
        clips.append(info)
        audio.append(x.astype(np.float32))
        total += len(x)
    x = np.concatenate(audio)
    n_frames = len(x) // FRAME
    x = x[:n_frames * FRAME]
    lab = np.zeros(n_frames, np.uint8)
    for s, u in utt_pos:
        frame_labels(u, s, n_frames, lab)
    return x, lab, clips


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--calib-seconds", type=float, default=180.0)
    ap.add_argument("--eval-seconds", type=float, default=600.0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    meta = {"seed": a.seed, "sample_rate": SR, "frame": FRAME}
    with tempfile.TemporaryDirectory(prefix="qcal-speech-") as work:
        for name, secs, sents, seed in [("calib", a.calib_seconds, CALIB_SENTENCES, a.seed),
                                        ("eval", a.eval_seconds, EVAL_SENTENCES, a.seed + 1000003)]:
            if secs <= 0:
                continue
            x, lab, clips = make_set(secs, sents, seed, work)
            np.save(os.path.join(a.out, name + ".npy"), x)
            np.save(os.path.join(a.out, name + "_labels.npy"), lab)
            meta[name] = {"seconds": len(x) / SR, "frames": int(len(lab)),
                          "speech_frames": int(lab.sum()), "clips": clips}
            print("%s: %.1f s, %d frames, %.1f%% speech, %d clips" % (
                name, len(x) / SR, len(lab), 100.0 * lab.mean(), len(clips)))
    with open(os.path.join(a.out, "speech.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
