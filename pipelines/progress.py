"""Progress of long work, in one style for every command.

On a terminal: a tqdm bar on stderr. When stderr is piped to a file or another program: one line when a stage
starts and one when it ends, no carriage-return redraws (a log stays readable and small). ``enabled=False``
(``--quiet``) prints nothing.
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

    Accepts tqdm's calls (``update``, ``set_postfix``, ``set_description``, ``close``, use as a context)."""

    def __init__(self, total: float | None, desc: str, unit: str, stream: TextIO) -> None:
        self.total, self.desc, self.unit, self.stream, self.n = total, desc, unit, stream, 0.0
        self._start, self._closed = time.perf_counter(), False
        total_text = f" ({total:g} {unit})" if total else ""
        print(f"{desc}{total_text} ...", file=stream, flush=True)

    def update(self, n: float = 1) -> None:
        self.n += n

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

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
        self.n, self._closed = 0.0, True

    def close(self) -> None:
        pass


def progress_bar(total: float | None, desc: str, unit: str = "it", enabled: bool = True,
                 stream: TextIO | None = None) -> Any:
    """A tqdm bar on a terminal, :class:`StageLines` when piped, nothing when not ``enabled``."""
    stream = sys.stderr if stream is None else stream
    if not enabled:
        return _Silent()
    if interactive(stream):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=stream)
    return StageLines(total, desc, unit, stream)
