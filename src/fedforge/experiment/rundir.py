"""Run folders: one writer at a time, no earlier run replaced by accident, resume only the
run that was started.

:func:`claim_run_dir` wraps every run (``fedforge run``, ``compare``, multi-task runs):

* it holds an OS lock (``flock`` or the Windows equivalent on ``run.lock``, via ``filelock``) while
  the run writes, so a second run into the same folder fails at once; the kernel drops the
  lock when the process dies, so a killed run never blocks the next one;
* a folder that already holds a run's files needs ``resume`` (continue it) or ``overwrite``
  (delete the run's own files, and nothing else, first);
* on resume the new resolved config may differ from the saved one only in the settings that
  do not change what is computed (``rounds``, evaluation, checkpoints, engine placement);
* the resolved config of every start is appended to ``config.history.jsonl``, so resuming
  with more rounds keeps the record of how the first part was run.

The folder's own files must be plain files (no symbolic or hard links): a run appends to
them, and appending through a planted link would write outside the folder.

Every command that writes files into a folder (``report``, ``plot``, ``compare``,
``reproduce``, ``pretrain``, ``bench``) goes through the one writer here: :func:`write_text`,
:func:`write_bytes`, :func:`save_figure` (atomic: a temporary file in the folder, then a
rename) and :func:`append_text`. Each refuses a destination that is a symbolic link (dangling
or not), a hard link or not a regular file, and one whose folder resolves outside ``folder``.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from fedforge.core.files import NOFOLLOW, not_plain

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOCK_NAME = "run.lock"
CONFIG_NAME = "config.resolved.toml"
PARTITION_NAME = "partition.json"
PARTITION_ARRAYS = "partition.npz"  # per-client sizes and label counts
HISTORY_NAME = "config.history.jsonl"
CHECKPOINTS = "checkpoints"
# the files a run writes at the top of its folder; a non-empty result file or checkpoint
# marks a folder as holding a run (a config alone is a start that produced nothing yet)
RESULT_FILES = ("metrics.jsonl", "events.jsonl", "summary.json", "divergence.jsonl",
                "client_metrics.npz")
RUN_FILES = (CONFIG_NAME, HISTORY_NAME, PARTITION_NAME, PARTITION_ARRAYS, *RESULT_FILES)
SCRATCH_FILES = (CONFIG_NAME + ".tmp", "metrics.jsonl.tmp",  # left behind by a killed write
                 PARTITION_NAME + ".tmp")
_CHECKPOINT_FILE = re.compile(r"(?:round_\d{5,}\.(?:json|safetensors)|latest\.json)(?:\.tmp)?")

# dotted config keys (``*`` matches one list index) that a resumed run may change; a section
# name covers its keys (but not those of never_change()). The engine only places the
# computation (world size, chunking, device); its numeric precision changes the results.
RUN_MAY_CHANGE = ("rounds", "eval", "checkpoint", "engine", "compare", "logging")
MULTITASK_MAY_CHANGE = ("max_updates", "max_time", "eval", "checkpoint", "engine",
                        "tasks.*.eval_every")


def never_change() -> tuple[str, ...]:
    """The keys a resume may not change even in a section it may change: the engine's
    precision and every key the config schema marks as selecting which samples train or are
    evaluated (``eval.personal``, ``eval.held_out``, ...; ``config.SELECTS_DATA``)."""
    return ("engine.precision", *_data_keys())


@cache
def _data_keys() -> tuple[str, ...]:
    from fedforge.experiment.config import data_selecting_keys  # noqa: PLC0415 (torch)

    return data_selecting_keys()


class RunDirError(ValueError):
    """A run folder that cannot be used as asked; one line naming the folder or file."""


class ResumeConfigError(RunDirError):
    """A resume whose config differs from the one the run started with (a caller that owns
    the folder, such as a sweep's ``best/``, tells this case apart from a broken folder)."""


def folder_option(option: str, value: str | Path) -> Path:
    """The folder a path option (``--out``, ``--runs``) names. An empty value is refused: it
    would silently mean the current folder."""
    if not str(value).strip():
        raise RunDirError(f"{option}: empty; name a folder (or '.' for the current one)")
    return Path(value)


@contextmanager
def claim_run_dir(
    out: str | Path, write_config: Callable[[Path], None], *, resume: bool = False,
    overwrite: bool = False, may_change: tuple[str, ...] = RUN_MAY_CHANGE,
) -> Iterator[Path]:
    """Lock ``out`` for the duration of the ``with`` block, check it may be written as asked
    and write the resolved config (``write_config(path)`` writes it as TOML) plus its
    history line. Raises :class:`RunDirError` before anything of an earlier run is changed."""
    out = Path(out)
    if resume and overwrite:
        raise RunDirError(f"{out}: choose one of --resume and --overwrite")
    _make_folder(out)
    problem = not_plain(out / LOCK_NAME)
    if problem:
        raise RunDirError(f"{out}: cannot lock the run folder: {LOCK_NAME} {problem}; "
                          "remove it or choose another --out")
    lock = FileLock(str(out / LOCK_NAME), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunDirError(f"{out}: another run is writing this folder (it holds {LOCK_NAME});"
                          " wait for it to finish or choose another --out") from None
    except OSError as exc:
        raise RunDirError(f"{out}: cannot lock the run folder ({exc.strerror or exc})") from None
    try:
        _check_plain_files(out, remove=overwrite)
        existing = holds_run(out)
        if existing and not (resume or overwrite):
            raise RunDirError(f"{out}: holds an earlier run; pass --resume to continue it or "
                              "--overwrite to replace it (or choose another --out)")
        if overwrite:
            remove_run_files(out)
        new = _write_pending_config(out, write_config)
        mode = "resume" if resume and existing else "overwrite" if existing else "fresh"
        if mode == "resume":
            saved = _saved_config(out)
            bad = config_differences(saved, new, may_change)
            if bad:
                (out / (CONFIG_NAME + ".tmp")).unlink(missing_ok=True)
                raise ResumeConfigError(
                    f"{out}: cannot resume with a different config: {', '.join(bad)} differ "
                    f"from {CONFIG_NAME} ({_data_note(bad)}a resume may change only "
                    f"{', '.join(may_change)}); choose another --out or pass --overwrite")
            if not (out / HISTORY_NAME).exists():  # a run from before the history existed
                _append_history(out, "earlier", saved)
        os.replace(out / (CONFIG_NAME + ".tmp"), out / CONFIG_NAME)
        _append_history(out, mode, new)
        yield out
    finally:
        lock.release()


def _make_folder(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out}: exists and is not a folder; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"{out}: cannot create the run folder ({exc.strerror or exc})"
                          ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise RunDirError(f"{out}: the run folder is not writable")


def holds_run(out: str | Path) -> bool:
    """Whether ``out`` holds results of a run: a non-empty metrics, events, summary or
    divergence file, or anything in ``checkpoints/``. A folder with only a config (a run that
    failed before its first result) or only ``run.lock`` does not count."""
    out = Path(out)
    for name in RESULT_FILES:
        path = out / name
        if path.is_symlink() or (path.exists() and (not path.is_file()
                                                    or path.stat().st_size > 0)):
            return True
    ckpt = out / CHECKPOINTS
    return ckpt.is_symlink() or (ckpt.exists() and (not ckpt.is_dir() or any(ckpt.iterdir())))


def _check_plain_files(out: Path, remove: bool) -> None:
    """Every run file that exists must be a regular file with one link (``checkpoints`` a
    real folder); with ``remove`` an offending name is unlinked instead (never its target)."""
    for name in (*RUN_FILES, *SCRATCH_FILES, CHECKPOINTS):
        path = out / name
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if name == CHECKPOINTS:
            problem = ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else
                       None if stat.S_ISDIR(st.st_mode) else "is not a folder")
        else:
            problem = not_plain(path)
        if problem is None:
            continue
        if not remove:
            raise RunDirError(f"{path}: {problem}; a run folder holds plain files only "
                              "(--overwrite replaces the run)")
        path.unlink()


def remove_run_files(out: str | Path) -> list[Path]:
    """Delete the files a run writes in ``out`` (see ``RUN_FILES``; in ``checkpoints/`` only
    checkpoint-named files) -> the deleted paths. Anything else in the folder stays; links
    are removed as links, their targets untouched."""
    out = Path(out)
    deleted = []
    for name in (*RUN_FILES, *SCRATCH_FILES):
        path = out / name
        if path.is_symlink() or path.is_file():
            path.unlink()
            deleted.append(path)
    ckpt = out / CHECKPOINTS
    if ckpt.is_symlink() or (ckpt.exists() and not ckpt.is_dir()):
        ckpt.unlink()
        deleted.append(ckpt)
    elif ckpt.is_dir():
        for entry in os.scandir(ckpt):
            if _CHECKPOINT_FILE.fullmatch(entry.name) and (
                    entry.is_symlink() or entry.is_file(follow_symlinks=False)):
                os.unlink(entry.path)
                deleted.append(ckpt / entry.name)
        try:
            ckpt.rmdir()
        except OSError:  # holds files that are not ours: keep them
            pass
    return deleted


def _write_pending_config(out: Path, write_config: Callable[[Path], None]) -> dict:
    tmp = out / (CONFIG_NAME + ".tmp")
    tmp.unlink(missing_ok=True)
    write_config(tmp)
    return tomllib.loads(tmp.read_text(encoding="utf-8"))


def _saved_config(out: Path) -> dict:
    path = out / CONFIG_NAME
    if not path.is_file():
        raise RunDirError(f"{out}: cannot check --resume: {CONFIG_NAME} is missing; choose "
                          "another --out or pass --overwrite")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RunDirError(f"{path}: unreadable ({exc})") from None


def config_differences(saved: dict, new: dict,
                       may_change: tuple[str, ...] = RUN_MAY_CHANGE) -> list[str]:
    """Dotted keys (``tasks.0.seed`` for list items) whose values differ between two resolved
    configs and that a resume may not change."""
    a, b = _flatten(saved), _flatten(new)
    missing = object()
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k, missing) != b.get(k, missing))
    return [k for k in changed if not _may_change(k, may_change)]


def _may_change(key: str, patterns: tuple[str, ...]) -> bool:
    return not _matches(key, never_change()) and _matches(key, patterns)


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(key, p) or fnmatchcase(key, p + ".*") for p in patterns)


def _data_note(keys: list[str]) -> str:
    """For the error: which of ``keys`` select the samples that train or are evaluated."""
    data = [k for k in keys if _matches(k, _data_keys())]
    if not data:
        return ""
    verb = "selects" if len(data) == 1 else "select"
    return f"{', '.join(data)} {verb} which samples train or are evaluated; "


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        items = tree.items()
    elif isinstance(tree, list) and tree and all(isinstance(x, dict) for x in tree):
        items = ((str(i), x) for i, x in enumerate(tree))
    else:
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _append_history(out: Path, mode: str, config: dict) -> None:
    line = json.dumps({"time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "mode": mode, "config": config}, default=str)
    append_text(out, HISTORY_NAME, line + "\n")


def read_config_history(out: str | Path) -> list[dict]:
    """The run's ``config.history.jsonl``: one ``{time, mode, config}`` per start, oldest
    first (``mode``: fresh | overwrite | resume | earlier)."""
    path = Path(out) / HISTORY_NAME
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


# ------------------------------------------------------------------ the one writer

def writable_path(folder: str | Path, name: str | Path) -> Path:
    """``folder/name``, its sub-folders created, once checked that it may be written: the
    file is absent or plain (see :func:`~fedforge.core.files.not_plain`) and its folder
    resolves inside ``folder`` (a planted sub-folder link cannot lead elsewhere).
    RunDirError otherwise."""
    path = Path(folder) / name
    subfolder(folder, Path(name).parent)
    problem = not_plain(path)
    if problem:
        raise RunDirError(f"{path}: {problem}; fedforge writes only plain files (remove it "
                          "or choose another --out)")
    return path


def subfolder(folder: str | Path, name: str | Path) -> Path:
    """``folder/name`` as a folder (created if absent) that resolves inside ``folder``: a
    planted link to a folder elsewhere is refused (RunDirError). ``folder`` itself may be a
    link: the caller chose it. Each level is checked before the next is created in it, so
    a link planted for ``a`` of ``a/b`` creates nothing where it leads."""
    folder = Path(folder)
    path = folder
    for part in ("", *Path(name).parts):
        path = path / part
        try:
            path.mkdir(parents=not part, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"{path}: cannot create the folder ({exc.strerror or exc})"
                              ) from None
        base, real = folder.resolve(), path.resolve()
        if real != base and base not in real.parents:
            raise RunDirError(f"{path}: leads outside {folder} (through a symbolic link); "
                              "fedforge writes only inside the folder")
    return path


def write_bytes(folder: str | Path, name: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``folder/name`` atomically -> the path. A temporary file created
    in the same folder (never an existing name) is fsync'd and renamed over the name, so a
    reader sees the old file or the new one, and nothing is written through a link."""
    path = writable_path(folder, name)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        writable_path(folder, name)  # planted while we wrote: still refuse
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(folder: str | Path, name: str | Path, text: str) -> Path:
    """:func:`write_bytes` of UTF-8 ``text`` -> the path."""
    return write_bytes(folder, name, text.encode("utf-8"))


def save_figure(folder: str | Path, name: str | Path, fig: Any, **savefig: Any) -> Path:
    """Render a matplotlib figure in memory (format from the name's suffix) and write it
    with :func:`write_bytes` -> the path; matplotlib itself never opens the file."""
    import io  # noqa: PLC0415

    buf = io.BytesIO()
    fig.savefig(buf, format=Path(name).suffix.lstrip(".") or "png", **savefig)
    return write_bytes(folder, name, buf.getvalue())


def append_text(folder: str | Path, name: str | Path, text: str) -> Path:
    """Append UTF-8 ``text`` to ``folder/name`` (created if absent), flushed and fsync'd ->
    the path. Opened with ``O_NOFOLLOW`` and re-checked for hard links once open."""
    path = writable_path(folder, name)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        raise RunDirError(f"{path}: cannot open for appending ({exc.strerror or exc})"
                          ) from None
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        if os.fstat(fd).st_nlink > 1:
            raise RunDirError(f"{path}: has hard links; fedforge writes only plain files")
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
