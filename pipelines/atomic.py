"""Atomic, never-clobbering outputs: a failed, interrupted or concurrent run never leaves a file or store
that looks complete, and never replaces an existing output unless asked to.

API (every command that writes an output uses it; ``smoeweather.io`` re-exports it)::

    check_output(path, overwrite, inputs)    # before computing: one-line OutputError / OutputExistsError
    with atomic_output(path, overwrite, kind="dir") as tmp:   # kind="file": tmp is a path to create
        ...write into tmp...                 # tmp = hidden ".NAME.PID-XXXX.staging" beside path
    # committed here: renamed into place; the staging is removed on any error
    with atomic_files(folder, overwrite) as tmp:   # files ADDED to a shared folder (plots): each refused if
        ...write files into tmp...                 # it exists, all checked before any is moved in

- refuses an existing ``path`` without ``overwrite`` with :class:`OutputExistsError` (a FileExistsError)
  ``"PATH already exists (pass --overwrite to replace it)"``, on entry *and again at the commit*, under a
  kernel lock (flock) on ``.NAME.commit-lock`` beside it and with a rename that cannot replace (Linux
  ``renameat2`` ``RENAME_NOREPLACE``, else a hard link for files): of two concurrent writers exactly one wins;
- refuses an output under a file, or in a folder it cannot write to, with a one-line :class:`OutputError`
  (a ValueError) naming the path, before anything is computed; and one that is, contains or lies inside one of
  the command's ``inputs`` (:func:`check_apart`, symlinks followed), with or without ``overwrite``;
- ``--overwrite`` never loses data either: the old output is renamed aside, the new one renamed in, and only
  then is the old one deleted (:func:`replace_atomically`);
- leftovers of killed runs beside ``path`` (``.NAME.PID-XXXX.staging``, ``.NAME.PID-XXXX.old``,
  ``.NAME.PID.work``, ``.NAME.staging-PID``) whose process is dead are removed, with a one-line note on
  stderr; those without a PID (older versions' ``.NAME.XXXX.tmp``) are named in the note for the user;
- a folder the run created for the output is removed again when the run fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import json
import os
import re
import secrets
import shutil
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

try:  # POSIX: a kernel lock, released when its process dies (no stale lock after kill -9)
    import fcntl
except ImportError:  # pragma: no cover - Windows: the no-replace rename alone guards the commit
    fcntl = None  # type: ignore[assignment]

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:(?P<pid>\d+)(?:-[0-9a-f]+)?\.(?:staging|old|work)"
                       r"|staging-(?P<pid0>\d+))$")  # ours; and the postprocess staging of older versions
_LEGACY = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{8}\.(?:tmp|old)$")  # tempfile names of older versions


class OutputError(ValueError):
    """An output path that cannot be written: under a file, or in a folder without write permission."""


class OutputExistsError(FileExistsError):
    """An output exists and ``--overwrite`` was not given (also when another run created it meanwhile)."""


def _remove(path: Path) -> None:
    """Delete a file or a directory tree."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _sibling(target: Path, kind: str) -> Path:
    """A fresh, unused hidden sibling ``.NAME.PID-RANDOM.KIND`` of ``target`` (nothing is created)."""
    while True:
        path = target.parent / f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.{kind}"
        if not os.path.lexists(path):
            return path


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a process of another user counts as alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def clean_leftovers(target: str | Path) -> list[Path]:
    """Remove the staging/old/work siblings of ``target`` left by killed runs (their PID is dead) and return
    them; a one-line note on stderr names what was removed, and leftovers without a PID (older versions)."""
    target = Path(target)
    removed, named = [], []
    if not target.parent.is_dir():
        return removed
    for path in target.parent.glob(f".{_glob_escape(target.name)}.*"):
        m = _LEFTOVER.match(path.name)
        if m and m["name"] == target.name and not _pid_alive(int(m["pid"] or m["pid0"])):
            with contextlib.suppress(OSError):
                _remove(path)
                removed.append(path)
        elif (m2 := _LEGACY.match(path.name)) and m2["name"] == target.name:
            named.append(path)
    if removed:
        print(f"note: removed {len(removed)} leftover(s) of interrupted earlier runs beside {target}: "
              f"{', '.join(p.name for p in removed)}", file=sys.stderr)
    if named:
        print(f"note: {', '.join(map(str, named))}: left by an interrupted run of an older version; "
              "remove it by hand", file=sys.stderr)
    return removed


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


_UNSAFE_CHAR = re.compile(r"[^A-Za-z0-9_.-]")


def printable(text: str) -> str:
    """``text`` without control and format characters (ESC sequences, carriage returns, bidi overrides; a tab
    or newline becomes a space): safe to print to a terminal when it comes from a file."""
    return "".join(" " if c in "\t\n" else c for c in str(text)
                   if c in "\t\n" or not unicodedata.category(c).startswith("C"))


def safe_component(name: str, what: str) -> str:
    """``name`` as one file-name component: every character but ``A-Za-z0-9_.-`` becomes ``_``; ValueError
    naming ``what`` (e.g. "method name") for an empty name, ``.`` or ``..``, which would not stay one folder."""
    safe = _UNSAFE_CHAR.sub("_", str(name))
    if safe.strip(".") == "":
        raise ValueError(f"{what} {printable(repr(name))} cannot name a file or folder (empty, '.' or '..'); "
                         "choose a name of letters, digits, '_', '.' or '-'")
    return safe


def _local_inputs(inputs: Iterable[Any]) -> list[Path]:
    """The existing local paths among ``inputs`` (paths, strings, mappings' values, nested lists; None, URLs,
    in-memory objects and paths that do not exist skipped; a glob pattern stands for the files it matches)."""
    out: list[Path] = []
    for item in inputs:
        if isinstance(item, Mapping):
            out += _local_inputs(item.values())
        elif isinstance(item, list | tuple | set):
            out += _local_inputs(item)
        elif not isinstance(item, str | os.PathLike) or not str(item) or "://" in str(item):
            continue  # nothing, an in-memory object or a URL: not on this file system
        elif glob.has_magic(str(item)) and not os.path.lexists(item):
            out += [Path(p) for p in sorted(glob.glob(str(item)))]
        elif os.path.exists(item):
            out.append(Path(item))
    return out


def check_apart(target: str | Path, inputs: Iterable[Any], adds_files: bool = False) -> None:
    """Refuse (:class:`OutputError`, one line naming both) an output ``target`` that is, contains or lies inside
    one of ``inputs`` (paths resolved, symlinks followed; hard links to one file count as the same): it would
    replace or write into what the command reads, with or without ``--overwrite``. ``adds_files``: ``target`` is
    a shared folder a command adds its own named files to (plots, a run or study folder), which may hold inputs
    beside them; then only "is" and "lies inside" are refused."""
    out = Path(os.path.abspath(target)).resolve()
    for given in _local_inputs(inputs):
        src = Path(os.path.abspath(given)).resolve()
        same = out == src or (out.exists() and src.exists() and os.path.samefile(out, src))
        if same:
            how = "is the input"
        elif out in src.parents and not adds_files:
            how = "contains the input"
        elif src in out.parents:
            how = "lies inside the input"
        else:
            continue
        raise OutputError(f"output {target} {how} {given}: writing it would replace or alter what this command "
                          "reads (--overwrite does not allow it); choose an output path outside every input")


def check_output(target: str | Path, overwrite: bool = False, inputs: Iterable[Any] = ()) -> Path:
    """Refuse, in one line naming the path, an output that exists (without ``overwrite``), lies under a file,
    or lies in a folder this process cannot write to, or that is, contains or lies inside one of ``inputs``
    (:func:`check_apart`, with or without ``overwrite``); clean the leftovers of killed runs beside it
    (:func:`clean_leftovers`). Call it before computing; :func:`atomic_output` calls
    it again, and checks existence once more at the commit."""
    check_apart(target, inputs)
    target = Path(target)
    clean_leftovers(target)
    if os.path.lexists(target) and not overwrite:
        raise OutputExistsError(f"{target} already exists (pass --overwrite to replace it)")
    ancestor = target.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        if ancestor.is_symlink():  # a dangling link: mkdir would fail
            break
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise OutputError(f"{target}: cannot write under {ancestor}, which is a file, not a folder; "
                          "choose an output path in a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputError(f"{target}: no permission to write in the folder {ancestor}; choose an output path in "
                          "a writable folder, or make it writable")
    return target


def _make_parents(folder: Path) -> list[Path]:
    """``mkdir -p folder``; the folders it created, innermost first (to remove them again on failure)."""
    missing = []
    probe = folder
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except PermissionError as err:
        raise OutputError(f"{folder}: no permission to create this output folder; choose an output path in a "
                          "writable folder") from err
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # innermost first
        with contextlib.suppress(OSError):
            folder.rmdir()


@contextlib.contextmanager
def _commit_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive kernel lock on ``.NAME.commit-lock`` beside ``target`` (removed on release; not
    ``.NAME.lock``, which callers such as the store makers may hold around the whole write)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    lock = target.parent / f".{target.name}.commit-lock"
    while True:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:  # the file we locked may have been unlinked by the previous holder: lock the current one
                same = os.fstat(fd).st_ino == os.stat(lock).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def _exists_error(target: Path) -> OutputExistsError:
    return OutputExistsError(f"{target} already exists (another run wrote it while this one ran; pass "
                             "--overwrite to replace it)")


def _renameat2_noreplace(src: Path, dst: Path) -> bool:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (Linux renameat2); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise _exists_error(dst)
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


def rename_noreplace(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst``; :class:`OutputExistsError` if ``dst`` exists, also one created concurrently."""
    if _renameat2_noreplace(src, dst):
        return
    if src.is_file() and not src.is_symlink():
        try:
            os.link(src, dst)  # atomic: fails if dst exists
        except FileExistsError:
            raise _exists_error(dst) from None
        except OSError:
            pass  # no hard links here: fall through (the commit lock still serialises our writers)
        else:
            os.unlink(src)
            return
    if os.path.lexists(dst):
        raise _exists_error(dst)
    os.rename(src, dst)


def replace_atomically(new: Path, target: Path) -> None:
    """Move ``new`` onto ``target``: rename the old target aside, rename ``new`` in, delete the old one.

    If renaming ``new`` in fails, the old target is renamed back, so ``target`` always exists
    afterwards when it existed before.
    """
    new, target = Path(new), Path(target)
    with _commit_lock(target):
        old = None
        if os.path.lexists(target):
            old = _sibling(target, "old")
            os.replace(target, old)  # step 1: old aside
        try:
            os.replace(new, target)  # step 2: new into place
        except BaseException:
            if old is not None:
                os.replace(old, target)  # undo step 1
            raise
    if old is not None:
        _remove(old)  # step 3: only now is the old data gone


def commit(tmp: Path, target: Path, overwrite: bool) -> None:
    """Move the staged ``tmp`` onto ``target``: replacing it only with ``overwrite``, atomically either way."""
    if overwrite:
        replace_atomically(tmp, target)
        return
    with _commit_lock(target):
        rename_noreplace(tmp, target)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
LOW_SPACE = 1 << 20
"""Free bytes below which a write error that gives no errno (netCDF's ``NetCDF: HDF error``) is taken for a
full disk."""


@contextlib.contextmanager
def disk_full_named(target: Path, staging: Path) -> Iterator[None]:
    """Run a block that writes ``target`` through ``staging``; a full disk or quota (ENOSPC, EDQUOT, EFBIG, or
    an HDF/netCDF write error while less than :data:`LOW_SPACE` is free there) becomes a one-line
    :class:`OutputError` naming ``target`` and "no space left on device", instead of a raw OSError without a
    file name. Any other error passes unchanged."""
    try:
        yield
    except DiskFullError as err:  # a file written inside the staging folder of ``target``: name ``target``
        if staging not in err.target.parents:
            raise
        raise DiskFullError(target, err.reason, err.free) from err.__cause__
    except (OSError, RuntimeError) as err:
        free = _free_bytes(staging)
        if isinstance(err, OSError) and err.errno in DISK_FULL:
            reason = os.strerror(err.errno)
        elif ("HDF error" in str(err) or "NetCDF" in str(err)) and free is not None and free < LOW_SPACE:
            reason = " ".join(str(err).split())
        else:
            raise
        raise DiskFullError(target, reason, free) from err


class DiskFullError(OutputError):
    """An output that could not be written for want of space (its staging removed; nothing was written)."""

    def __init__(self, target: Path, reason: str, free: int | None) -> None:
        self.target, self.reason, self.free = Path(target), reason, free
        where = ("? bytes" if free is None else f"{free / 2**20:.1f} MiB" if free >= 2**20
                 else f"{free // 1024} KiB")
        super().__init__(f"{target}: no space left on device while writing it ({reason}; {where} free in "
                         f"{self.target.parent}); nothing was written: free some space or give an --out on another "
                         "disk")


def _free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or of its folder when it is gone), None when unknown."""
    try:
        return shutil.disk_usage(path if path.exists() else path.parent).free
    except OSError:
        return None


@contextlib.contextmanager
def atomic_output(target: str | Path, overwrite: bool = False,
                  kind: Literal["file", "dir"] = "file") -> Iterator[Path]:
    """Yield a hidden staging path beside ``target``; move it onto ``target`` only if the block succeeds.

    ``kind="dir"``: the staging folder exists (write files into it); ``"file"``: nothing exists at it yet (the
    caller creates a file, or a directory such as a zarr store). Refuses an existing ``target`` without
    ``overwrite`` (:class:`OutputExistsError`) on entry and at the commit; on any error the staging path and
    the folders made for ``target`` are removed and ``target`` is untouched."""
    target = check_output(target, overwrite)  # also cleans the leftovers of killed runs
    created = _make_parents(target.parent)
    tmp = _sibling(target, "staging")
    if kind == "dir":
        tmp.mkdir()
    done = False
    try:
        with disk_full_named(target, tmp):
            yield tmp
            commit(tmp, target, overwrite)
        done = True
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)
        if not done:
            _remove_empty(created)


@contextlib.contextmanager
def atomic_files(folder: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a hidden staging folder for files to add to the shared output ``folder`` (several commands may
    write into one folder, e.g. ``smoe plot … --out maps``); when the block succeeds every staged file is moved
    to the same relative path in ``folder``, under the commit lock. Without ``overwrite`` a file that exists
    there already is refused (:class:`OutputExistsError` naming it) before any file is moved; on any error
    nothing new is left in ``folder``."""
    folder = check_output(folder, overwrite=True)  # the folder may exist: its files are checked at the commit
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{folder} is a file; expected an output folder")
    created = _make_parents(folder.parent)
    tmp = _sibling(folder, "staging")
    tmp.mkdir()
    done = False
    try:
        yield tmp
        files = sorted(p.relative_to(tmp) for p in tmp.rglob("*") if not p.is_dir())
        with _commit_lock(folder):
            taken = [rel for rel in files if os.path.lexists(folder / rel)]
            if taken and not overwrite:
                raise OutputExistsError(f"{folder / taken[0]} already exists" + (
                    f" (and {len(taken) - 1} more of this command's files)" if len(taken) > 1 else "")
                    + " (pass --overwrite to replace it)")
            for rel in files:
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp / rel, folder / rel)
        done = True
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)
        if not done:
            _remove_empty(created)


@contextlib.contextmanager
def atomic_path(target: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """:func:`atomic_output` with ``kind="file"`` (the caller creates a file or a directory at the path)."""
    with atomic_output(target, overwrite, kind="file") as tmp:
        yield tmp


@contextlib.contextmanager
def work_dir(out: str | Path) -> Iterator[Path]:
    """A scratch folder ``.NAME.PID.work`` beside ``out`` (workers on other hosts reach it too), removed
    afterwards; one left by a killed run is removed by the next run's :func:`clean_leftovers`."""
    out = Path(out)
    clean_leftovers(out)
    path = out.parent / f".{out.name}.{os.getpid()}.work"
    shutil.rmtree(path, ignore_errors=True)
    created = _make_parents(path.parent)
    path.mkdir()
    try:
        with disk_full_named(out, path):
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _remove_empty(created)


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (indent 2)."""
    with atomic_path(path, overwrite=True) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=float) + "\n")


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically."""
    with atomic_path(path, overwrite=True) as tmp:
        tmp.write_text(text)


def string_char_encoding(ds: Any) -> dict[str, dict[str, Any]]:
    """Encodings that store every string variable and coordinate of ``ds`` as a netCDF char array.

    xarray's default for strings in netCDF4 files is the variable-length string type, and netCDF-C (all
    netCDF4 wheels to date) crashes the process with a segmentation fault when such a file is opened again
    while an earlier handle to it is still open (Unidata/netcdf4-python#1444, pydata/xarray#8289): a notebook
    that holds ``scores.nc`` open and then runs ``smoe plot scores`` on it would die. Char arrays (``S1`` plus
    a string-length dimension, UTF-8) read back as the same strings and do not trigger it.
    """
    return {name: {"dtype": "S1"} for name in string_variables(ds)}


def string_variables(ds: Any) -> list[str]:
    """Names of the variables and coordinates of ``ds`` that hold strings (unicode, bytes, or objects that
    are str/bytes, as netCDF strings read back)."""
    return [str(name) for name, var in ds.variables.items()
            if var.dtype.kind in "US" or (var.dtype.kind == "O" and var.size
                                          and isinstance(var.values.flat[0], str | bytes))]


def write_netcdf(ds: Any, path: str | Path, overwrite: bool = True,
                 encoding: dict[str, dict[str, Any]] | None = None, **to_netcdf: Any) -> Path:
    """Write the xarray Dataset ``ds`` to ``path`` as netCDF4, atomically, strings as char arrays
    (:func:`string_char_encoding`); ``encoding`` adds per-variable encodings (e.g. zlib) on top."""
    enc = string_char_encoding(ds)
    for name, e in (encoding or {}).items():
        enc[name] = {**enc.get(name, {}), **e}
    path = Path(path)
    with atomic_path(path, overwrite=overwrite) as tmp:
        ds.to_netcdf(tmp, encoding=enc, **to_netcdf)
    return path
