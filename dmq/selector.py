"""Broker-side record filters: `tags=a,b` and SQL92-style selectors over headers and key.

A pure module (no I/O, no dmq imports): fetches compile a filter once per request and
call it on each decoded record before anything is encoded, so records that do not match
never leave the broker. The share-group fetch and spark_io reuse `compile_filter`.

Grammar (keywords case-insensitive, as RocketMQ's and JMS's message selectors)::

    expr       := or
    or         := and ("OR" and)*
    and        := not ("AND" not)*
    not        := "NOT" not | predicate
    predicate  := operand [ cmp operand
                          | ["NOT"] "BETWEEN" operand "AND" operand
                          | ["NOT"] "IN" "(" literal ("," literal)* ")"
                          | ["NOT"] "LIKE" string ["ESCAPE" string]
                          | "IS" ["NOT"] "NULL" ]
    cmp        := "=" | "<>" | "!=" | "<" | "<=" | ">" | ">="
    operand    := literal | name | "(" expr ")"
    literal    := string | ["-"] number | "TRUE" | "FALSE" | "NULL"
    name       := identifier | '"' quoted header name '"' | "$key" | "$timestamp"

`identifier` ([A-Za-z_][A-Za-z0-9_.]*) and a double-quoted name ("content-type") name a
header: its value as UTF-8 text (the first header of that name; absent or not UTF-8 is
NULL). `$key` is the record key as text, `$timestamp` its timestamp in ms. Strings are
single-quoted, '' is a quote. Comparing with a number reads the other side as a number
(text that is not one makes the comparison UNKNOWN, as does NULL); two values read from
the record that both spell numbers compare as numbers; otherwise two texts compare as
text (a quoted literal is always text: `code = '007'`). Logic is SQL's three-valued logic: a record matches only if the selector is TRUE.

Never eval: a hand-written tokenizer and recursive-descent parser build a small tree,
compiled into closures. Every bound is explicit (`SelectorLimits`): the text's length,
the nesting depth and the number of nodes, so parsing and compiling are linear in the
text and one evaluation costs O(nodes x value length) (LIKE is matched by a two-pointer
wildcard matcher, never a backtracking regex). A bad selector raises SelectorError with
the 1-based column where it went wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

# ----------------------------------------------------------------------------- limits

SELECTOR_CHARS_MAX = 4_096  # the text of one filter= parameter
SELECTOR_DEPTH_MAX = 32  # nesting of parentheses and NOT/AND/OR
SELECTOR_NODES_MAX = 512  # tree nodes, IN list items included: bounds evaluation cost
TAGS_MAX = 256  # tags in one tags= parameter
TAG_CHARS_MAX = 256  # one tag
TAGS_CHARS_MAX = TAGS_MAX * (TAG_CHARS_MAX + 1) - 1  # a whole tags= parameter, commas included
TAG_HEADER = "tag"
NUMBER_CHARS_MAX = 64  # a numeric literal (int() of a huge digit string is quadratic)


@dataclass(frozen=True, slots=True)
class SelectorLimits:
    chars_max: int = SELECTOR_CHARS_MAX
    depth_max: int = SELECTOR_DEPTH_MAX
    nodes_max: int = SELECTOR_NODES_MAX


class SelectorError(ValueError):
    """A filter that cannot be parsed or is over a limit; `column` is 1-based."""

    def __init__(self, message: str, column: int, limit: int | None = None) -> None:
        super().__init__(f"{message} at column {column}")
        self.reason = message
        self.column = column
        self.limit = limit


class RecordLike(Protocol):
    """What a filter reads of a record (log.records.Record has it)."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[HeaderLike]: ...
    @property
    def timestamp_ms(self) -> int: ...


class HeaderLike(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def value(self) -> bytes | None: ...


Value = str | int | float | bool | None
Matcher = Callable[[RecordLike], bool]

# ----------------------------------------------------------------------------- the tree


@dataclass(frozen=True, slots=True)
class Lit:
    value: Value


@dataclass(frozen=True, slots=True)
class Name:
    name: str  # a header name, or "$key" / "$timestamp" when `special`
    special: bool = False


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # = <> < <= > >=
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class In:
    operand: Node
    items: tuple[Lit, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: str
    escape: str | None
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class Logic:
    op: str  # AND | OR
    operands: tuple[Node, ...]  # two or more


Node = Lit | Name | Compare | Between | In | Like | IsNull | Not | Logic

# ----------------------------------------------------------------------------- tokens

KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "IN", "BETWEEN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"}
)
SPECIAL_NAMES = frozenset({"$key", "$timestamp"})
_NUMBER = re.compile(r"(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_SPECIAL = re.compile(r"\$[A-Za-z_]+")
_OPERATORS = ("<=", ">=", "<>", "!=", "=", "<", ">", "(", ")", ",", "-")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # num str ident qident kw op end
    text: str
    column: int  # 1-based
    value: Value = None


def tokenize(text: str) -> list[Token]:
    out: list[Token] = []
    pos, n = 0, len(text)
    while pos < n:
        ch = text[pos]
        if ch in " \t\r\n":
            pos += 1
            continue
        column = pos + 1
        if ch in "'\"":
            body, pos = _quoted(text, pos, ch)
            out.append(Token("str" if ch == "'" else "qident", body, column, body))
            continue
        m = _NUMBER.match(text, pos)
        if m:
            raw = m.group(0)
            if len(raw) > NUMBER_CHARS_MAX:
                raise SelectorError(f"number longer than {NUMBER_CHARS_MAX} digits", column)
            number: int | float = int(raw) if raw.isdigit() else float(raw)
            if isinstance(number, float) and not math.isfinite(number):
                raise SelectorError(f"number {raw!r} is out of range", column)
            out.append(Token("num", raw, column, number))
            pos = m.end()
            continue
        m = _IDENT.match(text, pos)
        if m:
            word = m.group(0)
            upper = word.upper()
            out.append(Token("kw" if upper in KEYWORDS else "ident", word, column, upper))
            pos = m.end()
            continue
        m = _SPECIAL.match(text, pos)
        if m:
            if m.group(0) not in SPECIAL_NAMES:
                raise SelectorError(f"unknown name {m.group(0)!r} ($key, $timestamp)", column)
            out.append(Token("ident", m.group(0), column, None))
            pos = m.end()
            continue
        for op in _OPERATORS:
            if text.startswith(op, pos):
                out.append(Token("op", "<>" if op == "!=" else op, column))
                pos += len(op)
                break
        else:
            raise SelectorError(f"unexpected character {ch!r}", column)
    out.append(Token("end", "", n + 1))
    return out


def _quoted(text: str, start: int, quote: str) -> tuple[str, int]:
    """The body of a quoted string or name from text[start] (the quote); doubled quotes
    stand for one."""
    parts: list[str] = []
    pos = start + 1
    while True:
        end = text.find(quote, pos)
        if end < 0:
            raise SelectorError("unterminated quote", start + 1)
        parts.append(text[pos:end])
        if text.startswith(quote * 2, end):
            parts.append(quote)
            pos = end + 2
            continue
        return "".join(parts), end + 1


# ----------------------------------------------------------------------------- parser


class _Parser:
    def __init__(self, text: str, limits: SelectorLimits) -> None:
        self.tokens = tokenize(text)
        self.pos = 0
        self.limits = limits
        self.nodes = 0
        self.depth = 0

    # token helpers
    def peek(self) -> Token:
        return self.tokens[self.pos]

    def next(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def at_kw(self, *words: str) -> bool:
        t = self.peek()
        return t.kind == "kw" and t.value in words

    def at_op(self, *ops: str) -> bool:
        t = self.peek()
        return t.kind == "op" and t.text in ops

    def expect_kw(self, word: str) -> Token:
        if not self.at_kw(word):
            self.fail(f"expected {word}")
        return self.next()

    def expect_op(self, op: str) -> Token:
        if not self.at_op(op):
            self.fail(f"expected {op!r}")
        return self.next()

    def fail(self, message: str) -> None:
        t = self.peek()
        found = "the end" if t.kind == "end" else repr(t.text)
        raise SelectorError(f"{message}, found {found}", t.column)

    def node(self, node: Node, column: int) -> Node:
        self.nodes += 1
        if self.nodes > self.limits.nodes_max:
            raise SelectorError(
                f"more than {self.limits.nodes_max} nodes", column, self.limits.nodes_max
            )
        return node

    def enter(self, column: int) -> None:
        self.depth += 1
        if self.depth > self.limits.depth_max:
            raise SelectorError(
                f"nested deeper than {self.limits.depth_max}", column, self.limits.depth_max
            )

    # grammar
    def parse(self) -> Node:
        if self.peek().kind == "end":
            self.fail("expected an expression")
        tree = self.expr()
        if self.peek().kind != "end":
            self.fail("expected AND, OR or the end")
        return tree

    def expr(self) -> Node:
        return self.logic("OR", self.conjunction)

    def conjunction(self) -> Node:
        return self.logic("AND", self.negation)

    def logic(self, word: str, operand: Callable[[], Node]) -> Node:
        column = self.peek().column
        self.enter(column)
        items = [operand()]
        while self.at_kw(word):
            self.next()
            items.append(operand())
        self.depth -= 1
        return items[0] if len(items) == 1 else self.node(Logic(word, tuple(items)), column)

    def negation(self) -> Node:
        if self.at_kw("NOT"):
            column = self.next().column
            self.enter(column)
            inner = self.negation()
            self.depth -= 1
            return self.node(Not(inner), column)
        return self.predicate()

    def predicate(self) -> Node:
        column = self.peek().column
        left = self.operand()
        t = self.peek()
        if t.kind == "op" and t.text in ("=", "<>", "<", "<=", ">", ">="):
            self.next()
            return self.node(Compare(t.text, left, self.operand()), t.column)
        if self.at_kw("IS"):
            self.next()
            negated = self.at_kw("NOT")
            if negated:
                self.next()
            self.expect_kw("NULL")
            return self.node(IsNull(left, negated), column)
        negated = False
        if self.at_kw("NOT"):
            self.next()
            negated = True
            if not self.at_kw("BETWEEN", "IN", "LIKE"):
                self.fail("expected BETWEEN, IN or LIKE after NOT")
        if self.at_kw("BETWEEN"):
            self.next()
            low = self.operand()
            self.expect_kw("AND")
            return self.node(Between(left, low, self.operand(), negated), column)
        if self.at_kw("IN"):
            return self.in_list(left, negated, column)
        if self.at_kw("LIKE"):
            self.next()
            pattern = self.string("a LIKE pattern")
            escape = None
            if self.at_kw("ESCAPE"):
                escape_column = self.next().column
                escape = self.string("an ESCAPE character")
                if len(escape) != 1:
                    raise SelectorError("ESCAPE takes one character", escape_column)
            return self.node(Like(left, pattern, escape, negated), column)
        return left

    def in_list(self, left: Node, negated: bool, column: int) -> Node:
        self.next()
        self.expect_op("(")
        items = [self.literal()]
        while self.at_op(","):
            self.next()
            items.append(self.literal())
        self.expect_op(")")
        return self.node(In(left, tuple(items), negated), column)

    def string(self, what: str) -> str:
        if self.peek().kind != "str":
            self.fail(f"expected {what} (a quoted string)")
        return self.next().text

    def literal(self) -> Lit:
        t = self.peek()
        if t.kind in ("num", "str") or (t.kind == "kw" and t.value in ("TRUE", "FALSE", "NULL")):
            return self.operand()  # type: ignore[return-value]
        if t.kind == "op" and t.text == "-":
            return self.operand()  # type: ignore[return-value]
        self.fail("expected a literal")
        raise AssertionError  # unreachable: fail raises

    def operand(self) -> Node:
        t = self.next()
        if t.kind == "num" or t.kind == "str":
            return self.node(Lit(t.value), t.column)
        if t.kind == "op" and t.text == "-":
            number = self.peek()
            if number.kind != "num":
                self.fail("expected a number after '-'")
            self.next()
            assert isinstance(number.value, int | float)
            return self.node(Lit(-number.value), t.column)
        if t.kind == "kw" and t.value in ("TRUE", "FALSE"):
            return self.node(Lit(t.value == "TRUE"), t.column)
        if t.kind == "kw" and t.value == "NULL":
            return self.node(Lit(None), t.column)
        if t.kind == "ident":
            return self.node(Name(t.text, t.text in SPECIAL_NAMES), t.column)
        if t.kind == "qident":
            return self.node(Name(t.text), t.column)
        if t.kind == "op" and t.text == "(":
            self.enter(t.column)
            inner = self.expr()
            self.expect_op(")")
            self.depth -= 1
            return inner
        self.pos -= 1
        self.fail("expected a name, a literal or '('")
        raise AssertionError  # unreachable: fail raises


def parse(text: str, limits: SelectorLimits = SelectorLimits()) -> Node:
    """The tree of a selector; SelectorError (with a column) if it is not one."""
    if len(text) > limits.chars_max:
        raise SelectorError(
            f"longer than {limits.chars_max} characters", limits.chars_max + 1, limits.chars_max
        )
    return _Parser(text, limits).parse()


# ----------------------------------------------------------------------------- printing


def to_text(node: Node) -> str:
    """Canonical text: fully parenthesised; parse(to_text(t)) == t."""
    match node:
        case Lit(value):
            return _literal_text(value)
        case Name(name, special):
            return name if special else '"' + name.replace('"', '""') + '"'
        case Compare(op, left, right):
            return f"({to_text(left)} {op} {to_text(right)})"
        case Between(operand, low, high, negated):
            word = "NOT BETWEEN" if negated else "BETWEEN"
            return f"({to_text(operand)} {word} {to_text(low)} AND {to_text(high)})"
        case In(operand, items, negated):
            word = "NOT IN" if negated else "IN"
            return f"({to_text(operand)} {word} ({', '.join(to_text(i) for i in items)}))"
        case Like(operand, pattern, escape, negated):
            word = "NOT LIKE" if negated else "LIKE"
            tail = "" if escape is None else f" ESCAPE {_literal_text(escape)}"
            return f"({to_text(operand)} {word} {_literal_text(pattern)}{tail})"
        case IsNull(operand, negated):
            return f"({to_text(operand)} IS {'NOT NULL' if negated else 'NULL'})"
        case Not(operand):
            return f"(NOT {to_text(operand)})"
        case Logic(op, operands):
            return "(" + f" {op} ".join(to_text(o) for o in operands) + ")"
    raise TypeError(f"not a selector node: {node!r}")


def _literal_text(value: Value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)  # an int, or a float repr that reads back exactly


# ----------------------------------------------------------------------------- semantics


def as_number(value: Value) -> int | float | None:
    """A value read as a number (text that spells one), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return value
    text = value.strip()
    if len(text) > NUMBER_CHARS_MAX or _NUMBER_TEXT.fullmatch(text) is None:
        return None
    number = float(text) if any(c in text for c in ".eE") else int(text)
    return number if math.isfinite(number) else None


_NUMBER_TEXT = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def compare(op: str, a: Value, b: Value) -> bool | None:
    """SQL comparison; None is UNKNOWN (a NULL side, or sides of no common type)."""
    if a is None or b is None:
        return None
    if isinstance(a, bool) or isinstance(b, bool):
        x, y = _as_bool(a), _as_bool(b)
        if x is None or y is None or op not in ("=", "<>"):
            return None
        return (x == y) if op == "=" else (x != y)
    if isinstance(a, str) and isinstance(b, str):
        if isinstance(a, HeaderText) and isinstance(b, HeaderText):
            na, nb = as_number(a), as_number(b)  # two values that spell numbers: numbers
            if na is not None and nb is not None:
                return _ordered(op, na, nb)
        return _ordered(op, a, b)
    na, nb = as_number(a), as_number(b)
    if na is None or nb is None:
        return None
    return _ordered(op, na, nb)


def _as_bool(value: Value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _ordered(op: str, a: str | int | float, b: str | int | float) -> bool:
    if op == "=":
        return a == b
    if op == "<>":
        return a != b
    if op == "<":
        return a < b  # type: ignore[operator]
    if op == "<=":
        return a <= b  # type: ignore[operator]
    if op == ">":
        return a > b  # type: ignore[operator]
    return a >= b  # type: ignore[operator]


def like(text: str, pattern: str, escape: str | None) -> bool:
    """SQL LIKE: % any run, _ one character; two pointers with one backtrack point,
    O(len(text) x len(pattern)) at worst, never exponential."""
    tokens: list[str | None] = []  # None is %, "\0_" is _, else a literal character
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape:
            if i + 1 == len(pattern):
                return False  # a dangling escape matches nothing (as SQLite)
            tokens.append(pattern[i + 1])
            i += 2
            continue
        tokens.append(None if ch == "%" else "\0_" if ch == "_" else ch)
        i += 1
    t = p = 0
    star_p, star_t = -1, 0
    while t < len(text):
        if p < len(tokens) and tokens[p] is not None and (tokens[p] in ("\0_", text[t])):
            t += 1
            p += 1
        elif p < len(tokens) and tokens[p] is None:
            star_p, star_t = p, t
            p += 1
        elif star_p >= 0:
            p = star_p + 1
            star_t += 1
            t = star_t
        else:
            return False
    while p < len(tokens) and tokens[p] is None:
        p += 1
    return p == len(tokens)


def and3(values: Sequence[bool | None]) -> bool | None:
    if any(v is False for v in values):
        return False
    return None if any(v is None for v in values) else True


def or3(values: Sequence[bool | None]) -> bool | None:
    if any(v is True for v in values):
        return True
    return None if any(v is None for v in values) else False


def not3(value: bool | None) -> bool | None:
    return None if value is None else not value


class HeaderText(str):
    """Text read from a record (a header, the key), as opposed to a quoted literal: two
    of them that both spell numbers compare as numbers."""

    __slots__ = ()


def header_text(record: RecordLike, name: str) -> str | None:
    """The first header called `name` as UTF-8 text; None if absent or not UTF-8."""
    for h in record.headers:
        if h.key == name:
            if h.value is None:
                return None
            try:
                return HeaderText(h.value.decode())
            except UnicodeDecodeError:
                return None
    return None


def name_value(record: RecordLike, node: Name) -> Value:
    if node.special:
        if node.name == "$timestamp":
            return record.timestamp_ms
        key = record.key
        if key is None:
            return None
        try:
            return HeaderText(key.decode())
        except UnicodeDecodeError:
            return None
    return header_text(record, node.name)


# ----------------------------------------------------------------------------- compiling

Eval = Callable[[RecordLike], Value]
Truth = Callable[[RecordLike], bool | None]


def compile_tree(node: Node) -> Truth:
    """Closures over the tree: one Python call per node and record, no tree walk."""
    fn = _compile(node)
    return lambda record: _truth(fn(record))


def _truth(value: Value) -> bool | None:
    """A bare operand as a condition: TRUE/FALSE (or their text), else UNKNOWN."""
    return _as_bool(value)


def _compile(node: Node) -> Eval:  # noqa: C901 - one case per node type
    match node:
        case Lit(value):
            return lambda record: value
        case Name():
            name = node

            def read_name(record: RecordLike) -> Value:
                return name_value(record, name)

            return read_name
        case Compare(op, left, right):
            fl, fr = _compile(left), _compile(right)
            return lambda record: compare(op, fl(record), fr(record))
        case Between(operand, low, high, negated):
            fo, flo, fhi = _compile(operand), _compile(low), _compile(high)

            def between(record: RecordLike) -> Value:
                v = fo(record)
                result = and3([compare(">=", v, flo(record)), compare("<=", v, fhi(record))])
                return not3(result) if negated else result

            return between
        case In(operand, items, in_negated):
            fo = _compile(operand)
            values = [i.value for i in items]

            def is_in(record: RecordLike) -> Value:
                v = fo(record)
                if v is None:
                    return None
                result = or3([compare("=", v, item) for item in values])
                return not3(result) if in_negated else result

            return is_in
        case Like(operand, pattern, escape, like_negated):
            fo = _compile(operand)

            def is_like(record: RecordLike) -> Value:
                v = fo(record)
                if not isinstance(v, str):
                    return None
                result = like(v, pattern, escape)
                return (not result) if like_negated else result

            return is_like
        case IsNull(operand, null_negated):
            fo = _compile(operand)
            return lambda record: (fo(record) is None) != null_negated
        case Not(operand):
            fo = _compile(operand)
            return lambda record: not3(_truth(fo(record)))
        case Logic(op, operands):
            fns = [_compile(o) for o in operands]
            if op == "AND":
                return lambda record: and3([_truth(f(record)) for f in fns])
            return lambda record: or3([_truth(f(record)) for f in fns])
    raise TypeError(f"not a selector node: {node!r}")


# ----------------------------------------------------------------------------- filters


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """A compiled fetch filter; `params` is how to ask another broker for the same one."""

    matches: Matcher
    params: tuple[tuple[str, str], ...]


def parse_tags(text: str) -> frozenset[str]:
    tags = [t.strip() for t in text.split(",")]
    if len(tags) > TAGS_MAX:
        raise SelectorError(f"more than {TAGS_MAX} tags", 1, TAGS_MAX)
    column = 1
    for tag, raw in zip(tags, text.split(","), strict=True):
        if not tag:
            raise SelectorError("empty tag", column)
        if len(tag) > TAG_CHARS_MAX:
            raise SelectorError(f"tag longer than {TAG_CHARS_MAX} characters", column)
        column += len(raw) + 1
    return frozenset(tags)


def tags_matcher(tags: frozenset[str]) -> Matcher:
    """Records with a `tag` header whose value is one of `tags` (any of its tag headers)."""
    wanted = frozenset(t.encode() for t in tags)

    def matches(record: RecordLike) -> bool:
        return any(h.key == TAG_HEADER and h.value in wanted for h in record.headers)

    return matches


def compile_filter(
    tags: str | None, selector: str | None, limits: SelectorLimits = SelectorLimits()
) -> RecordFilter | None:
    """The fetch filter of `tags=` and `filter=` (both: a record must pass both); None
    when neither is given. SelectorError names the column; the caller names the field
    (`tags` or `filter`): raised as (field, error) through FilterParamError."""
    matchers: list[Matcher] = []
    params: list[tuple[str, str]] = []
    if tags is not None:
        try:
            matchers.append(tags_matcher(parse_tags(tags)))
        except SelectorError as exc:
            raise FilterParamError("tags", exc) from exc
        params.append(("tags", tags))
    if selector is not None:
        try:
            truth = compile_tree(parse(selector, limits))
        except SelectorError as exc:
            raise FilterParamError("filter", exc) from exc
        matchers.append(lambda record: truth(record) is True)
        params.append(("filter", selector))
    if not matchers:
        return None
    if len(matchers) == 1:
        return RecordFilter(matchers[0], tuple(params))
    first, second = matchers
    return RecordFilter(lambda r: first(r) and second(r), tuple(params))


class FilterParamError(ValueError):
    """A SelectorError and the request parameter it came from."""

    def __init__(self, field: str, error: SelectorError) -> None:
        super().__init__(f"{field}: {error}")
        self.field = field
        self.error = error
