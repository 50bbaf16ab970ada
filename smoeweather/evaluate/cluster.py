"""Where ``smoe evaluate`` computes the scores: threads in this process (the default) or a ``dask.distributed``
cluster (``--scheduler``), with the same results bit for bit.

On a cluster every (method, field) is one task (:func:`map_on_cluster`): a worker scores it with the very code and
task graph of the threaded run, on its own threads — it reads the forecast there in the store's chunks of one or
a few initialisations, block by block (:func:`smoeweather.metrics.scores.field_terms`), so its memory is that
of a threaded evaluation of one field — and sends back the per-initialisation terms and the other scores, which
this process reduces as the threaded run does. What this process computes itself (opening the inputs, the
climatology, the truth at the valid times) stays on threads here.

Why whole fields and not the chunks of one field spread over the workers: float sums depend on memory layout
(numpy adds along the contiguous axis pairwise, along another one in sequence), and an array sent from one worker
process to another arrives contiguous whatever its strides were; the reductions over initialisations inside one
task graph (rank histogram, reliability table) then differed in the last bits. Here no array is split between
processes, and the arrays that travel keep their strides (:func:`dumps`). The BLAS thread count is the one
difference left: large matrix products (the energy score's) round differently with another count, so a worker
whose BLAS runs on another number of threads than this process's is warned about.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

LOCAL_CLUSTER = "local"
"""The ``--scheduler`` keyword of a local ``dask.distributed`` cluster (the default of ``smoe postprocess``)."""


@contextlib.contextmanager
def on_scheduler(scheduler: str | None) -> Iterator[Any]:
    """The client the scores are computed on: None for threads in this process (``scheduler`` None, ``threads``
    or ``synchronous``, as :func:`pipelines.compute.dask_client` takes them); ``"local"``: a local
    ``dask.distributed`` cluster; else the address of a scheduler (tcp://host:port), whose workers must read the
    stores at the same paths. Dask computations of this process itself stay on threads while it is open."""
    if scheduler is None:
        yield None
        return
    import dask

    from pipelines.compute import dask_client

    with dask_client(None if scheduler == LOCAL_CLUSTER else scheduler) as client:
        if client is None:
            yield None
            return
        _warn_blas_threads(client)
        with dask.config.set(scheduler="threads"):
            yield client


class Packed:
    """An object pickled by :func:`dumps` (numpy arrays keep their strides); :meth:`load` gives it back."""

    __slots__ = ("blob",)

    def __init__(self, obj: Any) -> None:
        self.blob = dumps(obj)

    def load(self) -> Any:
        """The object, its numpy arrays with the strides they had."""
        import pickle

        return pickle.loads(self.blob)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled (cloudpickle) with every strided numpy array in it kept strided: a view with gaps or axes
    in another order comes back with the same strides, not as a contiguous copy."""
    import cloudpickle

    class LayoutPickler(cloudpickle.Pickler):
        def reducer_override(self, x: Any) -> Any:
            if isinstance(x, np.ndarray) and _keeps_layout(x):
                return strided, _span(x)
            return super().reducer_override(x)

    out = io.BytesIO()
    LayoutPickler(out, protocol=5).dump(obj)
    return out.getvalue()


def _keeps_layout(x: np.ndarray) -> bool:
    """Whether ``x`` needs :func:`_span` to travel with its strides (pickle keeps C and Fortran order itself)."""
    return (type(x) is np.ndarray and x.size > 1 and not x.dtype.hasobject and not x.flags.c_contiguous
            and not x.flags.f_contiguous and all(s >= 0 and s % x.itemsize == 0 for s in x.strides))


def _span(x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]:
    """(a buffer holding ``x`` at its strides, shape, strides)."""
    n = 1 + sum((d - 1) * s for d, s in zip(x.shape, x.strides)) // x.itemsize
    buf = np.empty(n, x.dtype)
    np.lib.stride_tricks.as_strided(buf, x.shape, x.strides)[...] = x
    return buf, x.shape, x.strides


def strided(buf: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """The array of :func:`_span`: ``buf`` seen at ``shape`` and ``strides``."""
    return np.lib.stride_tricks.as_strided(buf, shape, strides)


def _run(fn: Callable[..., Any], *args: Any) -> Packed:
    """On a worker: ``fn(*args)`` (:class:`Packed` arguments unpacked) with dask's threaded scheduler on the
    worker's threads, packed."""
    import dask
    from distributed import get_worker

    values = [a.load() if isinstance(a, Packed) else a for a in args]
    with dask.config.set(scheduler="threads", num_workers=get_worker().state.nthreads):
        return Packed(fn(*values))


def map_on_cluster(client: Any, fn: Callable[..., Any], jobs: Sequence[Sequence[Any]],
                   done: Callable[[], None] | None = None) -> list[Any]:
    """``[fn(*job) for job in jobs]``, each one task on the cluster of ``client`` run by :func:`_run`, results in
    the order of ``jobs``; ``done`` is called as each finishes (a progress bar). An argument that is the same
    object in several jobs (by identity) is packed and sent to the cluster once."""
    from distributed import as_completed

    sent: dict[int, Any] = {}

    def put(a: Any) -> Any:
        if isinstance(a, str | bool | int | float | tuple | type(None)) or np.isscalar(a):
            return a
        if id(a) not in sent:
            sent[id(a)] = client.scatter(Packed(a), hash=False)
        return sent[id(a)]

    futures = [client.submit(_run, fn, *map(put, job), pure=False) for job in jobs]
    for _ in as_completed(futures):
        if done is not None:
            done()
    return [p.load() for p in client.gather(futures)]


def blas_threads() -> int | None:
    """The thread count of numpy's BLAS in this process (None where threadpoolctl cannot tell)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    counts = [int(i["num_threads"]) for i in threadpool_info() if i.get("user_api") == "blas"]
    return max(counts) if counts else None


def _warn_blas_threads(client: Any) -> None:
    """Warn when a worker's BLAS runs on another number of threads than this process's."""
    here = blas_threads()
    there = {n for n in client.run(blas_threads).values() if n is not None}
    if here is not None and there - {here}:
        warnings.warn(f"the workers' BLAS runs on {sorted(there)} thread(s), this process's on {here}: large matrix "
                      "products (the energy score) may differ from a threaded run in the last bits; start the "
                      f"workers with OPENBLAS_NUM_THREADS={here} (OMP_NUM_THREADS, MKL_NUM_THREADS) for the same "
                      "bits", stacklevel=4)


__all__ = ["LOCAL_CLUSTER", "Packed", "blas_threads", "dumps", "map_on_cluster", "on_scheduler", "strided"]
