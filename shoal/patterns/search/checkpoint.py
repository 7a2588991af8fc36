"""Checkpointed search frontiers: a search that survives the death of its driver.

``count``/``find``/``maximise``/``minimise`` with ``checkpoint="path"`` run as
driver-side *chunks* instead of one self-splitting task tree, because only the
driver can name, at any moment, every subtree that is not yet explored::

    driver: frontier = [units]  (a unit: (node, path), an unexplored subtree)
            keep <= 2 x workers chunk tasks in flight, each given some units
            chunk_task: depth-first over its units for ~CHUNK_S seconds;
                        returns (Tally of what it visited, the units it left)
            merge the Tally, push the left units on the frontier
            every ``interval`` s: write {Tally so far, frontier + in-flight units}
    on resume: the same call reads the file and starts from that frontier

Invariant (what makes a resumed result exact): a checkpoint holds the merged
Tally of *finished* chunks only, and every unit that no finished chunk has
explored (the frontier plus the units of chunks in flight).  So every node is
counted exactly once over the runs: either it is inside the saved Tally, or
inside exactly one saved unit.  A chunk lost with its driver is simply
explored again.  Branch and bound saves the incumbent (value, node, path) in
the Tally; a resumed search starts from it as the *global* incumbent (pruning
``bound < it`` strictly), so with ``ordered=True`` a tie at a smaller path is
still found and the answer is the same node an uninterrupted run returns
(chunks are given their units in path order, so a chunk's own best always
lies before the nodes it prunes against it).

Writes are atomic (``shoal._durable``): a temporary file created with
``O_EXCL|O_NOFOLLOW`` under an unpredictable name in the same directory
(a link planted there is never written through), fsync, rename, fsync of the
directory; a kill at any moment leaves the previous checkpoint or the new
one, and the next run removes a dead driver's temporary.  One driver per
checkpoint: ``<path>.lock`` is held for the search (a second one is refused).  A periodic save that fails (OSError: a purged scratch directory,
a full disk) is a RuntimeWarning, not the end of the search: the previous file
stays, and the next interval tries again.  A finished search deletes its checkpoint.  The file is a
checked header (format, the search it belongs to -- the skeleton and a digest
of the root and the options that change the answer --, the body's SHA-256)
and a pickled body (nodes are arbitrary Python objects), unpickled only after
the header matched: a damaged file, or one of another search, is refused
before any of it is decoded.  A crafted file with a valid header still runs
code: load only checkpoints you (or a process you trust) wrote.

Alternatives rejected: snapshotting the self-splitting engine's task tree
(its unexplored siblings live in generators inside worker stacks: neither
visible to the driver nor picklable); journaling every split and join (a
write per split, and a replay that needs every task's partial Tally).  The
cost of chunks: a chunk explores its units sequentially, with ``visit`` per
node (slower than the engine's hot loops on light nodes); parallelism comes
from the driver keeping two chunks per worker in flight.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import math
import os
import pickle
import stat
import time
from pickle import _Pickler as _PurePickler  # pure-Python: its dispatch table extends

import shoal._durable as durable

from .control import slot, stopped
from .engine import Explorer
from .model import Goal, SearchError, SearchSpec, Tally, _Stopped, listing

KIND = "search"
WHAT = "search checkpoint"
CHUNK_S = 0.25  # seconds a chunk explores before it returns what it left
FIRST_CHUNK_S = 0.02  # the root's chunk: return soon, so every worker gets a piece
CLOCK_EVERY = 64  # a chunk looks at the clock (and the cells) once per this many nodes


def fingerprint(kind: str, root, *options) -> str:
    """A digest naming one search: its skeleton, root and the functions and options that
    change the answer (a function by reference where pickle can, else by its code).

    The same search gives the same digest in every process: sets, frozensets and dicts are
    written in a canonical order (their pickle follows hash order, and str hashes change
    per process: a root or a ``partial`` holding a set of names would otherwise make every
    resume after a kill "another search")."""
    h = hashlib.sha256(kind.encode())
    for x in (root, *options):
        blob = _canonical(x)
        h.update(len(blob).to_bytes(8, "little"))
        h.update(blob)
    return h.hexdigest()


class _CanonicalPickler(_PurePickler):
    """pickle's pure-Python pickler with sets, frozensets and dicts in a canonical order
    (the C pickler cannot be told: ``reducer_override`` is not consulted for them)."""

    dispatch = dict(_PurePickler.dispatch)

    def _save_set(self, obj):
        self.save_reduce(type(obj), (sorted(obj, key=_canonical),), obj=obj)

    def _save_dict(self, obj):
        self.save_reduce(dict, (sorted(obj.items(), key=lambda kv: _canonical(kv[0])),), obj=obj)

    dispatch[set] = _save_set
    dispatch[frozenset] = _save_set
    dispatch[dict] = _save_dict


def _canonical(x) -> bytes:
    """``x`` as bytes that do not depend on the process (hash seed, object addresses)."""
    buf = io.BytesIO()
    try:
        _CanonicalPickler(buf, 5).dump(x)
        return buf.getvalue()
    except Exception:  # RecursionError too (the pure-Python pickler nests deeper than C's)
        try:
            return pickle.dumps(x, 5)
        except Exception:
            return _by_code(x)


def _by_code(x) -> bytes:
    """What cannot be pickled by reference (a lambda, a closure): its name and its code,
    with the code's constants, the closure's values and the defaults where they pickle."""
    parts = [type(x).__qualname__, getattr(x, "__module__", None), getattr(x, "__qualname__", None)]
    fn = getattr(x, "__func__", x)
    code = getattr(fn, "__code__", None)
    if code is not None:
        parts.append(_code_parts(code))
        cells = [c.cell_contents for c in (fn.__closure__ or ()) if _filled(c)]
        parts += [_canonical(v) for v in (*cells, *(fn.__defaults__ or ()))]
    return repr(parts).encode()


def _code_parts(code):
    return (code.co_code, code.co_names, tuple(_code_parts(c) if hasattr(c, "co_code") else
                                              _canonical(c) for c in code.co_consts))


def _filled(cell) -> bool:
    try:
        return cell.cell_contents is not cell  # raises ValueError for an empty cell
    except ValueError:
        return False


def make(path, interval, kind: str, root, *options):
    """The SearchCheckpoint of a skeleton call, or None without ``checkpoint=``."""
    if path is None:
        return None
    return SearchCheckpoint(path, interval, kind, fingerprint(kind, root, *options))


class SearchCheckpoint:
    """One search's checkpoint file: load once, save atomically, remove at the end.

    Driver only.  ``interval``: seconds between two saves while the search runs.
    """

    def __init__(self, path, interval: float, kind: str, digest: str):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"checkpoint must be a file path, got {path!r}")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise ValueError(f"checkpoint_interval must be a positive number of seconds, "
                             f"got {interval!r}")
        self.path = os.fspath(path)
        self._check_path()
        self.interval = float(interval)
        self.kind, self.digest = kind, digest
        self._lock = durable.WriterLock(self.path + ".lock", WHAT, f"search checkpoint {self.path!r}")
        self.saves = 0
        self.failed = 0  # periodic saves that could not be written
        self._failing = False

    def _check_path(self) -> None:
        """Refuse, before the search starts, a path no save could write: a directory, a FIFO
        or device (opening it to load would block), a symbolic link (``lstat``: a save never
        writes through one), a missing or read-only directory (the first save, ``interval``
        seconds in, would fail)."""
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise SearchError(f"checkpoint {self.path!r}: {exc.strerror}") from None
        if mode is not None and stat.S_ISDIR(mode):
            raise SearchError(f"checkpoint {self.path!r} is a directory; give a file path such as "
                              f"{os.path.join(self.path, 'search.ckpt')!r}")
        if mode is not None and stat.S_ISLNK(mode):
            raise SearchError(f"checkpoint {self.path!r} is a symbolic link; a checkpoint is never "
                              "read or written through a link: give the real path")
        if mode is not None and not stat.S_ISREG(mode):
            raise SearchError(f"checkpoint {self.path!r} is not a regular file (a FIFO or a device)")
        if not os.path.isdir(directory):
            raise SearchError(f"checkpoint {self.path!r}: directory {directory} does not exist; create it first")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise SearchError(f"checkpoint {self.path!r}: directory {directory} is not writable")

    def _belongs(self) -> dict:
        return {"kind": self.kind, "digest": self.digest}

    def load(self) -> tuple[Tally, list] | None:
        """(Tally so far, units left) from the file, or None when there is none.

        Takes the writer lock (``close`` drops it), removes dead writers' temporaries,
        probes the folder, then checks the header -- format, this search's digest, the body's
        checksum -- and only then unpickles the body (nodes are arbitrary objects: the one
        place a checkpoint needs pickle, a trust boundary in docs/runtime.md)."""
        self._lock.acquire()
        try:
            durable.sweep(self.path)
            durable.probe_writable(self.path, WHAT)
            return self._load()
        except BaseException:
            self._lock.release()
            raise

    def close(self) -> None:
        self._lock.release()

    def _load(self) -> tuple[Tally, list] | None:
        blob = durable.read_file(self.path, WHAT)
        if blob is None:
            return None
        try:
            belongs, body = durable.unpack(blob, self.path, KIND, WHAT)
        except durable.CheckpointError as exc:
            raise SearchError(f"checkpoint {self.path!r} is unreadable "
                              f"({str(exc).split('(', 1)[1].rsplit(')', 1)[0]}); "
                              "delete it to start the search afresh") from None
        if belongs != self._belongs():
            raise SearchError(f"checkpoint {self.path!r} belongs to another search "
                              f"({belongs.get('kind')!r:.40}); this is a {self.kind} of another root or "
                              "with other options.  Delete it, or give this search its own path")
        try:
            state = pickle.loads(body)  # trust boundary: only after the header matched
            tally, units = state["tally"], state["units"]
        except Exception as exc:
            raise SearchError(f"checkpoint {self.path!r} is unreadable ({exc!r:.200}); delete it "
                              "to start the search afresh") from None
        if not (isinstance(tally, Tally) and isinstance(units, list)
                and all(type(u) is tuple and len(u) == 2 and type(u[1]) is tuple for u in units)):
            # (a file of the right search whose body is not what save writes: a raw
            # AttributeError/TypeError from the driver loop, or a wrong count, before)
            raise SearchError(f"checkpoint {self.path!r} is unreadable (its tally or frontier is not "
                              "what a checkpoint holds); delete it to start the search afresh")
        return tally, units

    def save(self, tally: Tally, units: list) -> None:
        state = {"tally": tally, "units": sorted(units, key=lambda u: u[1]), "saved_at": time.time()}
        durable.write_atomic(self.path, durable.pack(KIND, self._belongs(), dumps(state)), WHAT)
        self.saves += 1

    def save_or_warn(self, tally: Tally, units: list) -> bool:
        """A periodic save that an OSError cannot stop the search with (a scratch directory
        purged, a full disk, a quota): a RuntimeWarning at the first failure of a streak, the
        search goes on, and the next interval tries again.  The previous checkpoint, if any,
        stays as it was (writes are atomic), so a rerun after a crash still resumes from it.
        Before, the first such save ended an hours-long search with a raw error naming a
        temporary file."""
        try:
            self.save(tally, units)
        except OSError as exc:
            self.failed += 1
            if not self._failing:
                self._failing = True
                import warnings

                warnings.warn(f"checkpoint {self.path!r} could not be written "
                              f"({exc.strerror or exc!r}); the search goes on and tries again every "
                              f"{self.interval:g} s; a rerun after a crash resumes from the last "
                              f"checkpoint written ({self.saves} so far)", RuntimeWarning, stacklevel=2)
            return False
        self._failing = False
        return True

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        durable.sweep(self.path)


class Frozen:
    """A chunk's units, pickled by the driver (``dumps``): the runtime then ships bytes."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes):
        self.blob = blob

    def __reduce__(self):
        return (Frozen, (self.blob,))


def thaw(units):
    """A chunk's units as the driver gave them: unpickled when they came ``Frozen``."""
    return pickle.loads(units.blob) if type(units) is Frozen else units


DEEP_STACK = 512 << 20  # the C stack of the thread that pickles deeply nested nodes
_STACK_PER_LEVEL = 1100  # bytes of C stack one pickle level may take (generous: as the workers)


def dumps(obj, *, for_worker: bool = False) -> bytes:
    """``obj`` pickled (cloudpickle for what plain pickle cannot name), nested as deep as it is.

    Nodes that link to their parent (``(move, parent)``, the classic persistent path) nest
    as deep as the search: at depth ~1,000 the driver's pickle hit Python's recursion limit
    ("cannot pickle the arguments of chunk_task: maximum recursion depth exceeded"), where
    the workers, whose limit is sized to a 112 MiB stack, pickled them fine.  Such an object
    is pickled again in a thread with a ``DEEP_STACK`` C stack and a recursion limit sized
    to it (raised for the call only: the limit is the interpreter's).

    ``for_worker``: the bytes go to a worker, whose ``__main__`` is not the driver's, so
    classes and functions of the driver's ``__main__`` travel by value (cloudpickle), as the
    runtime sends a task's arguments; a checkpoint file keeps them by reference (the rerun's
    ``__main__`` defines them again)."""
    try:
        return _dumps(obj, for_worker)
    except RecursionError:
        pass
    import sys
    import threading

    box: dict = {}

    def run() -> None:
        try:
            box["blob"] = _dumps(obj, for_worker)
        except BaseException as exc:  # re-raised in the caller
            box["exc"] = exc

    old_stack = threading.stack_size(DEEP_STACK)
    old_limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(old_limit, DEEP_STACK // _STACK_PER_LEVEL))
        t = threading.Thread(target=run, name="shoal-deep-pickle")
        t.start()
    finally:
        threading.stack_size(old_stack)
    try:
        t.join()
    finally:
        sys.setrecursionlimit(old_limit)
    if "exc" in box:
        raise box["exc"]
    return box["blob"]


def freeze(units) -> Frozen:
    """A chunk's units as bytes for a worker (``dumps(..., for_worker=True)``)."""
    return Frozen(dumps(units, for_worker=True))


def _dumps(obj, for_worker: bool = False) -> bytes:
    try:
        blob = pickle.dumps(obj, 5)
        if not (for_worker and b"main__" in blob):
            return blob
    except RecursionError:
        raise
    except Exception as exc:
        if "recursion" in str(exc):  # a PicklingError wrapping one
            raise RecursionError(str(exc)) from exc
    import cloudpickle

    try:
        return cloudpickle.dumps(obj, 5)
    except Exception as exc2:
        if "recursion" in str(exc2):
            raise RecursionError(str(exc2)) from exc2
        raise


def next_units(frontier: list, window: int, in_flight: int) -> list:
    """The next units to submit from a driver's ``frontier`` (a LIFO of lists of units,
    depth-first so it stays small), cut so that every free slot of the ``window`` of
    chunk tasks gets a piece (the rest go back on the frontier)."""
    units = frontier.pop()
    free = window - in_flight - len(frontier)
    if len(units) > 1 and free > 1:
        step = -(-len(units) // min(free, len(units)))
        pieces = [units[i:i + step] for i in range(0, len(units), step)]
        units = pieces.pop(0)
        frontier.extend(reversed(pieces))
    return units


def run_checkpointed(pilot, spec: SearchSpec, ck: SearchCheckpoint, resumed, stop_all, prog=None) -> Tally:
    """The driver's loop of a checkpointed search; the merged Tally (with the resumed one)."""
    if resumed is None:
        tally, frontier, first = Tally(tasks=0), [[(spec.root, ())]], True
    else:
        tally, units = resumed
        frontier, first = ([units] if units else []), False
    window = 2 * pilot.workers
    pending: dict = {}  # future -> its units
    last = time.monotonic()
    try:
        while frontier or pending:
            while frontier and len(pending) < window:
                units = next_units(frontier, window, len(pending))
                units.sort(key=lambda u: u[1])  # path order (ordered=True relies on it)
                f = pilot.submit(chunk_task, spec, freeze(units),
                                 FIRST_CHUNK_S if first else CHUNK_S)
                first = False
                pending[f] = units
            wait_s = ck.interval - (time.monotonic() - last)
            if prog is not None:
                wait_s = min(wait_s, prog.wait_s())
            done, _ = cf.wait(pending, timeout=max(0.0, wait_s), return_when=cf.FIRST_COMPLETED)
            for f in done:
                units = pending.pop(f)
                try:
                    part, left = f.result()
                except BaseException:
                    frontier.append(units)  # still unexplored, as far as the checkpoint knows
                    raise
                tally.merge(part)
                if part.found is not None:  # find(): the answer; the others stop
                    frontier.clear()
                    stop_all(list(pending))
                    pending.clear()
                    break
                if left:
                    frontier.append(left)
            if time.monotonic() - last >= ck.interval:
                ck.save_or_warn(tally, _open_units(frontier, pending))
                last = time.monotonic()
            if prog is not None:
                prog.tick()
    except BaseException:
        try:  # keep what the finished chunks did: a rerun goes on from here
            ck.save(tally, _open_units(frontier, pending))
        except Exception:
            pass
        finally:
            stop_all(list(pending))
        raise
    ck.remove()
    return tally


def _open_units(frontier: list, pending: dict) -> list:
    return [u for units in frontier for u in units] + [u for units in pending.values()
                                                       for u in units]


def chunk_task(spec: SearchSpec, units, max_s: float):
    """Explore ``units`` [(node, path)] depth-first, in order, for about ``max_s`` seconds;
    (Tally of the nodes visited, the units left unexplored, in path order).

    A chunk can run twice (dask re-runs the tasks of a machine that died) after its first
    attempt offered its best to the incumbent cell; branch and bound prunes strictly
    against that cell (engine.Explorer._limits, branch_and_bound's "Pruning rule"), so the
    second attempt keeps the node that ties it."""
    units = thaw(units)
    ctl = spec.control.array
    ex = Explorer(spec, (), ctl, slot(ctl), split=False)
    t = ex.tally
    if spec.collect:
        t.found_nodes = []
    optimise = spec.goal is Goal.OPTIMISE
    prune_level = spec.prune_level and optimise
    cell = spec.cell
    clock = time.perf_counter
    deadline = clock() + max_s
    stack = units[::-1]  # the next unit last
    n = 0
    try:
        while stack:
            n += 1
            if n >= CLOCK_EVERY:
                n = 0
                if clock() >= deadline or stopped(spec.stop, ctl):
                    break
                if cell is not None and cell.value > ex.glob:
                    ex.glob = cell.value
                    ex._limits()
            node, path = stack.pop()
            if not ex.visit(node, len(path), path):
                if prune_level:  # later siblings lie just below on the stack: pruned too
                    k, parent = len(path), path[:-1]
                    while stack and len(stack[-1][1]) == k and stack[-1][1][:-1] == parent:
                        stack.pop()
                continue
            kids = [(child, path + (i,)) for i, child in enumerate(listing(ex.children, node, path))]
            stack.extend(reversed(kids))
    except _Stopped:  # find(): a hit (the tally has it); the driver stops the rest
        stack = []
    ex.report()
    return t, stack[::-1]


def resume_initial(initial: float, resumed) -> float:
    """The incumbent cell's starting value on resume: the saved best, if better."""
    if resumed is None or resumed[0].best_path is None:
        return initial
    return max(initial, resumed[0].best) if not math.isnan(resumed[0].best) else initial

