"""Token counts of video/image samples after the VAE and patchify."""

from __future__ import annotations

import numpy as np


def wan_seq_len(frames, height, width, *, vae_stride=(4, 8, 8), patch_size=(1, 2, 2)):
    """Sequence length S of Wan 2.1 samples, vectorized over numpy arrays.

    S = ((F - 1) // vt + 1) // pt  *  (H // vh // ph)  *  (W // vw // pw)

    with VAE stride (vt, vh, vw) = (4, 8, 8) and patch (pt, ph, pw) = (1, 2, 2) by default:
    a 480x832 image is 1,560 tokens, a 480x832 81-frame video 32,760, a 720x1280
    81-frame video 75,600. Returns an int64 array (a Python int for scalar inputs).
    """
    f = np.asarray(frames)
    h = np.asarray(height)
    w = np.asarray(width)
    for name, a in (("frames", f), ("height", h), ("width", w)):
        if a.dtype.kind not in "iu":
            if a.dtype.kind != "f" or not np.all(np.isfinite(a)) or np.any(a != np.floor(a)):
                raise ValueError(f"wan_seq_len: {name} must hold integers, got dtype {a.dtype}")
        if np.any(a < 1):
            bad = np.flatnonzero(np.atleast_1d(a) < 1)[0]
            raise ValueError(f"wan_seq_len: {name}[{bad}] = {np.atleast_1d(a)[bad]} must be >= 1")
    vt, vh, vw = vae_stride
    pt, ph, pw = patch_size
    f, h, w = (a.astype(np.int64) for a in (f, h, w))
    seq = ((f - 1) // vt + 1) // pt * (h // vh // ph) * (w // vw // pw)
    if np.any(seq < 1):
        bad = np.flatnonzero(np.atleast_1d(seq) < 1)[0]
        raise ValueError(
            f"wan_seq_len: sample {bad} ({np.atleast_1d(f)[bad]}x{np.atleast_1d(h)[bad]}x"
            f"{np.atleast_1d(w)[bad]}) is smaller than one patch"
        )
    return int(seq) if seq.ndim == 0 else seq
