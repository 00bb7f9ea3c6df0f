"""The trusted build cache (cudamem._cache), without torch: what it creates, what it refuses
to load (files and directories another user could have written), what it rebuilds (a missing
or wrong digest) and what it reuses."""

import hashlib
import os
import stat

import pytest

from cudamem import _cache
from cudamem._cache import UntrustedCacheError

NAME = "thing-0123456789abcdef.so"
OTHER_UID = 4242  # not the current user (the foreign-owner tests run as root)


class Builder:
    """A build function that writes ``content`` and counts its calls."""

    def __init__(self, content=b"\x7fELF built by the test"):
        self.content = content
        self.calls = 0

    def __call__(self, tmp):
        self.calls += 1
        tmp.write_bytes(self.content)


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("CUDAMEM_CACHE_DIR", str(d))
    return d


@pytest.fixture
def built(cache):
    """A cache holding one valid entry, and its builder."""
    b = Builder()
    path = _cache.build_artifact(NAME, b)
    assert b.calls == 1
    return path, b


def _refused(match, fn, *args):
    with pytest.raises(UntrustedCacheError, match=match) as e:
        fn(*args)
    assert isinstance(e.value, RuntimeError)
    assert "CUDAMEM_CACHE_DIR" in str(e.value)  # always says how to get out of it
    return str(e.value)


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAMEM_CACHE_DIR", str(tmp_path / "c"))
    assert _cache.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("CUDAMEM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _cache.cache_dir() == tmp_path / "xdg" / "cudamem"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _cache.cache_dir() == tmp_path / "home" / ".cache" / "cudamem"


def test_created_directories_have_mode_0700_whatever_the_umask(tmp_path):
    old = os.umask(0o277)  # would give 0500 without the explicit chmod
    try:
        real = _cache.ensure_private_dir(tmp_path / "a" / "b" / "cache")
    finally:
        os.umask(old)
    assert real == tmp_path / "a" / "b" / "cache"
    for d in (tmp_path / "a", tmp_path / "a" / "b", real):
        assert _mode(d) == 0o700, d
    assert _cache.ensure_private_dir(real) == real  # existing and private: fine


def test_the_normal_path_caches_and_reuses(cache, built):
    path, b = built
    assert path == cache / NAME and path.read_bytes() == b.content
    assert _mode(cache) == 0o700 and _mode(path) == 0o700
    digest = _cache.digest_path(path)
    assert digest == cache / (NAME + ".sha256") and _mode(digest) == 0o600
    assert digest.read_text() == f"{hashlib.sha256(b.content).hexdigest()}  {NAME}\n"
    assert _cache.cached_artifact(NAME) == path
    assert _cache.build_artifact(NAME, b) == path
    assert b.calls == 1  # the second call did not rebuild
    assert sorted(p.name for p in cache.iterdir()) == [NAME, NAME + ".sha256"]  # no temporaries left


def test_nothing_cached_yet(cache):
    assert _cache.cached_artifact(NAME) is None
    assert not cache.exists()  # looking does not create it


def test_a_group_writable_cache_directory_is_refused(cache, built):
    os.chmod(cache, 0o770)
    msg = _refused("writable by group or others", _cache.cached_artifact, NAME)
    assert str(cache) in msg and "0770" in msg and "chmod 700" in msg
    b = Builder()
    _refused("0770", _cache.build_artifact, NAME, b)
    assert b.calls == 0  # nothing is built into it either
    _refused("0770", _cache.ensure_private_dir, cache)


def test_a_group_writable_library_is_refused(cache, built):
    path, _ = built
    os.chmod(path, 0o770)
    msg = _refused("writable by group or others", _cache.cached_artifact, NAME)
    assert str(path) in msg and "0770" in msg and "chmod go-w" in msg


def test_a_symlinked_library_or_digest_is_refused(cache, built, tmp_path):
    path, b = built
    elsewhere = tmp_path / "elsewhere.so"
    os.replace(path, elsewhere)
    os.symlink(elsewhere, path)  # same bytes, digest matches: refused for being a link
    msg = _refused("symlink", _cache.cached_artifact, NAME)
    assert str(path) in msg
    os.unlink(path)
    os.replace(elsewhere, path)
    digest = _cache.digest_path(path)
    os.replace(digest, tmp_path / "elsewhere.sha256")
    os.symlink(tmp_path / "elsewhere.sha256", digest)
    _refused("symlink", _cache.cached_artifact, NAME)


def test_a_cache_directory_that_is_a_file_is_refused(cache):
    cache.write_bytes(b"")
    _refused("not a directory", _cache.cached_artifact, NAME)


def test_a_writable_parent_is_refused_unless_sticky(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, 0o777)  # anyone could rename the cache directory and put theirs in place
    msg = _refused("parent of the cache directory", _cache.ensure_private_dir, parent / "cache")
    assert str(parent) in msg and "0777" in msg
    os.chmod(parent, 0o1777)  # sticky, like /tmp: others cannot rename what is ours
    assert _mode(_cache.ensure_private_dir(parent / "cache")) == 0o700


def _require_root():
    if os.getuid() != 0:
        pytest.skip("planting a file owned by another user needs root (os.chown)")


def test_a_library_planted_by_another_user_is_refused(cache, built):
    _require_root()
    path, b = built
    # Another user's file, with a digest that matches: ownership alone refuses it.
    path.write_bytes(b"planted")
    _cache.digest_path(path).write_text(hashlib.sha256(b"planted").hexdigest() + "  " + NAME + "\n")
    os.chown(path, OTHER_UID, OTHER_UID)
    msg = _refused(f"owned by uid {OTHER_UID}", _cache.cached_artifact, NAME)
    assert str(path) in msg and f"uid {os.getuid()}" in msg and "chown" in msg
    _refused(f"owned by uid {OTHER_UID}", _cache.build_artifact, NAME, b)
    os.chown(path, os.getuid(), os.getgid())
    os.chown(_cache.digest_path(path), OTHER_UID, OTHER_UID)
    _refused(f"owned by uid {OTHER_UID}", _cache.cached_artifact, NAME)


def test_a_cache_directory_of_another_user_is_refused(tmp_path):
    _require_root()
    shared = tmp_path / "theirs"
    shared.mkdir(mode=0o755)
    (shared / NAME).write_bytes(b"planted")
    os.chown(shared, OTHER_UID, OTHER_UID)
    msg = _refused(f"owned by uid {OTHER_UID}", _cache.cached_artifact, NAME, shared)
    assert str(shared) in msg
    # A group-writable parent whose group is not the user's own is refused too.
    os.chown(shared, os.getuid(), os.getgid())
    os.chmod(tmp_path, 0o770)
    os.chown(tmp_path, -1, OTHER_UID)
    try:
        _refused("parent of the cache directory", _cache.cached_artifact, NAME, shared)
    finally:
        os.chown(tmp_path, -1, os.getgid())
        os.chmod(tmp_path, 0o700)


def test_a_tampered_library_is_rebuilt(cache, built):
    path, b = built
    path.write_bytes(b"changed after the digest was written")
    assert _cache.cached_artifact(NAME) is None
    assert _cache.build_artifact(NAME, b) == path
    assert b.calls == 2 and path.read_bytes() == b.content
    assert _cache.cached_artifact(NAME) == path


def test_a_missing_digest_is_rebuilt(cache, built):
    path, b = built
    os.unlink(_cache.digest_path(path))
    assert _cache.cached_artifact(NAME) is None
    assert _cache.build_artifact(NAME, b) == path
    assert b.calls == 2 and _cache.digest_path(path).exists()
    assert _cache.cached_artifact(NAME) == path


def test_a_failed_build_leaves_nothing(cache):
    def fail(tmp):
        tmp.write_bytes(b"half")
        raise RuntimeError("compiler said no")

    with pytest.raises(RuntimeError, match="compiler said no"):
        _cache.build_artifact(NAME, fail)
    assert list(cache.iterdir()) == []


def test_store_artifact_sets_the_mode_and_takes_files_from_elsewhere(cache, tmp_path):
    d = _cache.ensure_private_dir()
    tmp = d / "out.tmp"
    tmp.write_bytes(b"one")
    os.chmod(tmp, 0o775)  # a compiler's output under umask 002
    assert _cache.store_artifact(tmp, d / NAME) == d / NAME
    assert _mode(d / NAME) == 0o700 and not tmp.exists()
    assert _cache.cached_artifact(NAME) == d / NAME
    outside = tmp_path / "built-elsewhere.so"
    outside.write_bytes(b"two")
    assert _cache.store_artifact(outside, d / NAME) == d / NAME  # copied in, then replaced atomically
    assert (d / NAME).read_bytes() == b"two" and not outside.exists()
    assert _cache.cached_artifact(NAME) == d / NAME


def test_entry_names_are_plain_file_names(cache):
    for bad in ("", ".", "..", "../x.so", "sub/x.so"):
        with pytest.raises(ValueError, match="plain file name"):
            _cache.cached_artifact(bad)
