"""Where and how dask computes: the scheduler a command runs on, and computing with progress.

``smoe data prepare`` and out-of-core ``smoe postprocess`` both compute through here, so they run on the same
schedulers and show progress the same way (:mod:`pipelines.progress`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

import dask

PROGRESS_INTERVAL_S = 0.1


@contextlib.contextmanager
def dask_client(scheduler: str | None) -> Iterator[Any]:
    """Where dask runs: ``None`` → a local in-process ``distributed`` cluster; ``"threads"`` /
    ``"synchronous"`` → dask's local scheduler (no cluster); anything else → address of an existing
    ``dask.distributed`` scheduler (e.g. ``tcp://host:8786``)."""
    if scheduler in ("threads", "synchronous"):
        with dask.config.set(scheduler=scheduler):
            yield None
        return
    from distributed import Client, LocalCluster

    if scheduler is None:
        with (
            LocalCluster(
                processes=False,
                n_workers=1,
                threads_per_worker=2,
                dashboard_address=None,
                # distributed's scheduler starts an HTTP server (health/metrics routes) even without a
                # dashboard, on dashboard_address or else port 8787; when 8787 is taken (a second prepare,
                # a notebook's cluster) it warns "Port 8787 is already in use ... Hosting the HTTP server on
                # port N instead" on every run. Port 0 on the loopback: a free port, no warning, nothing
                # exposed; ``dashboard=False`` keeps the dashboard off (LocalCluster's own kwargs would
                # turn it on for any address).
                scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client
    else:
        with Client(scheduler) as client:
            yield client


def compute(obj: Any, client: Any, progress: bool, label: str) -> Any:
    """Compute a dask collection, or a list of them (computed together: shared reads), on ``client`` when
    given, showing progress in the one style of :mod:`pipelines.progress`.

    What holds no dask collection is returned as it is, on every scheduler: e.g. the all-NaN statistics of
    a single time step are built eagerly, and ``Client.compute`` of such a Dataset returns the Dataset
    itself, not a future.
    """
    items = obj if isinstance(obj, list) else [obj]
    lazy = [i for i, item in enumerate(items) if dask.is_dask_collection(item)]
    values = _compute_collections([items[i] for i in lazy], client, progress, label) if lazy else []
    done = list(items)
    for i, value in zip(lazy, values):
        done[i] = value
    return done if isinstance(obj, list) else done[0]


def _compute_collections(collections: list[Any], client: Any, progress: bool, label: str) -> list[Any]:
    """The computed values of ``collections`` (every one a dask collection), in order."""
    from pipelines.progress import interactive, progress_bar

    if not progress:
        return list(dask.compute(*collections)) if client is None else client.gather(client.compute(collections))
    if not interactive():  # piped: a line at the start and one at the end, no redraws
        with progress_bar(None, label, unit="task"):
            return list(dask.compute(*collections)) if client is None else client.gather(client.compute(collections))
    print(f"{label} ...", file=sys.stderr, flush=True)
    if client is None:
        from dask.diagnostics import ProgressBar

        with ProgressBar(dt=1.0, out=sys.stderr):
            return list(dask.compute(*collections))
    futures = client.compute(collections)
    from distributed import progress as show_progress

    # distributed's text bar is fed by a coroutine that only notices the bar has closed at its next write; a
    # cluster shut down while it sleeps cancels it and logs a CancelledError traceback on a successful run.
    # Waiting a few of its refresh intervals lets it end cleanly.
    with contextlib.redirect_stdout(sys.stderr):  # bars go to stderr, as tqdm's do
        show_progress(futures, interval=f"{int(PROGRESS_INTERVAL_S * 1000)}ms")
    print(file=sys.stderr, flush=True)
    time.sleep(5 * PROGRESS_INTERVAL_S)
    return client.gather(futures)
