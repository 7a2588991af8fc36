"""Functions the all-pairs tests hand to workers (module-level, so workers import them)."""

from __future__ import annotations

import math

import numpy as np
from scipy.spatial.distance import cdist


def euclidean(a, b):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))


def cosine(a, b):
    dot = float(np.dot(a, b))
    return 1.0 - dot / (math.sqrt(float(np.dot(a, a))) * math.sqrt(float(np.dot(b, b))))


def cityblock(a, b):
    return float(np.abs(a - b).sum())


PER_PAIR = {"euclidean": euclidean, "cosine": cosine, "cityblock": cityblock}


def block_euclidean(rows, cols):
    return cdist(np.asarray(rows), np.asarray(cols), "euclidean")


def block_cosine(rows, cols):
    r, c = np.asarray(rows), np.asarray(cols)
    r = r / np.linalg.norm(r, axis=1, keepdims=True)
    c = c / np.linalg.norm(c, axis=1, keepdims=True)
    return 1.0 - r @ c.T


def block_cityblock(rows, cols):
    r, c = np.asarray(rows), np.asarray(cols)
    return np.abs(r[:, None, :] - c[None, :, :]).sum(axis=2)


BLOCK = {"euclidean": block_euclidean, "cosine": block_cosine, "cityblock": block_cityblock}


def levenshtein(s, t):
    """Two-row dynamic programme (the implementation under test's compare)."""
    prev = list(range(len(t) + 1))
    for i, a in enumerate(s, 1):
        cur = [i]
        for j, b in enumerate(t, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a != b)))
        prev = cur
    return prev[-1]


def load_npy(path):
    return np.load(path)


def fails_on_3_5(a, b):
    if {a, b} == {3, 5}:
        raise ZeroDivisionError("boom")
    return float(a - b)


def load_or_fail(key):
    if key == "bad-key":
        raise FileNotFoundError(f"no such item {key}")
    return len(key)


def returns_string(a, b):
    return "x" if (a, b) == (1, 2) else 1.0


def returns_none(a, b):
    return None


def block_wrong_shape(rows, cols):
    return np.zeros((len(rows), len(cols) + 1))


def block_strings(rows, cols):
    return np.full((len(rows), len(cols)), "a")


def absdiff(a, b):
    return float(abs(a - b))


def similarity(a, b):
    return -abs(a - b) / 7.0


def block_complex(rows, cols):
    """cdist plus an imaginary part: not a real-valued block (must be refused, not truncated)."""
    return cdist(np.asarray(rows), np.asarray(cols)) + 1j


def block_objects(rows, cols):
    return np.full((len(rows), len(cols)), None, dtype=object)


def block_len_sum(rows, cols):
    return np.array([[float(len(a) + len(b)) for b in cols] for a in rows])


def gated_euclidean(gate, log, a, b):
    """euclidean of items ``(index, vector)``; a pair with an index >= 8 first waits until
    ``gate`` exists; one byte appended to ``log`` per call after the gate (counts them)."""
    import os
    import time

    if max(a[0], b[0]) < 8:
        return euclidean(a[1], b[1])
    while not os.path.exists(gate):
        time.sleep(0.005)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)
    return euclidean(a[1], b[1])


_thief_pairs = 0  # pairs this process computed as a thief (a worker other than the root's)


def killable_compare(folder, a, b):
    """``a * 1000 + b``, and a scripted fault.  The root task's worker, at its first pair
    (0, 0), notes its pid in ``root`` and waits (bounded) until a thief exists, so the
    other worker steals the far end of the matrix.  That thief, once it has computed 100
    pairs (at least one whole leaf tile: a leaf has at most 64), claims ``thief`` (its
    pid) and waits to be SIGKILLed; the test kills it and the stolen subtree runs again
    elsewhere.  Only the first thief waits: a re-run computes straight through."""
    import os
    import time

    global _thief_pairs
    me = os.getpid()
    root, thief = os.path.join(folder, "root"), os.path.join(folder, "thief")
    if (a, b) == (0, 0) and not os.path.exists(root):
        with open(root + ".tmp", "w") as f:
            f.write(str(me))
        os.rename(root + ".tmp", root)
        deadline = time.monotonic() + 60
        while not os.path.exists(thief) and time.monotonic() < deadline:
            time.sleep(0.005)
    elif os.path.exists(root) and not os.path.exists(thief):
        with open(root) as f:
            if int(f.read()) != me:
                _thief_pairs += 1
        if _thief_pairs > 100:
            try:
                fd = os.open(thief, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(me).encode())
                os.close(fd)
                time.sleep(120)  # until the test kills this process
    return a * 1000 + b
