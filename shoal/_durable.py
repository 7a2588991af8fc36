"""Durable files: how shoal writes a file it will read back, and how it reads it back.

Every file shoal keeps across runs goes through here: the checkpoints of
``search`` (one file), ``dl`` (one file) and ``txstream`` (a folder of
``state.npz`` and ``out-*.npz``), the ensemble journal's lock file, trace and
report files.  The rules, each one a way a checkpoint folder that somebody
else can write (shared scratch, an unpacked archive) was turned against the
driver:

* **Writes** go to a temporary file created with
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` (mode 0600) under an unpredictable name in the
  target's folder, then ``fsync``, ``rename`` over the target (a rename
  replaces a symlink planted at the target, it never writes through it) and
  ``fsync`` of the folder.  A planted symlink or file at the temporary name
  makes ``O_EXCL`` fail: the next name is tried, nothing is written through
  it.  Rejected: ``open(tmp, "wb")`` at a fixed or pid-derived name (it follows
  a planted link and overwrote a file outside the folder).
* **Reads** open with ``O_NOFOLLOW|O_NONBLOCK`` and check ``fstat`` before a
  byte is read: a symlink, FIFO (an ``open`` that would block for ever), device
  or folder at the path is refused.  The target is checked with ``lstat``
  before any work starts (``check_target``).
* **Stale temporaries** of writers that died (SIGKILL mid-save: a 63 MiB
  ``dl`` temporary was left behind for every one) are removed at the next
  open: the name carries the host and pid, and a file of a pid that no longer
  runs on this host is deleted (``sweep``); a live writer's, or another host's,
  are left alone.
* **One writer per file**: ``WriterLock`` holds ``flock`` on a lock file for
  the driver's life (the kernel drops it when the driver dies), as the
  ensemble journal does; a second driver is refused with the first one's pid
  and host instead of deleting what the first is about to commit.
* **Writability first**: ``probe_writable`` creates and removes a temporary
  file, and checks the free space against what a save needs, before the
  work starts (``dl`` trained a whole epoch before its first save found a
  read-only folder).
* **One clear error**: every ``OSError`` becomes a ``DurableIOError`` (an
  ``OSError``, errno kept) naming the path, the cause and what to do.

The checked container (``pack``/``unpack``) is the other half: a header
(magic, format version, kind, what the file belongs to, body length and
SHA-256) that is verified before any byte of the body is decoded, so a
damaged, truncated or crafted file is one ``CheckpointError`` naming the
file, and a body that needs pickle (search nodes are arbitrary objects) is
unpickled only after the header matched the run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import socket
import stat
import time

from ._errors import ShoalError

HOST = socket.gethostname().replace(os.sep, "_")
MAGIC = b"SHOAL-CHECKPOINT\n"
FORMAT = 1
HEADER_MAX = 1 << 20  # bytes of JSON header a reader accepts before giving up


class CheckpointError(ShoalError, ValueError):
    """A durable file is damaged, crafted, of another format, or belongs to another run."""


class CheckpointInUse(ShoalError, RuntimeError):
    """Another live driver holds the writer lock of this checkpoint."""


class DurableIOError(ShoalError, OSError):
    """An I/O error on a durable file; ``errno`` and ``filename`` are the cause's."""

    def __init__(self, message: str, cause: OSError | None = None, path: str | None = None):
        super().__init__(getattr(cause, "errno", None), message, path)
        self.message = message

    def __str__(self) -> str:
        return self.message


_ADVICE = {
    errno.ENOSPC: "free space there or choose a folder on another file system",
    errno.EDQUOT: "free space in your quota or choose another folder",
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.EACCES: "make the folder writable for this user or choose another one",
    errno.EPERM: "make the folder writable for this user or choose another one",
    errno.ENOENT: "create the folder first (or fix the path)",
    errno.ENOTDIR: "a part of the path is not a folder: fix the path",
    errno.ELOOP: "it is a symbolic link; give the real path (shoal never writes or reads through a link)",
    errno.EIO: "the device reported an I/O error: check the disk, then retry",
}


def explain(what: str, path: str, exc: OSError, doing: str) -> DurableIOError:
    """``exc`` as one line: what file, what shoal was doing, the cause and what to do."""
    name = errno.errorcode.get(exc.errno, "") if exc.errno else ""
    cause = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
    advice = _ADVICE.get(exc.errno, "check the path and the file system, then retry")
    return DurableIOError(f"{what} {path}: {doing} failed: {cause}; {advice}", exc, path)


# -- reading ---------------------------------------------------------------------------------
def check_target(path: str, what: str, *, directory: bool = False) -> bool:
    """``lstat`` the target before any work: False if absent, True if it is what it should be
    (a regular file, or with ``directory`` a real folder); else a ``DurableIOError``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise explain(what, path, exc, "checking the path") from None
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        raise DurableIOError(f"{what} {path} is a symbolic link; shoal never reads or writes a "
                             f"{what} through a link: give the real path", None, path)
    if directory:
        if not stat.S_ISDIR(mode):
            raise DurableIOError(f"{what} {path} is not a folder (it is {_kind(mode)}); give a "
                                 "folder path", None, path)
    elif stat.S_ISDIR(mode):
        raise DurableIOError(f"{what} {path} is a directory; give the path of a file in it, "
                             f"such as {os.path.join(path, what.replace(' ', '-'))}", None, path)
    elif not stat.S_ISREG(mode):
        raise DurableIOError(f"{what} {path} is not a regular file (it is {_kind(mode)}); "
                             "give the path of a file (a FIFO would block the read for ever)", None, path)
    return True


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def read_file(path: str, what: str) -> bytes | None:
    """The bytes of the regular file at ``path``; None if there is none.  A link, FIFO,
    device or folder there is refused before a byte is read (``O_NOFOLLOW|O_NONBLOCK``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            check_target(path, what)  # says "symbolic link"
        raise explain(what, path, exc, "opening it") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            fd = -1
            check_target(path, what)
            raise DurableIOError(f"{what} {path} is not a regular file", None, path)
        os.set_blocking(fd, True)
        chunks, left = [], st.st_size
        while True:
            chunk = os.read(fd, max(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left = max(0, left - len(chunk))
        return b"".join(chunks)
    except OSError as exc:
        if isinstance(exc, DurableIOError):
            raise
        raise explain(what, path, exc, "reading it") from None
    finally:
        if fd >= 0:
            os.close(fd)


# -- writing ---------------------------------------------------------------------------------
def _tmp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}.{HOST}."


def _create_tmp(path: str) -> tuple[int, str]:
    """A new temporary file next to ``path``: ``O_CREAT|O_EXCL|O_NOFOLLOW``, 0600, a name
    with this host, this pid and 64 random bits (``.fit.npz.host.1234.9f...tmp``)."""
    folder = os.path.dirname(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(folder, f"{_tmp_prefix(path)}{os.getpid()}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:  # something is there (planted, or a collision): another name
            continue
    raise FileExistsError(errno.EEXIST, "100 temporary names in a row were taken", folder)


def write_atomic(path: str, chunks, what: str) -> None:
    """Replace ``path`` by ``chunks`` (bytes-like pieces) atomically and durably: a reader
    sees the old file or the new one, never a mix, and a crash leaves one of the two."""
    tmp = None
    try:
        fd, tmp = _create_tmp(path)
        try:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while view:
                    view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # replaces a link planted at ``path``; never follows it
        tmp = None
        fsync_folder(os.path.dirname(os.path.abspath(path)))
    except OSError as exc:
        raise explain(what, path, exc, "saving it") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sweep(path: str, legacy=None) -> int:
    """Remove the temporaries that writers of ``path`` on this host left when they died;
    the number removed.  ``legacy(name) -> pid | None`` also names older temporary names
    (regular files only; pid 0: no pid recorded, removed when the caller holds the lock)."""
    prefix = _tmp_prefix(path)
    return _sweep(os.path.dirname(os.path.abspath(path)),
                  lambda name: name[len(prefix):] if name.startswith(prefix) else None, legacy)


def sweep_folder(folder: str, legacy=None) -> int:
    """``sweep`` for every file of a folder that holds one writer's files (txstream)."""
    mark = f".{HOST}."

    def rest(name: str) -> str | None:
        return name[name.index(mark) + len(mark):] if name.startswith(".") and mark in name else None

    return _sweep(folder, rest, legacy)


def _sweep(folder: str, rest, legacy) -> int:
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    removed = 0
    for name in names:
        pid, tail = None, rest(name)
        if tail is not None and tail.endswith(".tmp"):
            head = tail[:-4].split(".", 1)[0]
            pid = int(head) if head.isdigit() else None
        elif legacy is not None:
            pid = legacy(name)
        if pid is None or pid == os.getpid() or (pid > 0 and pid_alive(pid)):
            continue
        full = os.path.join(folder, name)
        try:
            if stat.S_ISREG(os.lstat(full).st_mode):
                os.unlink(full)
                removed += 1
        except OSError:
            pass
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists
        return True
    return True


def probe_writable(path: str, what: str, need_bytes: int = 0) -> None:
    """Before the work starts: the folder of ``path`` exists, a temporary file can be created
    and removed there, and it has ``need_bytes`` free (what one save writes, twice over if
    the old file stays until the rename)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        st = os.stat(folder)
    except OSError as exc:
        raise explain(what, path, exc, f"checking its folder {folder}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise DurableIOError(f"{what} {path}: {folder} is not a folder; fix the path", None, path)
    tmp = None
    try:
        fd, tmp = _create_tmp(path)
        try:
            os.write(fd, b"\0")
            os.fsync(fd)
        finally:
            os.close(fd)
        vfs = os.statvfs(folder)
    except OSError as exc:
        raise explain(what, path, exc, "a test write in its folder") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    free = vfs.f_bavail * vfs.f_frsize
    if need_bytes and free < need_bytes:
        raise DurableIOError(f"{what} {path}: a save needs about {_mib(need_bytes)} and its folder has "
                             f"{_mib(free)} free (ENOSPC before any work); free space there or choose "
                             "a folder on another file system", OSError(errno.ENOSPC, "no space"), path)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class WriterLock:
    """``flock`` on ``lock_path`` for a writer's life; a second live writer is refused.

    The lock file holds ``pid N host H`` for the message.  It is opened with ``O_NOFOLLOW``
    (a planted link is refused) and removed at release, while still locked; an acquirer
    checks that the file it locked is still the one at the path (else it retries), so the
    removal cannot let two writers in.  Rejected: leaving lock files behind (a finished
    search or fit is expected to leave nothing but its result)."""

    def __init__(self, lock_path: str, what: str, owner: str):
        self.path, self.what, self.owner = lock_path, what, owner
        self.fd: int | None = None

    def acquire(self, error=CheckpointInUse) -> WriterLock:
        for _ in range(20):
            fd = self._open()
            try:
                self._flock(fd, error)
                # the holder before us may have removed the file at release: a lock on an
                # unlinked inode guards nothing, so it must still be the file at the path
                if _same_file(fd, self.path):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode(), 0)
                    self.fd = fd
                    return self
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise error(f"{self.owner}: its lock file {self.path} keeps being replaced; is another "
                    "driver starting and stopping on it?")

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise DurableIOError(f"{self.what} lock {self.path} is a symbolic link; remove it "
                                     "(shoal never writes through a link)", exc, self.path) from None
            raise explain(f"{self.what} lock", self.path, exc, "opening it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise DurableIOError(f"{self.what} lock {self.path} is not a regular file; remove it",
                                 None, self.path)
        return fd

    def _flock(self, fd: int, error) -> None:
        for attempt in range(5):  # a reader probing the lock holds it for microseconds
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if attempt == 4:
                    raise error(f"{self.owner} is in use by another live driver "
                                f"({self.holder(fd)}); wait for it to end, stop it (kill that "
                                "pid), or give this run its own path") from None
                time.sleep(0.02)

    @staticmethod
    def holder(fd: int) -> str:
        try:
            text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        except OSError:
            text = ""
        return text or "pid unknown"

    def release(self) -> None:
        """Remove the lock file (while still holding it: see ``acquire``) and drop the lock."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                if _same_file(self.fd, self.path):
                    os.unlink(self.path)
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


# -- the checked container -------------------------------------------------------------------
def pack(kind: str, belongs: dict, body) -> list:
    """The pieces of a checked file: magic, header length, JSON header, body.  ``belongs``
    (JSON) says what run the file is of; the header carries the body's length and SHA-256."""
    view = memoryview(body).cast("B")
    header = json.dumps({"format": FORMAT, "kind": kind, "belongs": belongs, "body_bytes": len(view),
                         "body_sha256": hashlib.sha256(view).hexdigest()},
                        sort_keys=True, allow_nan=False).encode()
    return [MAGIC, len(header).to_bytes(8, "little"), header, view]


def unpack(blob: bytes, path: str, kind: str, what: str) -> tuple[dict, memoryview]:
    """(belongs, body) of a checked file, after its header and checksum are verified; a
    ``CheckpointError`` naming ``path`` for anything else (nothing of the body is decoded)."""
    def bad(reason: str) -> CheckpointError:
        return CheckpointError(f"{what} {path} cannot be read ({reason}); it is damaged or not a "
                               "shoal checkpoint: restore it, or remove it to start afresh")

    view = memoryview(blob)
    n = len(MAGIC)
    if bytes(view[:n]) != MAGIC:
        raise bad("no shoal checkpoint header: written by an older shoal or by something else")
    if len(view) < n + 8:
        raise bad("truncated header")
    size = int.from_bytes(view[n:n + 8], "little")
    if size > HEADER_MAX or len(view) < n + 8 + size:
        raise bad(f"a header of {size} bytes in a file of {len(view)}")
    try:
        header = json.loads(bytes(view[n + 8:n + 8 + size]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"header is not JSON: {exc}") from None
    if not (isinstance(header, dict) and isinstance(header.get("belongs"), dict)
            and type(header.get("body_bytes")) is int and isinstance(header.get("body_sha256"), str)):
        raise bad("header fields missing or of the wrong type")
    if header.get("format") != FORMAT:
        raise bad(f"format {header.get('format')!r}, this shoal reads format {FORMAT}")
    if header.get("kind") != kind:
        raise bad(f"a {header.get('kind')!r} file, not a {kind!r} one")
    body = view[n + 8 + size:]
    if len(body) != header["body_bytes"]:
        raise bad(f"body of {len(body)} bytes, the header says {header['body_bytes']} (truncated?)")
    if hashlib.sha256(body).hexdigest() != header["body_sha256"]:
        raise bad("the body's checksum does not match its header")
    return header["belongs"], body
