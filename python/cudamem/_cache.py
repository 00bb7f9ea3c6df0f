"""The trusted build cache: where cudamem keeps the C++ libraries it compiles for the
installed torch, and the checks made before one of them is loaded into the process.

Where: ``$CUDAMEM_CACHE_DIR``, else ``$XDG_CACHE_HOME/cudamem``, else ``~/.cache/cudamem``
(:func:`cache_dir`). Directories cudamem creates there get mode 0700.

What it trusts: a library is loaded only if

* the cache directory is a directory owned by the current user and writable by nobody else,
  and each of its parents is owned by the user or root and not writable by others (a
  group-writable parent is accepted when the group is the user's own private group; the walk
  stops at a sticky root-owned directory such as ``/tmp``, where others cannot rename entries);
* the library and its digest file ``<name>.sha256`` are regular files (not symlinks) owned by
  the current user and writable by nobody else;
* the library's SHA-256 matches the digest recorded when it was built.

A cache that fails the ownership or mode checks raises :class:`UntrustedCacheError` (another
user could have planted the file: nothing there is loaded, or written). A missing digest or a
mismatch means the file is not the one built (an interrupted or corrupted write): the caller
rebuilds it and :func:`store_artifact` replaces it.

Usage (the caller names the file; the key of what it depends on belongs in the name)::

    path = _cache.build_artifact("thing-<key>.so", lambda tmp: compile_to(tmp))

or, by hand: :func:`cached_artifact` (a verified path, or None), then build into a temporary
file in ``ensure_private_dir(cache_dir())`` and :func:`store_artifact` it.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Optional, Union

__all__ = [
    "UntrustedCacheError",
    "cache_dir",
    "ensure_private_dir",
    "cached_artifact",
    "store_artifact",
    "build_artifact",
    "digest_path",
]

PathLike = Union[str, "os.PathLike[str]"]

DIGEST_SUFFIX = ".sha256"
_DIGEST_MAX = 4096  # a digest file is one line; anything bigger is not ours


class UntrustedCacheError(RuntimeError):
    """A file or directory of the build cache could have been written by another user, so
    cudamem refuses to load from it (or write to it). The message names the path, what is
    wrong and how to fix it; ``path`` holds the path."""

    def __init__(self, path: PathLike, problem: str, fix: str):
        self.path = str(path)
        super().__init__(
            f"cudamem: refusing to use the build cache: {self.path} {problem}. Fix: {fix}, or "
            "point CUDAMEM_CACHE_DIR at a private directory (owned by you, mode 700)."
        )


def cache_dir() -> Path:
    """The cache directory: ``$CUDAMEM_CACHE_DIR``, else ``$XDG_CACHE_HOME/cudamem``, else
    ``~/.cache/cudamem`` (not created, not checked: see :func:`ensure_private_dir`)."""
    env = os.environ.get("CUDAMEM_CACHE_DIR")
    if env:
        return Path(os.path.expanduser(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cudamem"


def digest_path(path: PathLike) -> Path:
    """Where the SHA-256 of the library at ``path`` is recorded: ``<path>.sha256``."""
    p = Path(path)
    return p.with_name(p.name + DIGEST_SUFFIX)


def _who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def _group_is_private(gid: int) -> bool:
    """Whether ``gid`` is the user's own group (user private groups: same name, no other
    members), whose write bit lets nobody else in."""
    try:
        me = pwd.getpwuid(os.getuid()).pw_name
        g = grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getgid() and g.gr_name == me and set(g.gr_mem) <= {me}


def _check_owned(path: Path, st: os.stat_result, what: str, check_mode: bool = True) -> None:
    uid = os.getuid()
    if st.st_uid != uid:
        try:
            me = pwd.getpwuid(uid).pw_name
        except KeyError:
            me = str(uid)
        raise UntrustedCacheError(
            path,
            f"({what}) is owned by {_who(st.st_uid)}, not by you ({_who(uid)}): that user could have "
            "planted code that would run in your process",
            f"remove it, or `chown {me} {path}` if it is yours",
        )
    if check_mode and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedCacheError(
            path,
            f"({what}) is writable by group or others (mode {_mode(st)}): another user could "
            + ("put files in it" if stat.S_ISDIR(st.st_mode) else "replace it"),
            f"`chmod {'700' if stat.S_ISDIR(st.st_mode) else 'go-w'} {path}`",
        )


def _check_parents(real: Path) -> None:
    uid = os.getuid()
    for parent in real.parents:
        st = os.stat(parent)
        if st.st_uid not in (0, uid):
            raise UntrustedCacheError(
                parent,
                f"(a parent of the cache directory {real}) is owned by {_who(st.st_uid)}: that user "
                "could replace the cache directory",
                "move the cache under a directory of yours",
            )
        sticky = bool(st.st_mode & stat.S_ISVTX)
        if sticky and st.st_uid == 0:
            return  # like /tmp: others may add entries but cannot rename or remove ours
        writable = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _group_is_private(st.st_gid))
        if writable and not sticky:
            raise UntrustedCacheError(
                parent,
                f"(a parent of the cache directory {real}) is writable by group or others (mode "
                f"{_mode(st)}): another user could rename the cache directory and put their own in its place",
                f"`chmod go-w {parent}`",
            )


def _checked_dir(path: PathLike, create: bool) -> Optional[Path]:
    """The real path of the cache directory ``path`` after the checks; None if it does not
    exist and ``create`` is false."""
    path = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if not os.path.lexists(path):
        if not create:
            return None
        missing = []
        p = path
        while not os.path.lexists(p):
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o700)
            except FileExistsError:
                continue  # another process (rank) made it at the same time: checked below
            os.chmod(d, 0o700)  # mkdir's mode goes through the umask
    # Everything below uses the resolved path, so a symlink in the way is followed once, here.
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise UntrustedCacheError(
            path, "(the cache directory) is a symlink to nowhere", f"remove it (`rm {path}`)"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedCacheError(path, "(the cache directory) is not a directory", "remove it or choose another path")
    _check_owned(real, st, "the cache directory")
    _check_parents(real)
    return real


def ensure_private_dir(path: Optional[PathLike] = None) -> Path:
    """Creates the directory ``path`` (default :func:`cache_dir`) and the parents it lacks
    with mode 0700, checks it and its parents (see the module's docstring) and returns its
    real path. Raises :class:`UntrustedCacheError` if another user could write there."""
    real = _checked_dir(cache_dir() if path is None else path, create=True)
    assert real is not None
    return real


def _check_name(name: str) -> str:
    if not name or name in (".", "..") or os.path.basename(name) != name or "\0" in name:
        raise ValueError(f"a cache entry is a plain file name (no directory), got {name!r}")
    return name


def _open_checked(path: Path, what: str, check_mode: bool = True) -> Optional[int]:
    """An fd open on ``path`` after the symlink, type, owner and mode checks (on the open
    file, so that what was checked is what is read); None if it does not exist."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedCacheError(
            path, f"({what}) is a symlink: the cache holds only files cudamem wrote", f"remove it (`rm {path}`)"
        )
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedCacheError(path, f"({what}) is not a regular file", f"remove it (`rm -r {path}`)")
    _check_owned(path, st, what, check_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    fst = os.fstat(fd)
    if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)  # replaced between the check and the open: check again from scratch
        return _open_checked(path, what, check_mode)
    return fd


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


def cached_artifact(name: str, directory: Optional[PathLike] = None) -> Optional[Path]:
    """The path of the cached file ``name`` in ``directory`` (default :func:`cache_dir`),
    verified (owner, mode, no symlink, SHA-256 as recorded), or None when it must be built:
    absent, its digest missing, or its bytes not the ones recorded. Raises
    :class:`UntrustedCacheError` when the cache or the file could have been written by
    another user."""
    _check_name(name)
    d = _checked_dir(cache_dir() if directory is None else directory, create=False)
    if d is None:
        return None
    lib = d / name
    fd = _open_checked(lib, "a cached library")
    if fd is None:
        return None
    try:
        dfd = _open_checked(digest_path(lib), "the digest of a cached library")
        if dfd is None:
            return None
        try:
            recorded = os.read(dfd, _DIGEST_MAX).decode("ascii", "replace").split()
        finally:
            os.close(dfd)
        actual = _sha256_fd(fd)
    finally:
        os.close(fd)
    return lib if recorded and recorded[0] == actual else None


def store_artifact(tmp_path: PathLike, final_path: PathLike) -> Path:
    """Moves the freshly built file ``tmp_path`` to ``final_path`` (in a cache directory,
    checked or created with :func:`ensure_private_dir`) atomically, with mode 0700, and
    records its SHA-256 in ``<final_path>.sha256`` (also atomically). Concurrent processes
    may store the same entry: the last one wins, each replace is whole. ``tmp_path`` is
    consumed. Returns the final path (in the directory's real path)."""
    final_path = Path(final_path)
    d = ensure_private_dir(final_path.parent)
    name = _check_name(final_path.name)
    tmp = Path(tmp_path)
    if Path(os.path.realpath(tmp.parent)) != d:
        # os.replace is atomic only within one file system: copy into the cache first.
        fd, copy = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=str(d))
        with os.fdopen(fd, "wb") as out, open(tmp, "rb") as src:
            shutil.copyfileobj(src, out)
        os.unlink(tmp)
        tmp = Path(copy)
    # Its mode is not checked but set: the compiler's output follows the umask, which may be
    # 002, and nobody else can reach it in the private directory.
    fd = _open_checked(tmp, "a freshly built file", check_mode=False)
    if fd is None:
        raise FileNotFoundError(f"cudamem: store_artifact: {tmp} does not exist")
    try:
        os.fchmod(fd, 0o700)
        digest = _sha256_fd(fd)
    finally:
        os.close(fd)
    dfd, dtmp = tempfile.mkstemp(prefix=name + DIGEST_SUFFIX + ".", suffix=".tmp", dir=str(d))  # mode 0600
    try:
        with os.fdopen(dfd, "w") as f:
            f.write(f"{digest}  {name}\n")  # sha256sum's format: `sha256sum -c` checks it
        os.replace(tmp, d / name)
        os.replace(dtmp, digest_path(d / name))
    finally:
        if os.path.lexists(dtmp):
            os.unlink(dtmp)
    return d / name


def build_artifact(
    name: str, build: Callable[[Path], None], directory: Optional[PathLike] = None
) -> Path:
    """The verified cached file ``name`` (see :func:`cached_artifact`), or, when it must be
    built, ``build(tmp)`` writes it to the temporary path ``tmp`` (in the cache directory) and
    it is stored with :func:`store_artifact`. An exception from ``build`` propagates (the
    temporary file is removed)."""
    cached = cached_artifact(name, directory)
    if cached is not None:
        return cached
    d = ensure_private_dir(cache_dir() if directory is None else directory)
    fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=str(d))
    os.close(fd)
    try:
        build(Path(tmp))
        return store_artifact(tmp, d / name)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
