"""Reusing results across runs: a task whose key matches a finished one is not run again.

A task's **key** (``task_key``) is a SHA-256 over four parts, each kept apart so a miss can say
which one changed (``Reason``):

* ``code``: an executable's resolved path and its file's content digest, with its
  ``pre_exec``/``post_exec`` lines; a function's code by value (shoal/_taskkey.py: its code
  object, defaults, closure, and the code of the user's module-level functions it names);
* ``arguments``: an executable's arguments (as written, references unresolved), stdin, declared
  outputs and ``stage_out``; a function's args and kwargs as data (a ``Task`` among them by
  that task's key in this run);
* ``environment``: the entries of ``environment=`` the task names;
* ``inputs``: the content digest of each declared input (``inputs=``; a folder by its tree),
  and of each file an argument references (``$p.s.t/file``) — upstream outputs count by what
  they hold, so a stage-2 task that re-ran and wrote the same bytes leaves stage 3 reused.

Digests of files go through ``FileDigests``' stat pre-check (size, mtime_ns, inode), kept in
the journal's ``file_digests`` table from run to run.

Where finished keys are found (``Store``): the journal of the previous run (``--reuse``: the
journal is started afresh and the old one kept under its dated name, as ``--new`` does; its
``task_keys`` rows and its sandbox are read), and a **cache folder** (``--cache DIR``), shared
between runs and journals: ``DIR/keys/<key>.entry`` (a checked container of shoal/_durable.py:
header with the key and the body's SHA-256, JSON body), ``DIR/objects/<digest>`` (each output's
bytes, by content), ``DIR/names/<hash of uid>`` (the last key of a task, for ``--explain``'s
reasons).  Entries are written atomically; on reading, a torn, tampered or foreign entry is a miss
with a warning, never a result.

A hit stages the recorded outputs (the declared ``outputs``, and the task's ``stdout`` and
``stderr`` files) back into the task's new sandbox, each copied from the old
sandbox (or the cache's object) and checked against its recorded digest while it is copied: an
output that was deleted or changed since makes the task run (``Reason.OUTPUT_GONE``), it is never
"reused" with other bytes.  A function's result comes back in the journal's data format
(values.py); a cached result stored with pickle is used only by a run that opted in
(``values="pickle"``).

Rejected alternatives: the resume's spec comparison (identity.py) as the key (it names a
function by ``module:qualname`` and input files by name: an edited helper or input file would be
"the same task"); mtime-only checks of inputs (a restored or re-downloaded file with an old mtime
would be missed; content digests with a stat pre-check cost the same on a warm run); copying the
previous run's whole sandbox (undeclared files are not part of any key).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import tempfile
import warnings

from ..._durable import CheckpointError, pack, read_file, unpack, write_atomic
from ..._taskkey import (
    CacheWarning,
    FileDigests,
    Unkeyable,
    data_bytes,
    function_digest,
    tree_digest,
)
from .launcher import LaunchError, inside
from .model import EMBEDDED_REF_RE, EnsembleError, Task, TaskKind, TaskState, parse_ref
from .values import Values, decode, encode, numpy_bytes

ENTRY_KIND = "task-result"


class Reason(enum.Enum):
    """Why a task runs (or that it is reused), as ``--explain`` prints it."""

    REUSED = "reused"
    NEW = "new"  # no finished task of this name (or key) in the journal or the cache
    ARGUMENTS = "changed argument"
    INPUTS = "changed input file"
    CODE = "changed code"
    ENVIRONMENT = "changed environment"
    UPSTREAM = "an input comes from a task that runs"
    OUTPUT_GONE = "a recorded output was deleted or changed"
    UNKEYABLE = "cannot be keyed"


PART_REASONS = (("code", Reason.CODE), ("arguments", Reason.ARGUMENTS),
                ("environment", Reason.ENVIRONMENT), ("inputs", Reason.INPUTS))


def _h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Keyed:
    """A task's key and its parts, or why it has none (``unkeyable``)."""

    __slots__ = ("key", "parts", "unkeyable", "upstream", "task")

    def __init__(self, parts: dict | None, unkeyable: str | None = None, upstream: str | None = None):
        self.parts, self.unkeyable, self.upstream = parts, unkeyable, upstream
        self.task = None  # the Task object keyed (an on_retry replacement is another task)
        self.key = _h(json.dumps(parts, sort_keys=True).encode()) if parts is not None else None


def task_key(task: Task, *, resolve, digests: FileDigests, upstream_key, cwd: str,
             upstream_digest=None, code_memo: dict | None = None) -> Keyed:
    """The key of ``task`` (module docstring).  ``resolve(text)``: a ``$p.s.t/file`` reference
    -> its path; ``upstream_key(uid)``: the key of a finished task of this run (None if unknown);
    ``upstream_digest(uid, rel)``: for ``--explain``, the recorded digest of an upstream output
    (None: look at the file).  ``code_memo``: ``id(function) -> (function, digest)``, so a run
    hashes each function (and the globals it names) once, when its first task is keyed."""
    try:
        parts: dict = {}
        if task.function is not None:
            known = code_memo.get(id(task.function)) if code_memo is not None else None
            if known is not None and known[0] is task.function:
                parts["code"] = known[1]
            else:
                parts["code"] = function_digest(task.function, numpy_bytes)
                if code_memo is not None:
                    code_memo[id(task.function)] = (task.function, parts["code"])
            args = [_arg(a, upstream_key) for a in task.args]
            kwargs = {k: _arg(v, upstream_key) for k, v in dict(task.kwargs).items()}
            parts["arguments"] = _h(data_bytes([args, kwargs], numpy_bytes))
        else:
            exe = task.executable
            path = _which(exe, os.environ.get("PATH"), code_memo) if "/" not in exe else os.path.join(cwd, exe)
            if not path or not os.path.isfile(path):
                return Keyed(None, f"executable {exe!r} not found")
            parts["code"] = _h(data_bytes([os.path.abspath(path), digests.digest(path),
                                           list(task.pre_exec), list(task.post_exec)]))
            parts["arguments"] = _h(data_bytes([[str(a) for a in task.arguments], task.stdin,
                                                list(task.outputs), [list(p) for p in task.stage_out]]))
        parts["environment"] = _h(data_bytes({str(k): str(v) for k, v in dict(task.environment).items()}))
        inputs = {}
        sources = [(i.target, i.source) for i in task.staged_inputs()]
        if task.function is None:
            for a in task.arguments:
                sources += [(m[0], m[0]) for m in EMBEDDED_REF_RE.finditer(str(a))]
        else:  # "$p.s.t/file" among a function's arguments: the path it is given, keyed by content
            sources += [(v, v) for v in _strings([*task.args, *dict(task.kwargs).values()])
                        if v.startswith("$") and parse_ref(v) is not None]
        for name, source in sources:
            ref = parse_ref(source)
            if ref is not None and upstream_digest is not None:
                known = upstream_digest(ref[0], ref[1])
                if known is None:
                    return Keyed(None, upstream=ref[0])
                inputs[name] = known
                continue
            path = resolve(source) if source.startswith("$") else os.path.join(cwd, source)
            try:
                inputs[name] = digests.digest(path)
            except OSError:
                return Keyed(None, f"input {source!r} is missing")
        parts["inputs"] = inputs
        return Keyed(parts)
    except Unkeyable as exc:
        return Keyed(None, str(exc))
    except OSError as exc:  # an executable or input that cannot be read: it runs, and says why
        return Keyed(None, f"{exc.filename or 'a file'} cannot be read: {exc.strerror or exc}")
    except RecursionError:
        return Keyed(None, "its code or arguments nest too deep to hash")
    except _Upstream as up:
        return Keyed(None, upstream=up.uid)
    except Exception as exc:  # noqa: BLE001 - user objects' attributes run user code: the task
        # runs, with the reason, rather than the run ending on a traceback
        return Keyed(None, f"hashing it raised {type(exc).__name__}: {exc}")


def _which(exe: str, path: str | None, memo: dict | None) -> str | None:
    """``shutil.which``, once per run (``memo``: the run's): not once per process, where a tool
    put earlier on ``PATH`` between two runs (a notebook, EnTK's sessions) would be keyed as
    the one it shadows while the new one runs."""
    if memo is None:
        return shutil.which(exe, path=path)
    key = ("which", exe, path)
    if key not in memo:
        memo[key] = shutil.which(exe, path=path)
    return memo[key]


class _Upstream(Exception):
    def __init__(self, uid: str):
        self.uid = uid


def _strings(values, depth: int = 0):
    for v in values:
        if isinstance(v, str):
            yield v
        elif isinstance(v, list | tuple) and depth < 20:
            yield from _strings(v, depth + 1)
        elif isinstance(v, dict) and depth < 20:
            yield from _strings(v.values(), depth + 1)


def _arg(value, upstream_key):
    if isinstance(value, Task):
        key = upstream_key(value.path_uid)
        if key is None:
            raise _Upstream(value.path_uid)
        return f"<task key {key}>"
    if isinstance(value, list | tuple):
        return type(value)(_arg(v, upstream_key) for v in value)
    if isinstance(value, dict):
        return {k: _arg(v, upstream_key) for k, v in value.items()}
    return value


def reasons(new: dict, old: dict | None) -> list[str]:
    """What differs between two keys' parts, in words (``changed input file data.txt``)."""
    if old is None:
        return [Reason.NEW.value]
    out = []
    for part, reason in PART_REASONS:
        if part == "inputs":
            a, b = old.get("inputs") or {}, new.get("inputs") or {}
            changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            if changed:
                out.append(f"{reason.value} {', '.join(changed)}")
        elif new.get(part) != old.get(part):
            out.append(reason.value)
    return out or [Reason.NEW.value]


# -- where finished keys are found -------------------------------------------------------------
class Record:
    """A finished task's key: what it gave (exit code or result blob) and its outputs' digests.
    ``fetch(rel, dest)`` copies one output to ``dest`` checking its digest (False if it cannot).
    ``folders``: the folders among (and inside) its outputs, an empty one too, made again when
    it is staged back (a later task's input ``$p.s.t/outdir`` must exist)."""

    __slots__ = ("uid", "key", "parts", "kind", "exit_code", "result", "outputs", "fetch", "where", "folders")

    def __init__(self, uid, key, parts, kind, exit_code, result, outputs, fetch, where, folders=()):
        self.uid, self.key, self.parts, self.kind = uid, key, parts, kind
        self.exit_code, self.result, self.outputs = exit_code, result, outputs
        self.fetch, self.where = fetch, where
        self.folders = tuple(folders)

    def digest_of(self, rel: str) -> str | None:
        """The recorded digest of output ``rel``: a file's, or a folder's tree (``tree_digest``)."""
        rel = os.path.normpath(rel) if rel else ""
        if rel in self.outputs:
            return self.outputs[rel]
        if rel not in self.folders:
            return None
        below = rel + os.sep
        return tree_digest({r[len(below):]: d for r, d in self.outputs.items() if r.startswith(below)},
                           [f[len(below):] for f in self.folders if f.startswith(below)])


def copy_checked(src: str, dest: str | None, digest: str, what: str, *, durable: bool = False,
                 errors: list | None = None) -> bool:
    """Copy the regular file ``src`` (never through a link) to ``dest`` atomically (a temporary
    file created ``O_EXCL`` beside it, then renamed over it), hashing while copying; False (and
    ``dest`` untouched) if it is gone, not a plain file or holds other bytes.  ``dest`` None: only
    check it.  ``durable``: fsync the file and its folder (cache objects, shared between runs);
    an output staged back into a sandbox is not, as a task's own outputs are not (fsyncing
    stdout and stderr, four fsyncs per reused task, dominated a run of small reused tasks).
    ``errors``: an I/O error while copying is appended to it (a full or read-only folder is not a
    changed file: the caller says so)."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    h = hashlib.sha256()

    class Mismatch(Exception):
        pass

    def chunks(f):
        while chunk := f.read(1 << 20):
            h.update(chunk)
            yield chunk
        if h.hexdigest() != digest:
            raise Mismatch

    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return False
            if dest is None:
                for _ in chunks(f):
                    pass
                return True
            folder = os.path.dirname(dest) or "."
            os.makedirs(folder, exist_ok=True)
            if durable:
                write_atomic(dest, chunks(f), what)
                return True
            out, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(dest)}.", suffix=".tmp")
            try:
                with os.fdopen(out, "wb") as w:
                    for chunk in chunks(f):
                        w.write(chunk)
                    os.fchmod(w.fileno(), stat.S_IMODE(st.st_mode) | 0o600)
                os.replace(tmp, dest)
                tmp = None
            finally:
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
    except Mismatch:
        return False
    except OSError as exc:
        if errors is not None:
            errors.append(exc)
        return False
    return True


class JournalStore:
    """The finished keys of an earlier run's journal (read-only) and its sandbox root."""

    def __init__(self, path: str, sandbox: str, values: Values):
        self.path, self.sandbox, self.values = path, sandbox, values
        self.by_key: dict[str, Record] = {}
        self.by_uid: dict[str, Record] = {}
        self.file_digests: dict = {}
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        except sqlite3.Error:
            return
        try:
            rows = conn.execute(
                "SELECT k.uid, k.key, k.parts, k.outputs, t.kind, t.exit_code, t.result FROM task_keys k "
                "JOIN tasks t ON t.uid = k.uid WHERE t.state = ?", (TaskState.DONE.value,)).fetchall()
            self.file_digests = {p: (s, m, i, d) for p, s, m, i, d in conn.execute(
                "SELECT path, size, mtime_ns, ino, digest FROM file_digests")}
        except sqlite3.Error:  # a journal of an older shoal, or not one: nothing to reuse
            rows = []
        finally:
            conn.close()
        for uid, key, parts, outputs, kind, code, result in rows:
            try:
                out = json.loads(outputs or "{}")
                rel_root = out.get("sandbox") or "."
                if os.path.isabs(rel_root) or ".." in rel_root.split(os.sep):
                    continue  # not one shoal wrote: nothing outside the old sandbox is read
                folder = os.path.join(self.sandbox, rel_root)
                rec = Record(uid, key, json.loads(parts), kind, code, result, dict(out.get("files") or {}),
                             functools.partial(self._fetch, folder), f"journal {os.path.basename(path)}",
                             [str(f) for f in out.get("folders") or ()])
            except (TypeError, ValueError, AttributeError):
                continue
            self.by_key[key] = rec
            self.by_uid[uid] = rec

    @staticmethod
    def _fetch(folder: str, rel: str, digest: str, dest: str) -> bool:
        if os.path.isabs(rel) or ".." in rel.split(os.sep):
            return False  # not one shoal wrote: nothing outside the old sandbox is read
        return copy_checked(os.path.join(folder, rel), dest, digest, "reused output")

    def find(self, key: str) -> Record | None:
        return self.by_key.get(key)

    def last(self, uid: str) -> Record | None:
        return self.by_uid.get(uid)


class CacheStore:
    """A cache folder shared between runs (module docstring has its layout)."""

    def __init__(self, root: str, *, create: bool = True):
        """``create=False`` (``--explain``, which writes nothing): a folder that is not there is
        an empty cache, not made."""
        self.root = os.path.abspath(root)
        for sub in ("keys", "objects", "names"):
            folder = os.path.join(self.root, sub)
            if os.path.islink(folder):
                raise EnsembleError(f"cache folder {folder} is a symbolic link; give the real path")
            if not create:
                continue
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise EnsembleError(f"cache folder {self.root}: cannot create {sub}/: {exc.strerror}") from None

    def _entry(self, key: str) -> str:
        return os.path.join(self.root, "keys", f"{key}.entry")

    def _object(self, digest: str) -> str:
        return os.path.join(self.root, "objects", digest)

    def _name(self, uid: str) -> str:
        return os.path.join(self.root, "names", _h(uid.encode())[:32])

    def find(self, key: str) -> Record | None:
        path = self._entry(key)
        try:
            blob = read_file(path, "cache entry")
            if blob is None:
                return None
            belongs, body = unpack(blob, path, ENTRY_KIND, "cache entry")
            if belongs.get("key") != key:
                raise CheckpointError(f"cache entry {path} belongs to key {belongs.get('key')!r}")
            d = json.loads(bytes(body))
            result = bytes.fromhex(d["result"]) if d.get("result") is not None else None
            return Record(d["uid"], key, d["parts"], d["kind"], d.get("exit_code"), result,
                          dict(d.get("outputs") or {}), self._fetch, f"cache {self.root}",
                          [str(f) for f in d.get("folders") or ()])
        except (OSError, CheckpointError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # AttributeError: a well-formed container whose body is not the object shoal writes
            warnings.warn(f"cache entry {path} is not used (a miss): {exc!r}", CacheWarning, stacklevel=2)
            return None

    def last(self, uid: str) -> Record | None:
        try:
            blob = read_file(self._name(uid), "cache name")
        except OSError:
            return None
        key = blob.decode("ascii", "replace").strip() if blob else ""
        return self.find(key) if len(key) == 64 and key.isalnum() else None

    def _fetch(self, rel: str, digest: str, dest: str) -> bool:
        return copy_checked(self._object(digest), dest, digest, "reused output")

    def put(self, rec: Record, files: dict[str, str]) -> None:
        """Store ``rec`` with its outputs (``rel -> path`` of the file to copy in)."""
        for rel, path in files.items():
            digest = rec.outputs[rel]
            obj = self._object(digest)
            # an object already there is checked, not trusted: a tampered or planted one (a link)
            # would otherwise make every later hit a miss, the cache never repaired
            failed: list = []
            if not copy_checked(obj, None, digest, "cache object") and \
                    not copy_checked(path, obj, digest, "cache object", durable=True, errors=failed):
                if failed:  # the folder is full or not writable: Reuse.record warns
                    raise failed[-1]
                return  # changed since it was hashed (a process still writing it): not cached
        body = json.dumps({"uid": rec.uid, "parts": rec.parts, "kind": rec.kind, "exit_code": rec.exit_code,
                           "result": rec.result.hex() if rec.result is not None else None,
                           "outputs": rec.outputs, "folders": list(rec.folders)}, sort_keys=True).encode()
        write_atomic(self._entry(rec.key), pack(ENTRY_KIND, {"key": rec.key}, body), "cache entry")
        write_atomic(self._name(rec.uid), [rec.key.encode()], "cache name")


class Reuse:
    """One run's reuse: keys its tasks as they are about to start, finds finished ones, restores
    them, records the keys of what finishes.  The engine calls ``match`` (before a task's first
    attempt is placed) and ``record`` (when a task is DONE)."""

    def __init__(self, journal, launcher, resolve, *, previous: bool, cache: str | None):
        self.journal, self.launcher, self.resolve = journal, launcher, resolve
        self.values = journal.values
        self.stores: list = []
        if previous and journal.archived:  # a resume of a reuse run reads the same old journal
            journal.set_meta("reuse_previous", journal.archived)
        old = journal.meta("reuse_previous") if previous else None
        if old and os.path.exists(old):
            self.stores.append(JournalStore(old, os.path.splitext(old)[0] + ".sandbox", self.values))
        if cache is not None:
            self.stores.append(CacheStore(cache))
        self.cache = next((s for s in self.stores if isinstance(s, CacheStore)), None)
        entries = {}
        for s in self.stores:
            entries.update(getattr(s, "file_digests", {}))
        self.digests = FileDigests(entries)
        self.keyed: dict[int, Keyed] = {}  # id(item) -> its key, taken before its first attempt
        self.keys: dict[str, str] = {}  # uid -> key of the tasks of this run that finished
        self.reused: dict[int, Record] = {}
        self.why: dict[str, list[str]] = {}  # uid -> why it ran (for the journal and tests)
        self.code_memo: dict = {}  # id(function) -> (function, digest): see task_key

    def match(self, item):
        """The recorded result of ``item`` (an executable: ``(0, output paths)``) if its key matches
        a finished task whose outputs could be staged back; else ``MISS``.  Keyed once, right
        before its first attempt could be placed (its dependencies are DONE, their outputs there):
        a task passed over for want of cores is not keyed again."""
        if id(item) in self.keyed:
            return MISS
        k = self.keyed[id(item)] = task_key(item.task, resolve=self.resolve, digests=self.digests,
                                            upstream_key=self.keys.get, cwd=self.launcher.cwd,
                                            code_memo=self.code_memo)
        k.task = item.task
        if k.key is None:
            self.why[item.uid] = [f"{Reason.UNKEYABLE.value}: {k.unkeyable or 'upstream ' + str(k.upstream)}"]
            return MISS
        gone = False
        for store in self.stores:
            rec = store.find(k.key)
            if rec is None:
                continue
            value = self._restore(item, rec)
            if value is not MISS:
                self.reused[id(item)] = rec
                return value
            gone = True
        if gone:
            self.why[item.uid] = [Reason.OUTPUT_GONE.value]
        else:
            old = next((r for r in (s.last(item.uid) for s in self.stores) if r is not None), None)
            self.why[item.uid] = reasons(k.parts, old.parts if old is not None else None)
        return MISS

    def _restore(self, item, rec: Record):
        t = item.task
        if t.kind is TaskKind.FUNCTION:
            if rec.kind != "function":
                return MISS
            try:
                return decode(rec.result, self.values, item.uid)
            except EnsembleError as exc:
                warnings.warn(f"{rec.where}: the result of {item.uid} is not used (a miss): {exc}",
                              CacheWarning, stacklevel=3)
                return MISS
        if rec.kind != "executable":
            return MISS
        sandbox = self.launcher.make_sandbox(item.uid)
        for rel in rec.folders:
            dest = _into(sandbox, rel) if _safe(rel, "0" * 64) else None
            if dest is None:
                warnings.warn(f"{rec.where}: the record of {item.uid} names folder {rel!r}, which is not "
                              "a folder inside a sandbox: not used (a miss)", CacheWarning, stacklevel=3)
                return MISS
            try:
                if os.path.islink(dest):  # left by an earlier attempt: it belongs to the sandbox
                    os.unlink(dest)
                os.makedirs(dest, exist_ok=True)
            except OSError:
                return MISS
        for rel, digest in rec.outputs.items():
            dest = _into(sandbox, rel) if _safe(rel, digest) else None
            if dest is None:
                warnings.warn(f"{rec.where}: the record of {item.uid} names output {rel!r}, which is not "
                              "a file inside a sandbox: not used (a miss)", CacheWarning, stacklevel=3)
                return MISS
            if not rec.fetch(rel, digest, dest):
                warnings.warn(f"{rec.where}: output {rel} of {item.uid} was deleted or changed: "
                              "the task runs again", CacheWarning, stacklevel=3)
                return MISS
        paths = [os.path.join(sandbox, name) for name in t.outputs]
        return (0, paths or None)

    def unmatch(self, item) -> None:
        """``item`` matched but runs after all (its stage_out failed): when it is DONE it is
        recorded as run, not as reused from the match."""
        self.reused.pop(id(item), None)

    def record(self, item, value) -> None:
        """``item`` is DONE (journaled in this pass): keep its key, outputs and result."""
        k = self.keyed.pop(id(item), None)
        rec_from = self.reused.pop(id(item), None)
        if k is None or k.key is None or k.task is not item.task:  # on_retry ran another task
            return
        self.keys[item.uid] = k.key
        t = item.task
        outputs, files, folders = {}, {}, []
        if t.kind is TaskKind.EXECUTABLE:
            sandbox = self.launcher.sandbox_of(item.uid)
            # the declared outputs, and stdout/stderr, which later tasks often read ($p.s.t/stdout)
            for name in (*t.outputs, t.stdout_file, t.stderr_file):
                folders += [os.path.relpath(f, sandbox) for f in _folders(os.path.join(sandbox, name))]
                for path in _files(os.path.join(sandbox, name)):
                    rel = os.path.relpath(path, sandbox)
                    try:
                        outputs[rel] = self.digests.digest(path)
                    except (OSError, Unkeyable) as exc:  # gone since, or not a plain file
                        warnings.warn(f"{item.uid}: output {rel} cannot be hashed ({exc}); the task "
                                      "is not kept for reuse", CacheWarning, stacklevel=2)
                        return
                    files[rel] = path
            result, code, kind = None, 0, "executable"
        else:
            result, code, kind = encode(value, self.values), None, "function"
        rel_root = os.path.relpath(self.launcher.sandbox_of(item.uid), self.launcher.root)
        self.journal.record_key(item.uid, k.key, json.dumps(k.parts, sort_keys=True),
                                json.dumps({"sandbox": rel_root, "files": outputs, "folders": folders},
                                           sort_keys=True),
                                rec_from.where if rec_from is not None else None,
                                "; ".join(self.why.get(item.uid, ())) or None)
        self.journal.file_digests(self.digests.take_dirty())
        if self.cache is not None and not (rec_from is not None and rec_from.where.startswith("cache")):
            try:
                self.cache.put(Record(item.uid, k.key, k.parts, kind, code, result, outputs, None, "",
                                      folders), files)
            except OSError as exc:
                warnings.warn(f"cache {self.cache.root}: {item.uid} not stored: {exc}", CacheWarning, stacklevel=2)


MISS = object()


def _safe(rel, digest) -> bool:
    """A recorded output shoal could have written: a relative path inside the sandbox, a hex digest."""
    return (isinstance(rel, str) and isinstance(digest, str) and len(digest) == 64
            and all(c in "0123456789abcdef" for c in digest) and not os.path.isabs(rel)
            and ".." not in rel.split(os.sep) and rel not in ("", "."))


def _into(sandbox: str, rel: str) -> str | None:
    """``sandbox/rel`` with the links among its parents removed (``launcher.inside``: an earlier
    attempt may have left ``outdir -> /elsewhere``, and staging back through it would write
    there); None if it still resolves outside the sandbox."""
    try:
        return inside(sandbox, rel.replace(os.sep, "/"))
    except (LaunchError, OSError):
        return None


def _folders(path: str):
    """A declared output that is a folder, and every folder inside it (an empty one too)."""
    if os.path.isdir(path) and not os.path.islink(path):
        yield path
        for folder, dirs, _files in os.walk(path):
            dirs.sort()
            yield from (os.path.join(folder, d) for d in dirs if not os.path.islink(os.path.join(folder, d)))


def _files(path: str):
    """The files of a declared output: regular files, or links to them (a pipe or a device in
    an output folder is skipped: reading it would block or never end)."""
    if os.path.isdir(path) and not os.path.islink(path):
        for folder, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if os.path.isfile(os.path.join(folder, name)):
                    yield os.path.join(folder, name)
    elif os.path.isfile(path):
        yield path


# -- --explain -----------------------------------------------------------------------------------
def explain(workflow, journal: str, cache: str | None = None, values="data") -> list[tuple[str, str]]:
    """``(task uid, verdict)`` for every listed task of ``workflow``, in order: ``reused (journal
    run.db)`` or ``runs: changed argument; changed input file data.txt``.  Runs nothing and
    writes nothing.  An input that an upstream task writes counts by that task's recorded output
    when the upstream is reused; when the upstream runs, so does the task (its input is not
    known yet).  Stages whose tasks are produced lazily are named as decided during the run."""
    from .identity import listed_keys
    from .model import as_pipelines

    pipelines = as_pipelines(workflow)
    if not isinstance(pipelines, list | tuple):
        raise EnsembleError("--explain needs a listed workflow (pipelines and stages as lists)")
    stores: list = []
    path = os.path.abspath(journal)
    if os.path.exists(path):
        stores.append(JournalStore(path, os.path.splitext(path)[0] + ".sandbox", Values.parse(values)))
    if cache is not None:
        stores.append(CacheStore(cache, create=False))
    digests = FileDigests({k: v for st in stores for k, v in getattr(st, "file_digests", {}).items()})
    found: dict[str, Record] = {}  # uid -> the record it is reused from
    memo: dict = {}
    out: list[tuple[str, str]] = []

    def upstream_digest(uid, rel):
        rec = found.get(uid)
        if rec is None:
            return None  # the upstream runs
        known = rec.digest_of(rel)
        if known is None:
            raise Unkeyable(f"${uid}/{rel} is not a declared output of {uid} (only declared outputs "
                            "are staged back)")
        return known

    def upstream_key(uid):
        rec = found.get(uid)
        return None if rec is None else rec.key

    for _puid, stages in listed_keys(pipelines):
        for suid, tasks in stages:
            if tasks is None:
                out.append((suid, "decided during the run (its tasks are not listed)"))
                continue
            for uid, t in tasks:
                if uid is None:
                    continue
                t.bind_path(uid)
                k = task_key(t, resolve=lambda text: text, digests=digests, upstream_key=upstream_key,
                             cwd=os.getcwd(), upstream_digest=upstream_digest, code_memo=memo)
                out.append((uid, _verdict(uid, t, k, stores, found)))
    return out


def _verdict(uid, task, k: Keyed, stores, found) -> str:
    if k.upstream is not None:
        return f"runs: {Reason.UPSTREAM.value} ({k.upstream})"
    if k.key is None:
        return f"runs: {Reason.UNKEYABLE.value} ({k.unkeyable})"
    gone = False
    for store in stores:
        rec = store.find(k.key)
        if rec is None:
            continue
        kind = "function" if task.function is not None else "executable"
        if rec.kind == kind and all(_safe(r, d) and rec.fetch(r, d, None) for r, d in rec.outputs.items()):
            found[uid] = rec
            return f"{Reason.REUSED.value} ({rec.where})"
        gone = True
    if gone:
        return f"runs: {Reason.OUTPUT_GONE.value}"
    old = next((r for r in (s.last(uid) for s in stores) if r is not None), None)
    return "runs: " + "; ".join(reasons(k.parts, old.parts if old is not None else None))
