"""Progress of long work, in one style for every command.

On a terminal: a tqdm bar on stderr. When stderr is piped to a file or another program: one line when a stage
starts and one when it ends, no carriage-return redraws (a log stays readable and small); a long stage (training)
asks for ``every_percent`` and also gets one line each time it passes another such share of its total.
``enabled=False`` (``--quiet``) prints nothing.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def interactive(stream: TextIO | None = None) -> bool:
    """Whether progress goes to a terminal (bars) rather than a file or pipe (stage lines)."""
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


class StageLines:
    """The piped stand-in for a tqdm bar: ``desc ...`` at the start, ``desc: done, N unit in T s`` at close.

    With ``every_percent`` and a known ``total``, also ``desc: N/total unit (P%), T s[, postfix]`` each time the
    count passes another ``every_percent`` of the total (not at 100 %: the done line follows). Accepts tqdm's
    calls (``update``, ``set_postfix``, ``set_description``, ``close``, use as a context)."""

    def __init__(self, total: float | None, desc: str, unit: str, stream: TextIO,
                 every_percent: float | None = None) -> None:
        self.total, self.desc, self.unit, self.stream, self.n = total, desc, unit, stream, 0.0
        self._start, self._closed, self._postfix = time.perf_counter(), False, ""
        self._every = every_percent if total and every_percent and every_percent > 0 else None
        self._shown = 0  # percent lines printed so far
        total_text = f" ({total:g} {unit})" if total else ""
        print(f"{desc}{total_text} ...", file=stream, flush=True)

    def update(self, n: float = 1) -> None:
        self.n += n
        if self._every is None or self._closed:
            return
        reached = int(100.0 * self.n / self.total // self._every)  # type: ignore[operator]
        if reached > self._shown and 100.0 * self.n < 100.0 * self.total:  # type: ignore[operator]
            self._shown = reached
            seconds = time.perf_counter() - self._start
            print(f"{self.desc}: {self.n:g}/{self.total:g} {self.unit} ({100.0 * self.n / self.total:.0f}%), "
                  f"{seconds:.0f} s{self._postfix}", file=self.stream, flush=True)

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True,  # noqa: ARG002
                    **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self._postfix = "".join(f", {k} {v:.4g}" if isinstance(v, float) else f", {k} {v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:  # noqa: ARG002
        self._postfix = f", {s}" if s else ""

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:  # noqa: ARG002
        if desc:
            self.desc = desc

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            seconds = time.perf_counter() - self._start
            count = f", {self.n:g} {self.unit}" if self.n else ""
            print(f"{self.desc}: done{count} in {seconds:.1f} s", file=self.stream, flush=True)

    def __enter__(self) -> StageLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Silent(StageLines):
    def __init__(self) -> None:  # noqa: D107 - prints nothing
        self.n, self._closed, self._every, self._postfix = 0.0, True, None, ""

    def close(self) -> None:
        pass


def progress_bar(total: float | None, desc: str, unit: str = "it", enabled: bool = True,
                 stream: TextIO | None = None, every_percent: float | None = None) -> Any:
    """A tqdm bar on a terminal, :class:`StageLines` when piped (a line per ``every_percent`` of ``total`` too,
    when given), nothing when not ``enabled``."""
    stream = sys.stderr if stream is None else stream
    if not enabled:
        return _Silent()
    if interactive(stream):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=stream)
    return StageLines(total, desc, unit, stream, every_percent)
