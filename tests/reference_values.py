"""Recorded results, checked bit for bit only where they were recorded and within rounding everywhere else.

The last bits of a float computation depend on the machine: the CPU's vector units (torch picks AVX-512, AVX2 or
default kernels at run time, oneDNN and MKL choose their own), the BLAS build and its kernel, and the thread count
that splits each reduction. A test that asserts recorded bits on another machine fails on a correct install. So a
recording holds two things:

- ``digests``: sha256 of the exact bytes, compared only when :func:`fingerprint` equals the recording's;
- ``reference``: a few statistics of every array (:func:`summarize`), compared on every machine within a
  tolerance derived from the dtype (:func:`assert_close_to_reference`).

The statistics are linear in the values or 1-Lipschitz in them (L2 norm, min, max, projections on unit vectors),
so one bound on the relative perturbation ``||x - x_ref||_2 <= rel * ||x_ref||_2`` bounds each of them, and a
single ``rel`` per dtype covers every statistic. A bug (a changed formula, a lost term, another seed) moves them
by far more than rounding does.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

# The environment switches that change which kernels run (and so the last bits).
KERNEL_SWITCHES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR",
                   "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
N_PROJECTIONS = 8  # fixed random unit directions per array: a change anywhere in the values moves some of them


def _cpu() -> tuple[str, str]:
    """CPU model name and a digest of its feature flags (``unreadable`` where /proc/cpuinfo is absent)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return platform.processor() or "unknown", "unreadable"
    text = cpuinfo.read_text(errors="replace")
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.M)
    flag_digest = hashlib.sha256(" ".join(sorted(flags.group(1).split())).encode()).hexdigest()[:16] \
        if flags else "unreadable"
    return (model.group(1).strip() if model else platform.processor() or "unknown"), flag_digest


def _torch_kernels() -> dict[str, str]:
    """torch's version, the CPU capability its kernels run at, and the oneDNN/MKL builds it carries."""
    import torch

    config = torch.__config__.show()
    found = {name: re.search(pattern, config) for name, pattern in
             {"onednn": r"MKL-DNN (v[\d.]+)", "mkl": r"Math Kernel Library Version ([\w.-]+)"}.items()}
    return {"torch": torch.__version__, "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": str(torch.get_num_threads()),
            **{k: m.group(1) if m else "none" for k, m in found.items()}}


def _blas() -> str:
    """numpy's and scipy's BLAS libraries with the kernel (architecture) each runs."""
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS so that threadpoolctl lists it)
    from threadpoolctl import threadpool_info

    libs = sorted(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} threads {i.get('num_threads')}"
                  for i in threadpool_info() if i.get("user_api") == "blas")
    return "; ".join(libs) or "none"


def fingerprint() -> dict[str, str]:
    """What decides the last bits here: CPU model and flags, torch's kernels, the BLAS kernels, the switches."""
    model, flags = _cpu()
    return {"machine": platform.machine(), "cpu": model, "cpu_flags": flags, **_torch_kernels(),
            "numpy": np.__version__, "blas": _blas(),
            **{k: os.environ.get(k, "") for k in KERNEL_SWITCHES}}


def is_recording_machine(recorded: Mapping[str, str]) -> bool:
    """True where this machine's fingerprint is the recorded one (and the CPU flags could be read at all)."""
    here = fingerprint()
    return here.get("cpu_flags") != "unreadable" and dict(recorded) == here


def digest(arrays: Sequence[np.ndarray]) -> str:
    """sha256 (16 hex) of the bytes of ``arrays`` in order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _flat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]) if arrays else np.zeros(0)


def summarize(arrays: Sequence[np.ndarray]) -> dict[str, float | int | list[float]]:
    """Statistics of the finite values of ``arrays`` taken as one vector x (float64): the count of values and of
    NaNs, sum, L2 norm, min, max and the projections on :data:`N_PROJECTIONS` seeded random unit vectors."""
    x = _flat(arrays)
    finite = np.isfinite(x)
    v = np.where(finite, x, 0.0)
    directions = np.random.default_rng(0).normal(size=(N_PROJECTIONS, v.size))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True) if v.size else 1.0
    return {"count": int(x.size), "nonfinite": int((~finite).sum()), "sum": float(v.sum()),
            "norm": float(np.linalg.norm(v)), "min": float(v.min(initial=np.inf)), "max": float(v.max(initial=-np.inf)),
            "projections": [float(p) for p in directions @ v]}


def assert_close_to_reference(got: Mapping, reference: Mapping, rel: float, what: str) -> None:
    """Every statistic of ``got`` (:func:`summarize`) within what a perturbation ``||dx||_2 <= rel * ||x||_2``
    allows: ``rel * ||x||`` for the norm, min, max and each projection, ``rel * ||x|| * sqrt(n)`` for the sum
    (Cauchy-Schwarz). Counts must be equal."""
    assert (got["count"], got["nonfinite"]) == (reference["count"], reference["nonfinite"]), \
        f"{what}: {got['count']} values ({got['nonfinite']} not finite), recorded {reference['count']} " \
        f"({reference['nonfinite']})"
    bound = rel * max(reference["norm"], np.finfo(np.float64).tiny)
    limits = {"norm": bound, "min": bound, "max": bound, "sum": bound * np.sqrt(max(reference["count"], 1))}
    for key, limit in limits.items():
        diff = abs(got[key] - reference[key])
        assert diff <= limit, f"{what}: {key} {got[key]!r}, recorded {reference[key]!r} (|diff| {diff:.3g} > " \
                              f"{limit:.3g} = rounding allowance at rel {rel:g})"
    diffs = np.abs(np.subtract(got["projections"], reference["projections"]))
    assert diffs.max(initial=0.0) <= bound, f"{what}: a projection moved by {diffs.max():.3g} > {bound:.3g} " \
                                            f"(rounding allowance at rel {rel:g})"
