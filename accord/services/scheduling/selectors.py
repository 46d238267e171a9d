"""Device selector expressions, in the spirit of Kubernetes DRA.

A job asks for devices by their attributes, with no vendor-specific code:

    vendor == nvidia && memory >= 80GiB
    model in (MI300X, H100) && !(arch == sm_70)

Grammar (``||`` binds loosest)::

    expr    := and ('||' and)*
    and     := unary ('&&' unary)*
    unary   := '!' unary | '(' expr ')' | test
    test    := NAME (OP value | 'in' '(' value (',' value)* ')' | 'notin' '(' ... ')')?
    value   := number with optional unit (80GiB, 1.5T, 9.0) | quoted string | bare word

The left side of a test is always an attribute name and the right side always a
literal, so no expression can reach anything but the attribute map: the parser is
safe by construction. A bare ``NAME`` tests that the attribute is truthy. String
comparison ignores case; ordering tests need numbers on both sides. A test on an
attribute the device lacks is false. Bad syntax raises ``SchedulingError`` with the
position and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache

from accord.services.scheduling.errors import SchedulingError

Attrs = Mapping[str, "str | int | float | bool"]
Predicate = Callable[[Attrs], bool]

MAX_SELECTOR_LEN = 4096

_TOKEN = re.compile(
    r"\s*(?:(?P<str>\"[^\"]*\"|'[^']*')|(?P<op>==|!=|>=|<=|&&|\|\||[<>!(),])|(?P<word>[A-Za-z0-9_.\-/:+]+))"
)
_QUANTITY = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<unit>[KMGTPkmgtp]i?[Bb]?|[Bb])?$")
_UNITS = {
    "": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50,
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")


def parse_quantity(word: str) -> float | None:
    """``80GiB`` -> 85899345920; ``9.0`` -> 9.0; not a number -> None."""
    m = _QUANTITY.match(word)
    if m is None:
        return None
    unit = (m.group("unit") or "").lower()
    if unit.endswith("b"):
        unit = unit[:-1]
    value = float(m.group("num")) * _UNITS[unit]
    return int(value) if value.is_integer() else value


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise SchedulingError(f"selector: unexpected character {text[pos:].lstrip()[:1]!r} at {pos}")
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    return tokens


_Value = str | int | float


def _literal(kind: str, text: str) -> _Value:
    if kind == "str":
        return text[1:-1].lower()
    q = parse_quantity(text)
    return q if q is not None else text.lower()


def _norm(v: str | int | float | bool) -> _Value | None:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return v
    q = parse_quantity(v)
    return q if q is not None else v.lower()


def _compare(op: str, a: _Value, b: _Value) -> bool:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if isinstance(a, str) or isinstance(b, str):
        return False
    if op == ">=":
        return a >= b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    return a < b


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def fail(self, expected: str) -> SchedulingError:
        tok = self.peek()
        where = f"{tok[1]!r} at {tok[2]}" if tok else "end of input"
        return SchedulingError(f"selector {self.text!r}: expected {expected}, found {where}")

    def take_op(self, op: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] == op:
            self.i += 1
            return True
        return False

    def parse(self) -> Predicate:
        pred = self.expr()
        if self.peek() is not None:
            raise self.fail("'&&', '||' or end of selector")
        return pred

    def expr(self) -> Predicate:
        parts = [self.conj()]
        while self.take_op("||"):
            parts.append(self.conj())
        if len(parts) == 1:
            return parts[0]
        return lambda a: any(p(a) for p in parts)

    def conj(self) -> Predicate:
        parts = [self.unary()]
        while self.take_op("&&"):
            parts.append(self.unary())
        if len(parts) == 1:
            return parts[0]
        return lambda a: all(p(a) for p in parts)

    def unary(self) -> Predicate:
        if self.take_op("!"):
            inner = self.unary()
            return lambda a: not inner(a)
        if self.take_op("("):
            inner = self.expr()
            if not self.take_op(")"):
                raise self.fail("')'")
            return inner
        return self.test()

    def value(self) -> _Value:
        tok = self.peek()
        if tok is None or tok[0] not in ("str", "word"):
            raise self.fail("a value")
        self.i += 1
        return _literal(tok[0], tok[1])

    def values(self) -> frozenset[_Value]:
        if not self.take_op("("):
            raise self.fail("'(' after 'in'")
        vals = {self.value()}
        while self.take_op(","):
            vals.add(self.value())
        if not self.take_op(")"):
            raise self.fail("',' or ')'")
        return frozenset(vals)

    def test(self) -> Predicate:
        tok = self.peek()
        if tok is None or tok[0] != "word" or not _NAME.match(tok[1]):
            raise self.fail("an attribute name, '!' or '('")
        self.i += 1
        name = tok[1]
        nxt = self.peek()
        if nxt is not None and nxt[0] == "word" and nxt[1].lower() in ("in", "notin"):
            self.i += 1
            negate = nxt[1].lower() == "notin"
            vals = self.values()

            def member(a: Attrs) -> bool:
                v = a.get(name)
                if v is None:
                    return False
                return (_norm(v) in vals) != negate

            return member
        if nxt is not None and nxt[0] == "op" and nxt[1] in ("==", "!=", ">=", "<=", ">", "<"):
            self.i += 1
            op = nxt[1]
            want = self.value()

            def cmp(a: Attrs) -> bool:
                v = a.get(name)
                if v is None:
                    return False
                got = _norm(v)
                return got is not None and _compare(op, got, want)

            return cmp
        return lambda a: bool(a.get(name))


@lru_cache(maxsize=4096)
def compile_selector(text: str) -> Predicate:
    """Parse a selector into a predicate over a device's attribute map ("" matches all)."""
    if not isinstance(text, str):
        raise SchedulingError("selector: must be a string")
    if len(text) > MAX_SELECTOR_LEN:
        raise SchedulingError(f"selector: longer than {MAX_SELECTOR_LEN} characters")
    if text.strip() == "":
        return lambda a: True
    return _Parser(text).parse()


def matches(selector: str, attrs: Attrs) -> bool:
    """Whether a device with ``attrs`` satisfies ``selector``."""
    return compile_selector(selector)(attrs)
