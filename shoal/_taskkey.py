"""What determines a task's result, as digests: files by content, functions by value.

Two hashes, both stdlib-only so the ensemble (patterns) and the pilot's cache (``shoal.cache``)
share them:

* ``FileDigests.digest(path)``: SHA-256 of a file's bytes (a folder: of its sorted relative
  names and their files' digests).  **Stat pre-check**: each digest is kept with the file's
  ``(size, mtime_ns, inode)``; while all three are unchanged the digest is trusted and the file
  is not read again.  A digest taken while the file's mtime was within ``RACY_S`` seconds of
  the clock is not kept for the pre-check (the "racily clean" rule of git's index: a write in
  the same timestamp tick right after hashing would keep size, mtime and inode), so such a file
  is hashed again next time.  What the pre-check cannot see: a file rewritten in place with the
  same size whose mtime was then set back (``touch -r``, some copy tools' ``-p``).
* ``function_digest(fn)``: a function *by value* — its code object (bytecode, constants,
  names; not its file name or line numbers, so moving it in its file keeps its key), its
  defaults, its closure's values, and, recursively, the code of the functions and classes it
  names that live in the user's own modules (not the stdlib, not installed packages, not shoal:
  those are named by module and qualified name), also through a user module's attributes
  (``cfg.SCALE``, ``pkg.sub.helper``).  A global it names that is plain data (numbers,
  strings, tuples, lists, dicts, sets; code inside them, a ``functools.partial`` or a bound
  method by its code) counts by value; an object of a user class by its class's code (and its
  attributes, where they are all data or code); any other
  object by its type's name only (docs/ensemble.md "Reusing results across runs", the limits).
  Functions are remembered by the function, not the code object: closures of one factory share
  their code but not their cells.  A closure value or
  default that is neither data nor code makes the function ``Unkeyable``: it is then never
  reused, rather than reused on a guess.

Rejected alternatives: ``marshal.dumps(code)`` (carries the file name and line table: adding a
comment above a function would change its key); pickling the function (cloudpickle's bytes are
not stable across its versions, and a by-reference pickle of a module function says nothing of
its code); hashing the module's source file (any edit anywhere in it re-runs every function of
that module, and a helper in another module is missed).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import inspect
import os
import stat
import sys
import sysconfig
import time
import types
from pathlib import PurePath

RACY_S = 2.0  # a digest of a file modified this recently is not trusted by the stat pre-check
CHUNK = 1 << 20


def _h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class CacheWarning(UserWarning):
    """A cached or recorded result could not be used (torn, tampered, gone, pickle without the
    opt-in) or stored: a miss, the task runs.  Re-exported as ``shoal.cache.CacheWarning``."""


class Unkeyable(ValueError):
    """A function or value whose result-determining content cannot be hashed; the message says why."""


# -- files ------------------------------------------------------------------------------------
class FileDigests:
    """Content digests of files with the stat pre-check (module docstring).  ``entries`` maps an
    absolute path to ``(size, mtime_ns, inode, digest)``; load and save it with the run."""

    def __init__(self, entries: dict | None = None):
        self.entries: dict[str, tuple[int, int, int, str]] = dict(entries or {})
        self.hashed = 0  # files read in full (the pre-check's misses), for tests and reports
        self.dirty: set[str] = set()  # paths whose entry changed since ``take_dirty``

    def digest(self, path: str) -> str:
        """The digest of the file or folder at ``path``; FileNotFoundError if there is none."""
        path = os.path.abspath(path)
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            return self._folder(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read, a device never end it
            raise Unkeyable(f"{path} is not a regular file or folder (a pipe, socket or device): "
                            "what a task reads from it cannot be keyed")
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        known = self.entries.get(path)
        if known is not None and tuple(known[:3]) == key:
            return known[3]
        digest = _hash_file(path)
        self.hashed += 1
        if time.time_ns() - st.st_mtime_ns > RACY_S * 1e9:
            self.entries[path] = (*key, digest)
            self.dirty.add(path)
        else:
            self.entries.pop(path, None)
        return digest

    def take_dirty(self) -> dict:
        """The entries that changed since the last call (to save them)."""
        out = {p: self.entries[p] for p in self.dirty if p in self.entries}
        self.dirty.clear()
        return out

    def _folder(self, root: str, _within: frozenset = frozenset()) -> str:
        """A folder by its tree (``tree_digest``): each file by its digest, each subfolder (an
        empty one too) by its name.  A link in it counts by its text *and* by what it points to
        (a task reads through it: ``data/big.csv -> /shared/big.csv``); a link to a folder is
        followed once per chain (a link back up the tree counts by its text only)."""
        files: dict[str, str] = {}
        folders: list[str] = []
        within = _within | {os.path.realpath(root)}
        for folder, dirs, names in os.walk(root):
            dirs.sort()
            linked = [d for d in dirs if os.path.islink(os.path.join(folder, d))]  # os.walk skips them
            folders += [os.path.relpath(os.path.join(folder, d), root) for d in dirs if d not in linked]
            for name in [*names, *linked]:
                full = os.path.join(folder, name)
                rel = os.path.relpath(full, root)
                if not os.path.islink(full):
                    files[rel] = self.digest(full)
                    continue
                target, seen = os.path.realpath(full), ""
                if os.path.isdir(target):
                    if target not in within and not any(target.startswith(w + os.sep) for w in within):
                        seen = self._folder(target, within)
                elif os.path.isfile(target):
                    seen = self.digest(target)
                files[rel] = _h(b"link:" + os.readlink(full).encode("utf-8", "surrogateescape") + b"\0"
                                + seen.encode())
        return tree_digest(files, folders)


def tree_digest(files: dict, folders=()) -> str:
    """The digest of a folder from its files' digests (``rel -> digest``) and its subfolders'
    relative names: what ``FileDigests.digest`` gives for it, so a folder staged back from
    recorded digests can be keyed without reading it (``--explain``)."""
    entries = sorted([(rel.replace(os.sep, "/"), "file:" + d) for rel, d in files.items()]
                     + [(rel.replace(os.sep, "/") + "/", "folder") for rel in folders])
    h = hashlib.sha256(b"folder\0")
    for rel, value in entries:
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + value.encode() + b"\n")
    return h.hexdigest()


def _hash_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: str) -> str:
    """SHA-256 of one file's bytes (no pre-check)."""
    return _hash_file(path)


# -- data -------------------------------------------------------------------------------------
def data_bytes(value, other=None, _depth: int = 0) -> bytes:
    """A stable encoding of plain data (None, bools, ints, floats, complex, str, bytes, and tuples,
    lists, dicts, sets of them; sets and dict items in a canonical order).  ``other(value)`` may
    encode anything else (bytes) or return None; without it, or when it returns None,
    ``Unkeyable``."""
    if _depth > 200:
        raise Unkeyable("data nested more than 200 deep")
    t = type(value)
    if value is None or t is bool:
        return f"{t.__name__}:{value!r};".encode()
    if t in (int, float, complex):
        return f"{t.__name__}:{value!r};".encode()
    if t is str:
        b = value.encode("utf-8", "surrogatepass")
        return b"str:%d:" % len(b) + b
    if t is bytes:
        return b"bytes:%d:" % len(value) + value
    if isinstance(value, os.PathLike) and isinstance(value, PurePath):  # a path: by its text
        return b"path:" + data_bytes(str(value), other, _depth + 1)
    if t in (tuple, list):
        inner = b"".join(data_bytes(v, other, _depth + 1) for v in value)
        return f"{t.__name__}:{len(value)}:".encode() + inner + b";"
    if t in (set, frozenset):
        inner = sorted(data_bytes(v, other, _depth + 1) for v in value)
        return f"{t.__name__}:{len(value)}:".encode() + b"".join(inner) + b";"
    if t is dict:
        items = sorted(data_bytes(k, other, _depth + 1) + data_bytes(v, other, _depth + 1)
                       for k, v in value.items())
        return f"dict:{len(value)}:".encode() + b"".join(items) + b";"
    encoded = other(value) if other is not None else None
    if encoded is None:
        raise Unkeyable(f"a value of type {t.__module__}.{t.__qualname__} is not plain data")
    return f"other:{t.__module__}.{t.__qualname__}:".encode() + encoded + b";"


def data_digest(value, other=None) -> str:
    return hashlib.sha256(data_bytes(value, other)).hexdigest()


# -- functions --------------------------------------------------------------------------------
def _installed_roots() -> tuple[str, ...]:
    """The folders of installed code: the stdlib and the site-packages folders.  Not the bare
    prefixes (``sys.prefix``): with a system Python that is ``/usr``, and a project in
    ``/usr/src/app`` (the layout of many container images) would count as installed, its
    helpers named rather than hashed, an edit of one unseen."""
    import site

    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    with contextlib.suppress(AttributeError):  # a virtualenv's old site module lacks them
        roots |= set(site.getsitepackages()) | {site.getusersitepackages()}
    roots |= {p for p in sys.path if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")}
    return tuple(sorted(os.path.abspath(r) + os.sep for r in roots if r))


_ROOTS = _installed_roots()


def is_user_module(name: str | None) -> bool:
    """A module of the user's own code: ``__main__`` or one loaded from a file outside the
    interpreter's prefixes (stdlib, site-packages); never shoal itself."""
    if not name:
        return False
    if name == "__main__":
        return True
    if name.split(".")[0] == "shoal":
        return False
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if not path:
        return False  # builtin, frozen, a namespace package
    path = os.path.abspath(path)
    return not any(path.startswith(root) for root in _ROOTS)


class _Hasher:
    def __init__(self, other=None):
        self.other = other
        self.seen: dict[int, str] = {}  # id(code or class) -> its digest (cycles: a placeholder)

    def function(self, fn) -> str:
        code = getattr(fn, "__code__", None)
        if code is None:
            raise Unkeyable(f"{fn!r} has no code object (a builtin or C function)")
        # by the function, not its code: closures made by one factory share a code object but
        # not their cell values (``add1 = make(1); add2 = make(2)``)
        ident = id(fn)
        if ident in self.seen:
            return self.seen[ident]
        self.seen[ident] = f"recursive:{fn.__qualname__}"
        h = hashlib.sha256(b"function\0")
        h.update(self._code(code).encode())
        for default in (fn.__defaults__ or ()):
            h.update(self._value(default, f"a default of {fn.__qualname__}").encode())
        for k, v in sorted((fn.__kwdefaults__ or {}).items()):
            h.update(k.encode() + b"=" + self._value(v, f"default {k} of {fn.__qualname__}").encode())
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell (assigned later)
                v = None
            h.update(name.encode() + b"=" + self._value(v, f"closure variable {name} of {fn.__qualname__}").encode())
        h.update(self._globals(fn, code).encode())
        digest = h.hexdigest()
        self.seen[ident] = digest
        return digest

    def _code(self, code: types.CodeType) -> str:
        h = hashlib.sha256(code.co_code)
        h.update(repr((code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
                       code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                h.update(b"code:" + self._code(c).encode())
            else:
                h.update(data_bytes(c, lambda v: repr(v).encode()))  # constants are immutable literals
        return h.hexdigest()

    def _names(self, code: types.CodeType) -> set[str]:
        names = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                names |= self._names(c)
        return names

    def _globals(self, fn, code) -> str:
        g = getattr(fn, "__globals__", {}) or {}
        names = self._names(code)
        parts = []
        for name in sorted(names):
            if name not in g:
                continue  # a builtin, an attribute name, or not defined yet
            v = g[name]
            if issubclass(type(v), types.ModuleType):  # type(), not isinstance: v.__class__ may raise
                self._module(name, v, names, parts, 0)
                continue
            try:
                parts.append(f"{name}={self._ref(v)}")
            except (Unkeyable, RecursionError):
                raise
            except Exception:  # noqa: BLE001 - an object whose attribute access raises (a proxy
                # bound to a context): as any object that is not data, by its type's name
                t = type(v)
                parts.append(f"{name}=object:{t.__module__}.{t.__qualname__}")
        return "\n".join(parts)

    def _module(self, name: str, mod: types.ModuleType, names: set, parts: list, depth: int) -> None:
        """``mod.helper(...)``, ``mod.SCALE``, ``pkg.sub.helper(...)``: a user module's attributes
        the code names, each as a global would count (code, data by value), through its
        submodules (a few levels)."""
        parts.append(f"{name}=module:{mod.__name__}")
        if not is_user_module(mod.__name__) or depth > 4:
            return
        for attr in sorted(names):
            if attr not in vars(mod):
                continue
            member = vars(mod)[attr]
            if isinstance(member, types.ModuleType):
                if member is not mod:
                    self._module(f"{name}.{attr}", member, names, parts, depth + 1)
            else:
                parts.append(f"{name}.{attr}={self._ref(member)}")

    def _ref(self, v) -> str:
        """A global the function names: code for the user's functions/classes, a name for
        installed ones, the value for data, the type's name for any other object."""
        if isinstance(v, types.FunctionType):
            if is_user_module(v.__module__):
                return "fn:" + self.function(v)
            return f"fn:{v.__module__}.{v.__qualname__}"
        if isinstance(v, type):
            if is_user_module(v.__module__):
                return "class:" + self._class(v)
            return f"class:{v.__module__}.{v.__qualname__}"
        if isinstance(v, functools.partial | types.MethodType):
            return "callable:" + _h(self._callable(v))
        # functools.wraps decorators, shoal.cached; looked up statically: a proxy's __getattr__
        # is not run (it may raise, or answer anything)
        wrapped = inspect.getattr_static(v, "__wrapped__", None)
        if isinstance(wrapped, types.FunctionType) and not isinstance(v, type):
            return f"wrapped:{type(v).__module__}.{type(v).__qualname__}:" + self._ref(wrapped)
        if isinstance(v, types.BuiltinFunctionType):
            return f"builtin:{getattr(v, '__module__', '')}.{v.__qualname__}"
        try:
            return "data:" + hashlib.sha256(data_bytes(v, self._other)).hexdigest()
        except Unkeyable:
            t = type(v)
            if is_user_module(t.__module__):  # its class's code, and its attributes where they
                # are data or code (a decorator object holding the function it wraps)
                state = vars(v) if isinstance(getattr(v, "__dict__", None), dict) else None
                try:
                    seen = _h(data_bytes(state, self._other)) if state else "opaque"
                except Unkeyable:
                    seen = "opaque"
                return f"object:{t.__module__}.{t.__qualname__}:{self._class(t)}:{seen}"
            return f"object:{t.__module__}.{t.__qualname__}"

    def _callable(self, v) -> bytes | None:
        """Code inside data or a closure: a function, a ``functools.partial`` (its function and
        arguments), a bound method (its function and its object's class)."""
        if isinstance(v, types.FunctionType):
            return b"fn:" + self.function(v).encode()
        if isinstance(v, functools.partial):
            return (b"partial:" + (self._callable(v.func) or self._ref(v.func).encode())
                    + data_bytes([list(v.args), dict(v.keywords)], self._other))
        if isinstance(v, types.MethodType):
            return (b"method:" + (self._callable(v.__func__) or self._ref(v.__func__).encode())
                    + self._ref(type(v.__self__)).encode())
        return None

    def _other(self, v) -> bytes | None:
        encoded = self._callable(v)
        if encoded is None and self.other is not None:
            encoded = self.other(v)
        return encoded

    def _class(self, cls: type) -> str:
        ident = id(cls)
        if ident in self.seen:
            return self.seen[ident]
        self.seen[ident] = f"recursive:{cls.__qualname__}"
        h = hashlib.sha256(f"class:{cls.__qualname__}".encode())
        for base in cls.__bases__:
            h.update(self._ref(base).encode())
        if issubclass(cls, enum.Enum):  # its members are instances of itself: by their values
            for name, m in cls.__members__.items():
                h.update(f"member {name}={self._ref(m.value)}".encode())
        for name, member in sorted(vars(cls).items()):
            if isinstance(member, staticmethod | classmethod):
                member = member.__func__
            if isinstance(member, property):
                h.update(f"{name}.setter={self._ref(member.fset)};{self._ref(member.fdel)}".encode())
                member = member.fget
            if isinstance(cls, enum.EnumMeta) and isinstance(member, cls):
                continue  # a member: by its value, above
            if isinstance(member, types.FunctionType):
                h.update(f"{name}={self.function(member)}".encode())
            elif not name.startswith("__"):
                h.update(f"{name}={self._ref(member)}".encode())
        digest = h.hexdigest()
        self.seen[ident] = digest
        return digest

    def _value(self, v, what: str) -> str:
        if isinstance(v, types.FunctionType):
            return "fn:" + self.function(v)
        if isinstance(v, type | types.ModuleType | types.BuiltinFunctionType):
            return self._ref(v) if not isinstance(v, types.ModuleType) else f"module:{v.__name__}"
        try:
            return hashlib.sha256(data_bytes(v, self._other)).hexdigest()
        except Unkeyable as exc:
            if _stateless(v) and not is_user_module(type(v).__module__):
                # a library's sentinel (dataclasses' default_factory marker): all in its class;
                # not the user's own objects, which the task itself may give state
                return self._ref(type(v))
            raise Unkeyable(f"{what}: {exc}") from None


def _stateless(v) -> bool:
    """An object all of whose behaviour is its class's code: an instance of classes written in
    Python only (no C base but ``object``, which could hold state a ``vars()`` does not show), no
    ``__slots__``, an empty ``__dict__``."""
    mro = type(v).__mro__[:-1]
    return (bool(mro) and all(c.__flags__ & _HEAPTYPE and "__slots__" not in vars(c) for c in mro)
            and isinstance(getattr(v, "__dict__", None), dict) and not vars(v))


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def function_digest(fn, other=None) -> str:
    """The digest of ``fn`` by value (module docstring); ``Unkeyable`` if a closure value or
    default is neither data nor code.  ``functools.partial`` counts its function and arguments."""

    if isinstance(fn, functools.partial):
        h = hashlib.sha256(b"partial\0" + function_digest(fn.func, other).encode())
        h.update(data_bytes(list(fn.args), other) + data_bytes(dict(fn.keywords), other))
        return h.hexdigest()
    if not isinstance(fn, types.FunctionType):
        call = type(fn).__call__ if callable(fn) else None
        if isinstance(call, types.FunctionType) and is_user_module(type(fn).__module__):
            try:
                state = data_bytes(vars(fn), other)
            except (TypeError, Unkeyable) as exc:
                raise Unkeyable(f"callable object {fn!r}: {exc}") from None
            return hashlib.sha256(_Hasher(other)._class(type(fn)).encode() + state).hexdigest()
        if isinstance(fn, types.BuiltinFunctionType | types.BuiltinMethodType) and \
                isinstance(getattr(fn, "__self__", None), types.ModuleType | type(None)):
            # a C function of a module (math.sqrt, pow): named; its code is the installed module's
            return hashlib.sha256(f"builtin:{fn.__module__}.{fn.__qualname__}".encode()).hexdigest()
        raise Unkeyable(f"{fn!r} is not a Python function")
    return _Hasher(other).function(fn)
