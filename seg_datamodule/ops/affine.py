"""Pure 2x3 affine matrices in continuous pixel coordinates, and their OpenCV form.

Affine matrices are ``float64 (2, 3)`` acting on column vectors ``(x, y, 1)`` in the package's
continuous pixel coordinates (pixel k covers [k, k + 1)); :func:`compose_affine` multiplies them
like matrices, so ``compose_affine(b, a)`` applies ``a`` first. :func:`to_cv2_matrix` converts one
to the pixel-centre convention OpenCV's warps use, so pixels and polygons go through the same
matrix.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "affine_scale",
    "apply_affine",
    "compose_affine",
    "identity_affine",
    "invert_affine",
    "make_affine",
    "to_cv2_matrix",
]


# --------------------------------------------------------------------------------------------


def _check_affine(matrix: np.ndarray, name: str = "matrix") -> np.ndarray:
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (2, 3):
        raise ValueError(f"{name} must be a (2, 3) affine matrix, got shape {m.shape}")
    return m


def identity_affine() -> np.ndarray:
    """The identity as a ``float64 (2, 3)`` affine matrix."""
    return np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


def compose_affine(*matrices: np.ndarray) -> np.ndarray:
    """Product of 2x3 affine matrices, applied right to left.

    Args:
        *matrices (ndarray[2, 3] float64): ``compose_affine(c, b, a)`` maps ``p`` to ``c(b(a(p)))``.

    Returns:
        ndarray[2, 3] float64: the composed affine; the identity when none is given.

    Raises:
        ValueError: a matrix is not ``(2, 3)``.
    """
    out = identity_affine()
    for k, m in enumerate(matrices):
        m = _check_affine(m, f"matrices[{k}]")
        # [A1 t1] [A2 t2] = [A1 A2, A1 t2 + t1]
        lin = out[:, :2] @ m[:, :2]
        out = np.concatenate([lin, out[:, :2] @ m[:, 2:] + out[:, 2:]], axis=1)
    return out


def invert_affine(matrix: np.ndarray) -> np.ndarray:
    """Inverse of a 2x3 affine matrix.

    Args:
        matrix (ndarray[2, 3] float64): an invertible affine.

    Returns:
        ndarray[2, 3] float64: ``m_inv`` with ``compose_affine(m_inv, matrix)`` the identity.

    Raises:
        ValueError: ``matrix`` is not ``(2, 3)`` or is singular (its 2x2 part has determinant 0).
    """
    m = _check_affine(matrix)
    a = m[:, :2]
    det = a[0, 0] * a[1, 1] - a[0, 1] * a[1, 0]
    if det == 0.0 or not np.isfinite(det):
        raise ValueError(f"matrix is singular (determinant {det!r}), cannot invert: {m.tolist()}")
    inv = np.array([[a[1, 1], -a[0, 1]], [-a[1, 0], a[0, 0]]]) / det
    return np.hstack([inv, -(inv @ m[:, 2:])])


def affine_scale(matrix: np.ndarray) -> float:
    """The largest factor by which ``matrix`` stretches lengths (largest singular value).

    Args:
        matrix (ndarray[2, 3] float64): an affine.

    Returns:
        float: ``max ||A v|| / ||v||`` over the 2x2 part ``A``.
    """
    (a, b, _), (c, d, _) = _check_affine(matrix)
    # Closed form for 2x2: sigma_max^2 = (s + sqrt(s^2 - 4 det^2)) / 2 with s the squared norm.
    s = a * a + b * b + c * c + d * d
    det = a * d - b * c
    return float(np.sqrt(0.5 * (s + np.sqrt(max(s * s - 4.0 * det * det, 0.0)))))


def make_affine(
    center: tuple[float, float],
    output_center: tuple[float, float],
    angle: float = 0.0,
    scale: float = 1.0,
    shear: tuple[float, float] = (0.0, 0.0),
    translate: tuple[float, float] = (0.0, 0.0),
) -> np.ndarray:
    """A YOLO-style random-perspective affine (without the perspective part).

    Moves ``center`` to the origin, rotates by ``angle`` and scales by ``scale`` about it, shears,
    then moves the origin to ``output_center + translate``; the same order as Ultralytics'
    ``RandomPerspective.affine_transform`` (``T @ S @ R @ C``).

    Args:
        center (tuple[float, float]): x, y of the source point that becomes the output centre.
        output_center (tuple[float, float]): x, y where ``center`` lands before translation.
        angle (float): counter-clockwise rotation in degrees (y points down, as in images).
        scale (float): isotropic scale, > 0.
        shear (tuple[float, float]): shear angles in degrees along x and y.
        translate (tuple[float, float]): extra translation in output pixels.

    Returns:
        ndarray[2, 3] float64: source pixels -> output pixels.

    Raises:
        ValueError: ``scale`` is not positive and finite.
    """
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be positive and finite, got {scale!r}")
    c = np.array([[1.0, 0.0, -center[0]], [0.0, 1.0, -center[1]]])
    theta = np.deg2rad(angle)
    cos, sin = np.cos(theta) * scale, np.sin(theta) * scale
    # cv2.getRotationMatrix2D convention: positive angle turns the image counter-clockwise on screen.
    r = np.array([[cos, sin, 0.0], [-sin, cos, 0.0]])
    s = np.array(
        [[1.0, np.tan(np.deg2rad(shear[0])), 0.0], [np.tan(np.deg2rad(shear[1])), 1.0, 0.0]]
    )
    t = np.array(
        [
            [1.0, 0.0, output_center[0] + translate[0]],
            [0.0, 1.0, output_center[1] + translate[1]],
        ]
    )
    return compose_affine(t, s, r, c)


def to_cv2_matrix(matrix: np.ndarray) -> np.ndarray:
    """Convert an affine in continuous pixel coordinates to OpenCV's pixel-index convention.

    In this package pixel ``k`` covers ``[k, k + 1)`` (its centre is ``k + 0.5``); OpenCV's
    ``warpAffine`` maps pixel indices (centres at ``k``). The conversion is
    ``T(-0.5) @ matrix @ T(+0.5)``, so a warp with the result moves pixels exactly as
    :func:`apply_affine` with ``matrix`` moves vertices.

    Args:
        matrix (ndarray[2, 3] float64): affine in continuous pixel coordinates.

    Returns:
        ndarray[2, 3] float64: the same map in pixel-index coordinates.
    """
    m = _check_affine(matrix).copy()
    m[:, 2] += 0.5 * (m[:, 0] + m[:, 1]) - 0.5
    return m


def apply_affine(vertices: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Map vertices through an affine.

    Args:
        vertices (ndarray[V, 2] float64): x, y.
        matrix (ndarray[2, 3] float64): the affine.

    Returns:
        ndarray[V, 2] float64: ``vertices @ A.T + t``, a new array.

    Raises:
        ValueError: ``vertices`` is not ``(V, 2)`` or ``matrix`` is not ``(2, 3)``.
    """
    v = np.asarray(vertices, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != 2:
        raise ValueError(f"vertices must be (V, 2), got shape {v.shape}")
    m = _check_affine(matrix)
    return v @ m[:, :2].T + m[:, 2]
