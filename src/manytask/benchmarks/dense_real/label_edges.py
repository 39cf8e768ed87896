"""Edge ground truth from a label map, as the PASCAL-Context multi-task references derive it: the pixels where a
4-neighbour Laplacian of the class-id map is non-zero (OpenCV's `Laplacian(..., ksize=1)` with its default
reflect-101 border), thinned to one-pixel-wide lines by the Guo-Hall two-subiteration algorithm (scikit-image's
`morphology.thin`). Written with numpy alone so neither OpenCV nor scikit-image is needed.

Guo & Hall, "Parallel thinning with two-subiteration algorithms", Comm. ACM 32(3), 1989.
"""

from __future__ import annotations

import numpy as np

# Bit k of a neighbourhood code is neighbour x_{k+1} of the paper, counter-clockwise from the east:
# E, NE, N, NW, W, SW, S, SE, as (row, column) offsets.
NEIGHBOURS = ((0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1), (1, 0), (1, 1))


def laplacian_nonzero(labels: np.ndarray) -> np.ndarray:
    """Where 4·label differs from the sum of the 4 neighbours (borders mirrored without repeating the edge pixel)."""
    padded = np.pad(labels.astype(np.float64), 1, mode="reflect")
    centre = padded[1:-1, 1:-1]
    neighbours = padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]
    return neighbours - 4.0 * centre != 0


def _deletable(first: bool) -> np.ndarray:
    """Lookup table over the 256 neighbourhood codes: whether a foreground pixel is removed in the first (or
    second) subiteration — conditions G1 (one 8-connected component is touched), G2 (2 ≤ min(n1, n2) ≤ 3, so
    end points survive) and G3 (first) or G3' (second)."""
    table = np.zeros(256, dtype=bool)
    for code in range(256):
        x = [bool(code >> k & 1) for k in range(8)]
        crossings = sum(not x[i] and (x[i + 1] or x[(i + 2) % 8]) for i in (0, 2, 4, 6))
        n1 = sum(x[k] or x[k - 1] for k in (1, 3, 5, 7))
        n2 = sum(x[k] or x[(k + 1) % 8] for k in (1, 3, 5, 7))
        g3 = (x[1] or x[2] or not x[7]) and x[0] if first else (x[5] or x[6] or not x[3]) and x[4]
        table[code] = crossings == 1 and 2 <= min(n1, n2) <= 3 and not g3
    return table


_TABLES = (_deletable(first=True), _deletable(first=False))


def _codes(image: np.ndarray) -> np.ndarray:
    """Each pixel's neighbourhood code; pixels outside the image count as background."""
    padded = np.pad(image, 1)
    rows, cols = image.shape
    code = np.zeros(image.shape, dtype=np.int64)
    for bit, (dr, dc) in enumerate(NEIGHBOURS):
        code |= padded[1 + dr:1 + dr + rows, 1 + dc:1 + dc + cols].astype(np.int64) << bit
    return code


def thin(mask: np.ndarray) -> np.ndarray:
    """Guo-Hall thinning of a binary image, repeated until an iteration removes nothing."""
    skeleton = np.asarray(mask, dtype=bool).copy()
    while True:
        before = int(skeleton.sum())
        for table in _TABLES:
            skeleton[table[_codes(skeleton)]] = False
        if int(skeleton.sum()) == before:
            return skeleton


def label_edges(labels: np.ndarray) -> np.ndarray:
    """Thin boolean edges between differently labelled regions of a (H, W) label map."""
    return thin(laplacian_nonzero(labels))
