"""The worker changes its ``LoanBook`` only through the book's events and reads it only
through its queries (and the few hot-path attributes ``LoanBook.READABLE`` names).

Checked with ``ast`` over shoal/runtime/worker.py: no assignment to the book or to
anything inside it, no alias of the book or of a container it holds, and every
``<x>.book.<name>`` is a public method of ``LoanBook`` or a readable attribute.  The
worker once did ``self.book.loans = {}`` after a fork and kept ``self.cancelled``, an
alias of the book's set, through which the book's state could change behind its story.
"""

from __future__ import annotations

import ast
import inspect
from collections import deque
from pathlib import Path

from shoal.runtime import loans
from shoal.runtime.loans import LoanBook, LocalTask

WORKER = Path(loans.__file__).with_name("worker.py")
METHODS = {name for name, fn in inspect.getmembers(LoanBook, inspect.isfunction) if not name.startswith("_")}


def _chain(node: ast.AST) -> list[str]:
    """``self.book.cancelled.add`` -> ["self", "book", "cancelled", "add"] (subscripts skipped)."""
    out = []
    while True:
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            out.append(node.id)
            return out[::-1]
        else:
            return out[::-1]


def _targets(node: ast.AST):
    if isinstance(node, ast.Assign):
        yield from node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        yield node.target
    elif isinstance(node, ast.Delete):
        yield from node.targets


def _problems(source: str) -> list[str]:
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        for target in _targets(node):
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                chain = _chain(t)
                if "book" in chain[:-1]:
                    out.append(f"line {node.lineno}: assigns into the book ({'.'.join(chain)})")
                elif chain[-1:] == ["book"] and not (isinstance(node, ast.Assign) and isinstance(
                        node.value, ast.Call) and _chain(node.value.func) == ["LoanBook"]):
                    out.append(f"line {node.lineno}: rebinds the book")
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
            chain = _chain(node.value)
            if "book" in chain:
                out.append(f"line {node.lineno}: keeps an alias of {'.'.join(chain)}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "book":
            if node.attr not in METHODS and node.attr not in LoanBook.READABLE:
                out.append(f"line {node.lineno}: reads the book's {node.attr!r} (neither a query "
                           "nor LoanBook.READABLE)")
        if isinstance(node, ast.Attribute) and len(_chain(node)) >= 4 and _chain(node)[-3] == "book":
            out.append(f"line {node.lineno}: reaches into the book ({'.'.join(_chain(node))})")
    return out


def test_the_worker_touches_its_loan_book_only_through_events_and_queries():
    assert _problems(WORKER.read_text()) == []


def test_the_check_sees_each_way_of_reaching_into_the_book():
    bad = """
class W:
    def __init__(self):
        self.book = LoanBook(1, [2])
        self.cancelled = self.book.cancelled
    def f(self, tid):
        self.book.loans = {}
        self.book.cancelled.discard(tid)
        del self.book.loans[tid]
        return tid in self.book.loans
"""
    problems = _problems(bad)
    assert any("alias of self.book.cancelled" in p for p in problems), problems
    assert any("assigns into the book (self.book.loans)" in p for p in problems), problems
    assert any("reaches into the book (self.book.cancelled.discard)" in p for p in problems), problems
    assert sum("reads the book's 'loans'" in p for p in problems) == 3, problems
    assert _problems("class W:\n    def f(self):\n        self.book = LoanBook(1, [])\n"
                     "        return self.book.lent(), self.book.hunger\n") == []


class _Fut:
    _state = "PENDING"

    def __init__(self, tid):
        self.task_id = tid


def test_the_queries_answer_what_the_worker_asks():
    book = LoanBook(1, [2])
    tid = (1 << loans.OWNER_SHIFT) | 7
    dq = deque([LocalTask(print, (), {}, _Fut(tid + 1), None, False),
                LocalTask(print, (), {}, _Fut(tid), None, False)])
    book.answer(2, 0, dq, True, 1, lambda task, thief, gen: b"msg")
    assert book.is_lent(tid + 1) and book.lent() == 1 and not book.is_lent(tid)
    assert not book.should_drop(5)
    book.cancel_if_queued([5], {})
    assert book.should_drop(5)
    book.drop(5)
    assert not book.should_drop(5)
    assert not book.waits_for(2)
    book.request()
    assert book.waits_for(2) and not book.waits_for(3)
