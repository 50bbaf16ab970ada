"""Image classification data: CIFAR-10/100 python-pickle batches, MNIST IDX files, and scikit-learn's
8×8 digits as the offline default (1,797 real handwritten digits shipped inside the package).

:func:`load_images` returns an :class:`ImageSplits` of float32 images (N, C, H, W) scaled to [0, 1] and
int64 labels per split; :func:`standardise` adds per-channel statistics of the training split.
"""

from __future__ import annotations

import gzip
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

DATASETS = ("digits", "cifar10", "cifar100", "mnist")
IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass
class ImageSplits:
    """Images (N, C, H, W) float32 in [0, 1] and labels (N,) int64 for train / valid / test."""

    images: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]
    classes: list[str]
    source: str

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        return tuple(self.images["train"].shape[1:])  # type: ignore[return-value]


class ImageDataset(Dataset):
    """(image (C, H, W) float32 standardised, label int64) pairs."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, mean: np.ndarray, std: np.ndarray) -> None:
        x = (images - mean[None, :, None, None]) / std[None, :, None, None]
        self.images = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        self.labels = torch.from_numpy(labels.astype(np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (MNIST format, optionally gzipped): magic 0x0000TTDD, D big-endian int32 dims."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    dims = np.frombuffer(raw, ">i4", count=ndim, offset=4)
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    expected = 4 + 4 * ndim + int(np.prod(dims)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"{path}: IDX header says {tuple(dims)} ({expected} bytes), file has {len(raw)} bytes")
    return np.frombuffer(raw, dtype, offset=4 + 4 * ndim).reshape(tuple(int(d) for d in dims))


def _find(root: Path, names: list[str]) -> Path:
    for name in names:
        for candidate in (root / name, root / f"{name}.gz"):
            if candidate.exists():
                return candidate
    raise FileNotFoundError(f"none of {names} (optionally .gz) found in {root}")


def read_mnist(root: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """MNIST IDX files in ``root`` → {"train": (images (N, 1, 28, 28) uint8, labels), "test": ...}."""
    root = Path(root)
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = read_idx(_find(root, [f"{prefix}-images-idx3-ubyte", f"{prefix}-images.idx3-ubyte"]))
        y = read_idx(_find(root, [f"{prefix}-labels-idx1-ubyte", f"{prefix}-labels.idx1-ubyte"]))
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"MNIST {split} files in {root}: images {x.shape} and labels {y.shape} do not match")
        out[split] = (x[:, None], y.astype(np.int64))
    return out


# What a CIFAR python batch may ask the unpickler for: numpy's array and scalar reconstruction (under numpy 1's and
# numpy 2's module names) and the bytes of a protocol-2 pickle written by Python 3 (_codecs.encode). A batch is data
# from elsewhere: anything else (os.system, eval, ...) is refused, never run.
CIFAR_PICKLE_GLOBALS = {("_codecs", "encode"),
                        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
                        ("numpy", "ndarray"), ("numpy", "dtype")}


class _DataOnlyUnpickler(pickle.Unpickler):
    """An unpickler that rebuilds plain containers and numpy arrays only (:data:`CIFAR_PICKLE_GLOBALS`)."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in CIFAR_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"asks for {module}.{name}, which a data batch never needs")
        import importlib

        return getattr(importlib.import_module(module.replace("numpy.core.", "numpy._core.")), name)


def _unpickle(path: Path) -> dict:
    """A CIFAR python batch (a pickled dict of arrays, lists and bytes), read as data: a pickle that asks for any
    other callable is refused with ValueError naming the file, before anything in it runs."""
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR batch {path} does not exist")
    with open(path, "rb") as f:
        try:
            batch = _DataOnlyUnpickler(f, encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as err:
            raise ValueError(f"{path} is not a CIFAR batch of plain data ({err}); refused without running it. "
                             "Use the batches of the CIFAR python version as published") from None
    if not isinstance(batch, dict):
        raise ValueError(f"{path} is not a CIFAR batch: expected a pickled dict, got {type(batch).__name__}")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in batch.items()}


def read_cifar(root: str | Path, classes: int = 10) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """CIFAR-10 (``data_batch_1..5``, ``test_batch``) or CIFAR-100 (``train``, ``test``, fine labels)
    python-pickle batches in ``root`` → {"train": (images (N, 3, 32, 32) uint8, labels), "test": ...}."""
    root = Path(root)
    files = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]} if classes == 10 else \
        {"train": ["train"], "test": ["test"]}
    key = "labels" if classes == 10 else "fine_labels"
    out = {}
    for split, names in files.items():
        xs, ys = [], []
        for name in names:
            batch = _unpickle(root / name)
            if "data" not in batch or key not in batch:
                raise ValueError(f"{root / name} is not a CIFAR-{classes} batch (needs 'data' and {key!r})")
            data = np.asarray(batch["data"], dtype=np.uint8)
            if data.ndim != 2 or data.shape[1] != 3072:
                raise ValueError(f"{root / name}: 'data' must be (N, 3072) uint8, got {data.shape}")
            xs.append(data.reshape(-1, 3, 32, 32))
            ys.append(np.asarray(batch[key], dtype=np.int64))
        out[split] = (np.concatenate(xs), np.concatenate(ys))
    return out


def _digits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images[:, None] / 16.0 * 255.0).round().astype(np.uint8)  # 0..16 → 0..255, (N, 1, 8, 8)
    return {"all": (x, d.target.astype(np.int64))}


def _stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (rest, held out) with ``fraction`` of every class held out, seeded."""
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        held.append(idx[: int(round(fraction * len(idx)))])
    held_idx = np.sort(np.concatenate(held))
    return np.setdiff1d(np.arange(len(labels)), held_idx), held_idx


def load_images(dataset: str = "digits", path: str | Path | None = None, valid_fraction: float = 0.1,
                test_fraction: float = 0.2, seed: int = 0, max_train: int | None = None) -> ImageSplits:
    """Load ``dataset`` (:data:`DATASETS`) into seeded stratified train/valid/test splits.

    CIFAR/MNIST keep their official test split and hold ``valid_fraction`` of the training set out for
    validation; digits (no official split) holds out ``test_fraction`` for test, then ``valid_fraction``.
    ``max_train`` keeps a seeded stratified subset of the training split.
    """
    if dataset not in DATASETS:
        raise ValueError(f"data.dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")
    if dataset != "digits" and path is None:
        raise ValueError(f"data.dataset {dataset!r} needs data.path (directory with the original files)")
    if dataset == "digits":
        x, y = _digits()["all"]
        rest, test = _stratified_split(y, test_fraction, seed)
        raw = {"train": (x[rest], y[rest]), "test": (x[test], y[test])}
        classes, source = [str(i) for i in range(10)], "sklearn.datasets.load_digits (8x8, 1797 images)"
    elif dataset == "mnist":
        raw, classes, source = read_mnist(path), [str(i) for i in range(10)], f"MNIST IDX files in {path}"
    else:
        n = 10 if dataset == "cifar10" else 100
        raw, source = read_cifar(path, n), f"CIFAR-{n} batches in {path}"
        classes = [str(i) for i in range(n)]
        meta = Path(path) / ("batches.meta" if n == 10 else "meta")
        if meta.exists():
            names = _unpickle(meta).get("label_names" if n == 10 else "fine_label_names")
            if names is not None:
                classes = [c.decode() if isinstance(c, bytes) else str(c) for c in names]
    x, y = raw["train"]
    train, valid = _stratified_split(y, valid_fraction, seed + 1)
    if max_train is not None and max_train < len(train):
        keep, _ = _stratified_split(y[train], 1.0 - max_train / len(train), seed + 2)
        train = train[keep]
    images = {"train": x[train], "valid": x[valid], "test": raw["test"][0]}
    labels = {"train": y[train], "valid": y[valid], "test": raw["test"][1]}
    return ImageSplits({k: v.astype(np.float32) / 255.0 for k, v in images.items()}, labels, classes, source)


def standardise(splits: ImageSplits) -> tuple[dict[str, ImageDataset], np.ndarray, np.ndarray]:
    """Datasets per split standardised with the per-channel mean/std of the training images."""
    x = splits.images["train"]
    mean = x.mean(axis=(0, 2, 3))
    std = x.std(axis=(0, 2, 3)).clip(1e-6)
    return ({k: ImageDataset(splits.images[k], splits.labels[k], mean, std) for k in splits.images}, mean, std)


def shuffled_pixels(images: np.ndarray, seed: int = 0) -> np.ndarray:
    """Out-of-distribution control: every image's pixels randomly permuted (same intensities, no shape)."""
    rng = np.random.default_rng(seed)
    n, c, h, w = images.shape
    flat = images.reshape(n, c, h * w).copy()
    for i in range(n):
        flat[i] = flat[i][:, rng.permutation(h * w)]
    return flat.reshape(n, c, h, w)
