"""Room on CPython's frame stack for hot loops: ``in_room(fn, *args)`` (leaf module: stdlib only).

Why: since 3.11 CPython keeps Python frames on a per-thread *data stack* made of
chunks (16 KiB normally).  A call that does not fit in the current chunk gets a
fresh one from ``mmap``, and the return that empties it gives it back with
``munmap`` (CPython issue gh-142183, "Calls across stack chunks perform badly",
fixed upstream in 2026 by caching one chunk per thread, gh-145789; 3.11 and 3.12 keep
it).  A recursion or a loop that keeps calling across such a boundary pays two
system calls and a page fault per call.  Where it was seen:

* the search loops ran several times slower at some stack depths and not at others
  (the recursive count loop on UTS slowed down only inside ``bench_search.py``'s
  ``main()``: a few frames more above the search moved the boundary into the hot
  loop; knapsack's recursion slowed down with two more local variables, with one
  ``mmap``/``munmap`` pair per call under strace);
* a user-written ``shoal.spawn`` UTS ran slower on 1 worker than the same loop in
  the driver, and scaled worse on 2 workers: the boundary sat in the user's
  recursion at the worker's stack depth.

(The figures: docs/benchmarks.md, "Measurements behind design choices".)

Who uses it: the search loops (``patterns/search/loops.py``, once per search
call) and the worker's task loop (``runtime/worker.py``, once per worker: every
task the worker runs starts from the room).  It is a leaf module so that both
layers share one implementation (patterns may import leaf modules;
``tests/test_layers.py`` checks that a leaf imports only the stdlib and other leaves).

How: ``in_room`` is a function whose frame reserves ``ROOM_WORDS`` slots of
evaluation stack it never uses (its code object's ``co_stacksize`` is raised).
That frame cannot fit in a 16 KiB chunk, so CPython gives it a chunk of its own,
sized to the next power of two that also holds ``MINIMUM_OVERHEAD`` (1,000
slots) more: 256 KiB, of which the reserved frame takes a little over half.  The
frame sits at the chunk's base, so the chunk lives as long as the call; every
frame the loop pushes lands in the ~120 KiB left after it (~400 levels of the
recursive loops) with no boundary to cross.  A nested ``in_room`` (a task run
while another joins on the same worker) never fits in that remainder (it is
smaller than the reserved frame), so it always starts a fresh chunk: each loop
has its full room.  The cost is one ``mmap``/``munmap`` pair per call, and pages
are touched only as deep as the loop goes.

Alternatives rejected: a smaller recursion depth (the boundary can be anywhere,
also at depth 3); padding frames chosen by probing (the data stack's position is
not visible from Python); raising the chunk size (a CPython build constant); a
copy of the trick in each layer (it was written twice, in runtime/worker.py and
patterns/search/room.py, until one leaf module served both).
On other implementations or versions the reserved stack is merely unused.
"""

from __future__ import annotations

import types

ROOM_WORDS = 17_000  # reserved slots: 8 * (17,000 + 1,000) bytes > 128 KiB -> a 256 KiB chunk


def _call(fn, *args):
    return fn(*args)


def _roomy(f, name: str):
    names = {"co_name": name}
    if hasattr(f.__code__, "co_qualname"):  # 3.11+ (3.10's replace() has no such keyword)
        names["co_qualname"] = name
    code = f.__code__.replace(co_stacksize=f.__code__.co_stacksize + ROOM_WORDS, **names)
    g = types.FunctionType(code, f.__globals__, name)
    g.__qualname__ = name  # (pickles by reference, as shoal._room.in_room)
    return g


in_room = _roomy(_call, "in_room")
in_room.__doc__ = "``fn(*args)`` from the base of a fresh 256 KiB frame-stack chunk (module doc)."
