"""The durable journal: one SQLite database (WAL mode) holding every task's state.

Driver-only (one connection, one thread).  Write-ahead rule: the engine
records a state change and ``commit()``s it *before* acting on it — a task is
journaled RUNNING before its process is spawned or its function submitted,
DONE before any successor may start.  Writes are grouped: one scheduling pass
journals all the tasks it is about to start in one transaction, and one
reaping pass all the tasks that ended, so the cost is two commits per batch,
not per task.  DONE rows wait in memory until the next statement on the journal (the
pass's commit, or any read or other write, which sees them first) and then go to SQLite in one
``executemany``: one statement for the whole reap cycle instead of one per task, with nothing
reordered (the rows are flushed before anything else touches the database) and each task's
DONE written exactly once.

Resume: rows in a terminal state (DONE, FAILED, SKIPPED, CANCELED) are kept
and their tasks are not run again; rows left RUNNING by a killed driver are
turned back to PENDING (their processes, if still alive — pid and start time
both match, and the process carries the task's SHOAL_TASK and SHOAL_SANDBOX —
are killed first) and run again.  Tasks never journaled are
simply pending.  Function results are stored in a data format (values.py:
msgpack, never code) so ``when=`` and stage ``post_exec`` callbacks see the
same values after a resume; pickle is an explicit opt-in (a trust boundary).
``retry_failed`` also turns FAILED, CANCELED and dependency-SKIPPED rows back
to PENDING with their attempts reset.

One driver at a time: the journal's lock file ``<journal>.lock`` is held with
``flock`` for the driver's life (the kernel drops it when the driver dies, even
by SIGKILL), and a second driver is refused with the first one's pid and host.
The journal also records the driver's pid, host and start time (``meta``), so
``shoal status`` can tell a live run from one whose driver died.

Identity: the meta table holds the workflow's plan and identity hash and each
row the task's spec (identity.py); a resume with another workflow is refused.

Errors: every SQLite or filesystem error becomes a ``JournalError`` (an
``EnsembleError``, so ``shoal`` exits 2) naming the journal and the cause:
a directory given as journal, a file that is not a journal, a read-only
directory, a full disk.

Durability: ``synchronous=NORMAL`` in WAL mode survives the driver being
killed (SIGKILL, OOM) at any instant — committed transactions are in the OS
page cache — but the last commits may be lost on power failure; pass
``durability="full"`` to fsync every commit.

Rejected alternatives: an append-only JSON log (resume would scan it all;
SQLite answers "state of uid X" with an index lookup and lets ``shoal status``
read while a run writes); a row per state change (the current row per task is
enough to resume, and keeps a million-task journal to a million rows).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sqlite3
import stat
import time
from collections.abc import Iterator

from .model import EnsembleError, Failure, FailureKind, TaskState
from .usage import COLUMNS as USAGE_COLUMNS
from .usage import NONE, Usage
from .values import Values, decode, encode

SCHEMA_VERSION = "3"
SQLITE_MAGIC = b"SQLite format 3\x00"

# what an attempt used (usage.py), in tasks (the latest attempt) and failed_attempts (each
# failed one); schema 3 added them: ``Journal._migrate`` adds them to a schema-2 journal
_USAGE_DDL = ", ".join(f"{name} {kind}" for name, kind in USAGE_COLUMNS)
_USAGE_SET = ", ".join(f"{name}=?" for name, _ in USAGE_COLUMNS)
_USAGE_NAMES = ", ".join(name for name, _ in USAGE_COLUMNS)
_USAGE_CLEAR = ", ".join(f"{name}=NULL" for name, _ in USAGE_COLUMNS)  # a new attempt starts

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS tasks (
    uid TEXT PRIMARY KEY, pipeline TEXT, stage TEXT, kind TEXT, state TEXT NOT NULL,
    attempt INTEGER DEFAULT 0, pid INTEGER, pid_start REAL, sandbox TEXT,
    started REAL, finished REAL, exit_code INTEGER, failure TEXT, reason TEXT,
    stderr_tail TEXT, result BLOB, outputs TEXT, session INTEGER, spec TEXT, {_USAGE_DDL});
CREATE TABLE IF NOT EXISTS stages (uid TEXT PRIMARY KEY, pipeline TEXT, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS failed_attempts (
    uid TEXT, attempt INTEGER, started REAL, finished REAL, failure TEXT, exit_code INTEGER,
    reason TEXT, {_USAGE_DDL}, PRIMARY KEY (uid, attempt));
CREATE TABLE IF NOT EXISTS task_keys (
    uid TEXT PRIMARY KEY, key TEXT NOT NULL, parts TEXT, outputs TEXT, reused TEXT, why TEXT);
CREATE TABLE IF NOT EXISTS file_digests (
    path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, ino INTEGER, digest TEXT);
"""
MIGRATES_FROM = ("2",)  # older schemas this shoal brings up to SCHEMA_VERSION in place


class JournalError(EnsembleError):
    """The journal file cannot be used (not a journal, unreadable, read-only, disk full, locked)."""


def _explain(path: str, exc: BaseException) -> JournalError:
    text = str(exc)
    low = text.lower()
    if "disk is full" in low or "disk i/o" in low or getattr(exc, "errno", None) in (errno.ENOSPC, errno.EFBIG):
        hint = "the disk (or the file size limit) is full; free space and resume the run"
    elif "readonly" in low or "read-only" in low or getattr(exc, "errno", None) in (errno.EROFS, errno.EACCES):
        hint = "it cannot be written (read-only file, directory or filesystem); pick a writable --journal path"
    elif "not a database" in low or "malformed" in low:
        hint = "the file is not a shoal journal (not SQLite, or damaged)"
    elif "unable to open" in low:
        hint = "it cannot be opened (a directory? a missing or read-only parent directory?)"
    else:
        hint = "check the file and the filesystem"
    return JournalError(f"journal {path}: {text}: {hint}")


class _Conn:
    """An SQLite connection whose errors are ``JournalError``s naming the journal."""

    def __init__(self, path: str, target: str, **kw):
        self.path = path
        try:
            self.db = sqlite3.connect(target, **kw)
        except sqlite3.Error as exc:
            raise _explain(path, exc) from None

    def execute(self, sql: str, params=()):
        try:
            return self.db.execute(sql, params)
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None

    def executemany(self, sql: str, rows):
        try:
            return self.db.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None

    def executescript(self, sql: str):
        try:
            return self.db.executescript(sql)
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()


def check_journal_file(path: str) -> None:
    """Refuse what is clearly not a journal before SQLite sees it (a directory, a YAML file)."""
    if os.path.isdir(path):
        raise JournalError(f"journal {path} is a directory; give a file path such as {path.rstrip('/')}/run.db")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _explain(path, exc) from None
    if not stat.S_ISREG(mode):  # a FIFO or a device: open() would block or read forever
        raise JournalError(f"journal {path} is not a regular file (a FIFO or a device); give a file path such as run.db")
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _explain(path, exc) from None
    if head and head != SQLITE_MAGIC:
        raise JournalError(f"{path} is not a shoal journal (not an SQLite file: it starts with {head[:12]!r}); "
                           "did you pass the workflow file instead of the journal?")


class DriverLock:
    """``flock`` on ``<journal>.lock`` for the driver's life; refuses a second live driver.

    Called once (``acquire``), released by ``release`` or the driver's death."""

    def __init__(self, journal_path: str):
        self.path = journal_path + ".lock"
        self.fd: int | None = None

    def acquire(self) -> None:
        try:
            # O_NOFOLLOW: a link planted at the lock's name is refused, never written through
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise JournalError(f"journal lock {self.path} is a symbolic link; remove it (shoal "
                                   "never writes through a link)") from None
            raise _explain(self.path, exc) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise JournalError(f"journal lock {self.path} is not a regular file; remove it")
        for attempt in range(5):  # a `shoal status` probing the lock holds it for microseconds
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 4:
                    holder = self.holder(fd)
                    os.close(fd)
                    raise JournalError(
                        f"journal {self.path[:-5]} is in use by another live driver ({holder}); "
                        "wait for it to end, stop it (kill that pid), or use another --journal") from None
                time.sleep(0.02)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode(), 0)
        self.fd = fd

    @staticmethod
    def holder(fd: int) -> str:
        try:
            text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        except OSError:
            text = ""
        return text or "pid unknown"

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def archive(path: str, sandbox: str | None) -> str | None:
    """Move a finished journal (and its sandbox root) aside as ``<stem>.<time>.db``; return the new path."""
    if not (os.path.exists(path) and os.path.getsize(path) > 0):
        return None
    stem, ext = os.path.splitext(path)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(path)))
    n, new = 0, f"{stem}.{stamp}{ext or '.db'}"
    while os.path.exists(new):
        n += 1
        new = f"{stem}.{stamp}-{n}{ext or '.db'}"
    try:
        os.rename(path, new)
        for suffix in ("-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.rename(path + suffix, new + suffix)
        if sandbox and os.path.isdir(sandbox):
            os.rename(sandbox, os.path.splitext(new)[0] + ".sandbox")
    except OSError as exc:
        raise _explain(path, exc) from None
    return new


class Journal:
    """The run's SQLite journal; driver thread only."""

    def __init__(self, path: str, *, resume: bool = False, durability: str = "normal",
                 values: Values = Values.DATA, lock: bool = True, new: bool = False,
                 sandbox: str | None = None):
        self.path = os.path.abspath(path)
        self.given = path  # as the user named it, for messages
        self.values = values
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise JournalError(f"journal {path!r}: directory {parent} does not exist; create it first")
        check_journal_file(self.path)
        self._db: _Conn | None = None
        self._done: list[tuple] = []  # DONE rows not yet given to SQLite: see ``db``
        self.lock = DriverLock(self.path)
        if lock:
            self.lock.acquire()
        try:
            self.archived = archive(self.path, sandbox) if new and not resume else None
            self._open(path, resume, durability)
        except BaseException:
            self.lock.release()
            raise
        self._in_tx = False

    def _open(self, path: str, resume: bool, durability: str) -> None:
        existed = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        self.db = _Conn(self.path, self.path, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            sync = {"normal": "NORMAL", "full": "FULL", "off": "OFF"}.get(durability)
            if sync is None:
                raise EnsembleError(f"durability={durability!r}: choose 'normal', 'full' or 'off'")
            self.db.execute(f"PRAGMA synchronous={sync}")
            if existed:
                version = self._meta_or_none("schema")
                if version not in (None, SCHEMA_VERSION, *MIGRATES_FROM):
                    raise JournalError(f"journal {path}: schema {version}, this shoal writes {SCHEMA_VERSION}; "
                                       "finish it with the shoal that wrote it, or start afresh with --new")
            self.db.executescript(_SCHEMA)
            if existed:
                has_rows = self.db.execute("SELECT 1 FROM tasks LIMIT 1").fetchone() is not None
                if has_rows and not resume:
                    raise JournalError(
                        f"journal {path} already holds a run; pass resume=True (shoal run --resume) "
                        "to finish it, new=True (shoal run --new) to start a fresh run (the old journal "
                        "is kept under a dated name), or use another journal path"
                    )
                stored = self._meta("values")
                if stored == Values.PICKLE.value and self.values is not Values.PICKLE:
                    raise JournalError(
                        f"journal {path} stores results with pickle; resuming reads them, which runs code "
                        "the journal's author chose: pass values='pickle' (shoal run --pickle-values) "
                        "only if you trust this file")
            self.session = self._count(self._meta("sessions"), "meta sessions") + 1
            self.db.execute("BEGIN")
            self._migrate()
            self._set_meta("schema", SCHEMA_VERSION)
            self._set_meta("sessions", str(self.session))
            self._set_meta("values", self.values.value)
            self._set_meta(f"session.{self.session}.started", repr(time.time()))
            self._set_meta("driver", json.dumps(driver_record()))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.close()
            raise

    def _migrate(self) -> None:
        """Schema 2 -> 3: add the usage columns a schema-2 journal lacks (``ALTER TABLE ADD
        COLUMN``, in the session's opening transaction: all or nothing).  Old rows keep NULL
        there: nothing was measured then."""
        for table in ("tasks", "failed_attempts"):
            have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            for name, kind in USAGE_COLUMNS:
                if name not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    @property
    def db(self) -> _Conn | None:
        """The connection, with every pending DONE row written first: whatever runs next on it
        (a read, another write, the commit) sees them, in the order ``done`` was called."""
        if self._done:
            rows, self._done = self._done, []
            self._db.executemany(
                f"UPDATE tasks SET state='{TaskState.DONE.value}', finished=?, result=?, exit_code=?, "
                f"outputs=?, failure=NULL, reason=NULL, pid=NULL, {_USAGE_SET} WHERE uid=?", rows)
        return self._db

    @db.setter
    def db(self, conn: _Conn | None) -> None:
        self._db = conn

    def _meta_or_none(self, key: str) -> str | None:
        try:
            return self._meta(key)
        except JournalError:
            return None  # no meta table yet

    # -- plumbing ---------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # -- reading values shoal wrote (the journal is a trust boundary) ------------------
    # A journal is a file anyone may have written: every value a resume acts on is checked
    # here, and one shoal never writes is a JournalError ("damaged", exit status 2 on the
    # command line), never a ValueError/TypeError traceback from deep in the engine.
    def damaged(self, what: str) -> JournalError:
        return JournalError(f"journal {self.given} is damaged or was not written by shoal ({what})")

    def _state(self, value, uid) -> TaskState:
        try:
            return TaskState(value)
        except ValueError:
            raise self.damaged(f"{uid}: state {str(value)[:60]!r}") from None

    def _count(self, value, what: str) -> int:
        """A count shoal writes (attempts, sessions): an int >= 0; NULL is 0."""
        if value is None:
            return 0
        if isinstance(value, str) and value.isascii() and value.isdigit():
            value = int(value)  # meta values are TEXT
        if type(value) is not int or value < 0:
            raise self.damaged(f"{what}: {str(value)[:60]!r} is not a count")
        return value

    def _tx(self) -> None:
        if not self._in_tx:
            self.db.execute("BEGIN")
            self._in_tx = True

    def commit(self) -> None:
        """Make every change since the last commit durable; the engine acts only after this."""
        if self._in_tx:
            self.db.execute("COMMIT")
            self._in_tx = False

    def close(self, ended: bool = True) -> None:
        """Commit, mark the driver gone, checkpoint, close and drop the lock (idempotent)."""
        if self.db is None:
            return
        try:
            self.commit()
            if ended:
                self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                (f"session.{self.session}.ended", repr(time.time())))
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except (JournalError, sqlite3.Error):
            pass
        self.db.close()
        self.db = None
        self.lock.release()

    def set_meta(self, key: str, value: str) -> None:
        self._tx()
        self._set_meta(key, value)

    def meta(self, key: str) -> str | None:
        return self._meta(key)

    # -- reads ------------------------------------------------------------------------
    def state(self, uid: str) -> TaskState | None:
        row = self.db.execute("SELECT state FROM tasks WHERE uid=?", (uid,)).fetchone()
        return self._state(row[0], uid) if row else None

    def attempt(self, uid: str) -> int:
        row = self.db.execute("SELECT attempt FROM tasks WHERE uid=?", (uid,)).fetchone()
        return self._count(row[0], f"{uid}: attempt") if row else 0

    def result(self, uid: str):
        row = self.db.execute("SELECT state, result, exit_code, kind FROM tasks WHERE uid=?", (uid,)).fetchone()
        if row is None:
            raise KeyError(uid)
        state, blob, exit_code, kind = row
        if kind == "executable":
            return exit_code
        return decode(blob, self.values, uid)

    def row(self, uid: str) -> dict | None:
        cur = self.db.execute("SELECT * FROM tasks WHERE uid=?", (uid,))
        row = cur.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in cur.description], row, strict=True))

    def stage_state(self, uid: str) -> TaskState | None:
        row = self.db.execute("SELECT state FROM stages WHERE uid=?", (uid,)).fetchone()
        return self._state(row[0], uid) if row else None

    def counts(self) -> dict[TaskState, int]:
        rows = self.db.execute("SELECT state, count(*) FROM tasks GROUP BY state")
        return {self._state(s, "a task"): n for s, n in rows}

    def stage_counts(self) -> dict[str, dict[TaskState, int]]:
        out: dict[str, dict[TaskState, int]] = {}
        for stage, state, n in self.db.execute(
            "SELECT stage, state, count(*) FROM tasks GROUP BY stage, state ORDER BY min(rowid)"
        ):
            out.setdefault(str(stage), {})[self._state(state, f"a task of stage {stage}")] = n
        return out

    def failures(self, limit: int | None = None) -> Iterator[dict]:
        sql = ("SELECT uid, failure, exit_code, reason, stderr_tail, attempt FROM tasks "
               "WHERE state=? ORDER BY finished")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        for uid, kind, code, reason, tail, attempt in self.db.execute(sql, (TaskState.FAILED.value,)):
            try:
                kind = FailureKind(kind) if kind else None
            except ValueError:
                raise self.damaged(f"{uid}: failure kind {str(kind)[:60]!r}") from None
            yield {"uid": uid, "kind": kind, "exit_code": code, "reason": reason,
                   "stderr_tail": tail or "", "attempts": attempt}

    def outputs(self) -> dict[str, list[str]]:
        out = {}
        for uid, text in self.db.execute("SELECT uid, outputs FROM tasks WHERE outputs IS NOT NULL"):
            out[uid] = [p for p in str(text).split("\n") if p]
        return out

    def timings(self) -> tuple[float | None, float | None]:
        return self.db.execute("SELECT min(started), max(finished) FROM tasks").fetchone()

    # -- writes (each inside the current transaction; commit() publishes) -------------
    def running(self, uid: str, pipeline: str, stage: str, kind: str, attempt: int,
                sandbox: str | None, now: float, spec: str | None = None) -> None:
        self._tx()
        self.db.execute(
            "INSERT INTO tasks (uid, pipeline, stage, kind, state, attempt, sandbox, started, session, spec) "
            "VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(uid) DO UPDATE SET state=excluded.state, "
            "attempt=excluded.attempt, sandbox=excluded.sandbox, started=excluded.started, "
            "session=excluded.session, pid=NULL, pid_start=NULL, spec=coalesce(tasks.spec, excluded.spec), "
            f"{_USAGE_CLEAR}",
            (uid, pipeline, stage, kind, TaskState.RUNNING.value, attempt, sandbox, now, self.session, spec),
        )

    def running_many(self, rows) -> None:
        """``running`` for many tasks in one statement: rows of (uid, pipeline, stage, kind, attempt,
        sandbox, now, spec)."""
        self._tx()
        self.db.executemany(
            "INSERT INTO tasks (uid, pipeline, stage, kind, state, attempt, sandbox, started, session, spec) "
            f"VALUES (?,?,?,?,'{TaskState.RUNNING.value}',?,?,?,{int(self.session)},?) ON CONFLICT(uid) "
            "DO UPDATE SET state=excluded.state, attempt=excluded.attempt, sandbox=excluded.sandbox, "
            "started=excluded.started, session=excluded.session, pid=NULL, pid_start=NULL, "
            f"spec=coalesce(tasks.spec, excluded.spec), {_USAGE_CLEAR}", rows)

    def pid(self, uid: str, pid: int, start: float) -> None:
        self._tx()
        self.db.execute("UPDATE tasks SET pid=?, pid_start=? WHERE uid=?", (pid, start, uid))

    def done(self, uid: str, now: float, *, result=None, exit_code: int | None = None,
             outputs: list[str] | None = None, usage: Usage = NONE) -> None:
        """Record ``uid`` DONE (once per task; the caller commits) with what it used.  The row is
        written with the other DONE rows of the pass, before the next statement on the journal
        (``db``)."""
        self._tx()
        self._done.append((now, encode(result, self.values), exit_code, "\n".join(outputs) if outputs else None,
                           *usage.row(), uid))

    def failed(self, uid: str, failure: Failure, now: float, *, final: bool, usage: Usage = NONE) -> None:
        """Record a failed attempt: FAILED if ``final``, else back to PENDING for a retry.
        Each failed attempt also keeps a row in ``failed_attempts`` (its start, end, why and
        what it used): the task's own row holds only its latest attempt, so this is where the
        spacing of retries (``retry_delay``) can be read."""
        self._tx()
        marks = ", ".join("?" * len(USAGE_COLUMNS))
        self.db.execute(
            "INSERT OR REPLACE INTO failed_attempts (uid, attempt, started, finished, failure, exit_code, "
            f"reason, {_USAGE_NAMES}) SELECT uid, attempt, started, ?, ?, ?, ?, {marks} FROM tasks WHERE uid=?",
            (now, failure.kind.value, failure.exit_code, failure.message, *usage.row(), uid))
        state = TaskState.FAILED if final else TaskState.PENDING
        self.db.execute(
            "UPDATE tasks SET state=?, finished=?, failure=?, exit_code=?, reason=?, stderr_tail=?, "
            f"pid=NULL, {_USAGE_SET} WHERE uid=?",
            (state.value, now, failure.kind.value, failure.exit_code, failure.message,
             failure.stderr_tail, *usage.row(), uid),
        )

    def settled(self, uid: str, pipeline: str, stage: str, kind: str, state: TaskState,
                reason: str, now: float, spec: str | None = None) -> None:
        """A task that never ran: SKIPPED (when=/dependency) or CANCELED."""
        self._tx()
        self.db.execute(
            "INSERT INTO tasks (uid, pipeline, stage, kind, state, reason, finished, session, spec) "
            "VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(uid) DO UPDATE SET state=excluded.state, "
            "reason=excluded.reason, finished=excluded.finished, spec=coalesce(tasks.spec, excluded.spec)",
            (uid, pipeline, stage, kind, state.value, reason, now, self.session, spec),
        )

    def record_key(self, uid: str, key: str, parts: str, outputs: str, reused: str | None,
                   why: str | None) -> None:
        """A DONE task's key (reuse.py): its parts, its outputs' digests, where it was reused from
        (None: it ran) and why it ran."""
        self._tx()
        self.db.execute("INSERT OR REPLACE INTO task_keys VALUES (?,?,?,?,?,?)",
                        (uid, key, parts, outputs, reused, why))

    def file_digests(self, entries: dict) -> None:
        """The stat pre-check's entries (shoal/_taskkey.py): path -> (size, mtime_ns, inode, digest)."""
        self._tx()
        self.db.executemany("INSERT OR REPLACE INTO file_digests VALUES (?,?,?,?,?)",
                            [(p, *e) for p, e in entries.items()])

    def replay_row(self, uid: str) -> tuple[TaskState, int, str | None] | None:
        """(state, attempt, spec) of ``uid`` for a resume's replay; None if never journaled."""
        row = self.db.execute("SELECT state, attempt, spec FROM tasks WHERE uid=?", (uid,)).fetchone()
        if row is None:
            return None
        if row[2] is not None and not isinstance(row[2], str):
            raise self.damaged(f"{uid}: spec {str(row[2])[:60]!r}")
        return self._state(row[0], uid), self._count(row[1], f"{uid}: attempt"), row[2]

    def plan(self) -> tuple[list | None, str | None]:
        """(plan, identity) as ``identity.plan_of`` made them (a list of {"uid", "stages":
        [{"uid", "tasks"}]}); JournalError if the journal holds anything else."""
        text, identity = self._meta("plan"), self._meta("identity")
        if identity is not None and not isinstance(identity, str):
            raise self.damaged(f"meta identity {str(identity)[:60]!r}")
        if not text:
            return None, identity
        try:
            plan = json.loads(text)
            ok = isinstance(plan, list) and all(
                isinstance(p, dict) and isinstance(p.get("uid"), str) and isinstance(p.get("stages"), list)
                and all(isinstance(st, dict) and isinstance(st.get("uid"), str)
                        and (st.get("tasks") is None or type(st.get("tasks")) is int) for st in p["stages"])
                for p in plan)
        except (ValueError, TypeError, RecursionError):
            ok = False
        if not ok:
            raise self.damaged(f"meta plan {str(text)[:60]!r}")
        return plan, identity

    def set_plan(self, plan: list | None, identity: str | None) -> None:
        self._tx()
        self._set_meta("plan", json.dumps(plan, separators=(",", ":")) if plan is not None else "")
        if identity is not None:
            self._set_meta("identity", identity)

    def unstart(self, uid: str) -> None:
        """A RUNNING task stopped by the walltime: PENDING again, so resume runs it."""
        self._tx()
        self.db.execute("UPDATE tasks SET state=?, pid=NULL WHERE uid=?", (TaskState.PENDING.value, uid))

    def stage(self, uid: str, pipeline: str, state: TaskState) -> None:
        self._tx()
        self.db.execute("INSERT OR REPLACE INTO stages VALUES (?,?,?)", (uid, pipeline, state.value))

    def take_over(self, retry_failed: bool = False) -> list[tuple[str, int, float]]:
        """On resume: RUNNING rows -> PENDING; returns (uid, pid, pid_start) of those with a pid,
        as the journal holds them (unchecked: ``launcher.kill_leftover`` trusts none of them).

        ``retry_failed``: FAILED, CANCELED and dependency-SKIPPED rows -> PENDING with their
        attempts reset (so they get their retries again), and the failed/skipped stage and
        pipeline rows are forgotten (the replay writes them again)."""
        self._tx()
        rows = self.db.execute(
            "SELECT uid, pid, pid_start FROM tasks WHERE state=?", (TaskState.RUNNING.value,)
        ).fetchall()
        self.db.execute("UPDATE tasks SET state=? WHERE state=?",
                        (TaskState.PENDING.value, TaskState.RUNNING.value))
        if retry_failed:
            self.db.execute(
                "UPDATE tasks SET state=?, attempt=0 WHERE state IN (?, ?) OR (state=? AND reason LIKE ?)",
                (TaskState.PENDING.value, TaskState.FAILED.value, TaskState.CANCELED.value,
                 TaskState.SKIPPED.value, "dependency %"))
            self.db.execute("DELETE FROM stages WHERE state IN (?, ?, ?)",
                            (TaskState.FAILED.value, TaskState.CANCELED.value, TaskState.SKIPPED.value))
        self.commit()
        return [(u, p, s) for u, p, s in rows if p]


def driver_record() -> dict:
    """This process as the journal's driver: pid, host and process start time (for liveness)."""
    try:
        import psutil

        start = psutil.Process().create_time()
    except Exception:  # pragma: no cover
        start = None
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": start, "since": time.time()}


def open_readonly(path: str) -> _Conn:
    """A read-only connection (``shoal status`` while a run writes); JournalError if not a journal."""
    if not os.path.exists(path):
        raise JournalError(f"no journal at {path}; run a workflow with journal={path!r} first")
    check_journal_file(path)
    conn = _Conn(path, f"file:{os.path.abspath(path)}?mode=ro", uri=True, timeout=5)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except JournalError:
        conn.close()
        raise
    if not {"meta", "tasks", "stages"} <= tables:
        conn.close()
        raise JournalError(f"{path} is an SQLite file but not a shoal journal (tables: {sorted(tables)})")
    return conn
