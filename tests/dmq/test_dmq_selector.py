"""The fetch filter's grammar and meaning (dmq/selector.py).

Proves: any text either parses or raises SelectorError with a column inside the text
(never another exception); printing a tree and parsing it gives the same tree; the
compiled closures agree with SQLite evaluating the same expression (three-valued logic,
BETWEEN, IN, LIKE with ESCAPE, IS NULL) over well-typed rows; the limits hold; tags=
keeps exactly the records whose tag header is listed.
"""

from __future__ import annotations

import sqlite3
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq import selector as sel
from log.records import Header, Record

# ------------------------------------------------------------------ any text


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=string.printable + "éλ", max_size=80))
def test_any_text_parses_or_names_a_column(text: str) -> None:
    try:
        tree = sel.parse(text)
    except sel.SelectorError as exc:
        assert 1 <= exc.column <= len(text) + 1
        assert f"at column {exc.column}" in str(exc)
    else:
        assert sel.parse(sel.to_text(tree)) == tree


TOKENS = [
    "a", "b", '"x-y"', "$key", "$timestamp", "1", "-2", "3.5", "'s'", "''", "TRUE", "NULL",
    "=", "<>", "!=", "<", ">=", "AND", "OR", "NOT", "IN", "BETWEEN", "LIKE", "ESCAPE", "IS",
    "(", ")", ",", "'%a_'", "'!'",
]  # fmt: skip


@settings(max_examples=400)
@given(st.lists(st.sampled_from(TOKENS), max_size=14))
def test_token_soup_parses_or_names_a_column(tokens: list[str]) -> None:
    text = " ".join(tokens)
    try:
        tree = sel.parse(text)
    except sel.SelectorError as exc:
        assert 1 <= exc.column <= len(text) + 1
    else:
        assert sel.parse(sel.to_text(tree)) == tree


def test_errors_point_at_the_column() -> None:
    cases = {
        "a = ": 5,
        "a = 'x": 5,
        "a == 1": 4,
        "a IN ()": 7,
        "a BETWEEN 1 OR 2": 13,
        "a LIKE b": 8,
        "a IS 1": 6,
        "(a = 1": 7,
        "a = 1 b": 7,
        "$nope = 1": 1,
        "a # 1": 3,
        "": 1,
        "a LIKE 'x' ESCAPE 'ab'": 12,
    }
    for text, column in cases.items():
        with pytest.raises(sel.SelectorError) as info:
            sel.parse(text)
        assert info.value.column == column, (text, str(info.value))


def test_limits_are_enforced() -> None:
    limits = sel.SelectorLimits(chars_max=100, depth_max=5, nodes_max=20)
    with pytest.raises(sel.SelectorError, match="longer than 100"):
        sel.parse("a = 1 OR " * 20 + "a = 1", limits)
    with pytest.raises(sel.SelectorError, match="deeper than 5"):
        sel.parse("(" * 6 + "a = 1" + ")" * 6, limits)
    with pytest.raises(sel.SelectorError, match="more than 20 nodes"):
        sel.parse("a IN (" + ",".join(["1"] * 25) + ")", limits)
    with pytest.raises(sel.SelectorError, match="deeper than"):
        sel.parse("NOT " * 100 + "a = 1")
    with pytest.raises(sel.SelectorError, match="out of range"):
        sel.parse("a = 1e999")


# ------------------------------------------------------------------ meaning vs SQLite

# Numeric headers are compared with numbers, text headers with text: the well-typed
# subset where SQL's meaning is not in doubt. Headers hold text; SQLite holds typed
# columns; both must agree, NULL (an absent header) included.
NUM_COLS = ("n1", "n2")
TXT_COLS = ("t1", "t2")
small_ints = st.integers(-5, 5)
texts = st.text(alphabet="ab%_!", max_size=4)


def num_operand() -> st.SearchStrategy[sel.Node]:
    return st.one_of(st.sampled_from([sel.Name(c) for c in NUM_COLS]), small_ints.map(sel.Lit))


def txt_operand() -> st.SearchStrategy[sel.Node]:
    return st.one_of(st.sampled_from([sel.Name(c) for c in TXT_COLS]), texts.map(sel.Lit))


def predicates() -> st.SearchStrategy[sel.Node]:
    ops = st.sampled_from(["=", "<>", "<", "<=", ">", ">="])
    num_cmp = st.builds(sel.Compare, ops, num_operand(), num_operand())
    txt_cmp = st.builds(sel.Compare, st.sampled_from(["=", "<>"]), txt_operand(), txt_operand())
    between = st.builds(sel.Between, num_operand(), num_operand(), num_operand(), st.booleans())
    num_in = st.builds(
        sel.In, num_operand(), st.lists(small_ints.map(sel.Lit), min_size=1, max_size=3).map(tuple),
        st.booleans(),
    )  # fmt: skip
    txt_in = st.builds(
        sel.In, txt_operand(), st.lists(texts.map(sel.Lit), min_size=1, max_size=3).map(tuple),
        st.booleans(),
    )  # fmt: skip
    like = st.builds(sel.Like, txt_operand(), texts, st.sampled_from([None, "!"]), st.booleans())
    is_null = st.builds(sel.IsNull, st.one_of(num_operand(), txt_operand()), st.booleans())
    return st.one_of(num_cmp, txt_cmp, between, num_in, txt_in, like, is_null)


def trees() -> st.SearchStrategy[sel.Node]:
    return st.recursive(
        predicates(),
        lambda inner: st.one_of(
            inner.map(sel.Not),
            st.builds(
                sel.Logic,
                st.sampled_from(["AND", "OR"]),
                st.lists(inner, min_size=2, max_size=3).map(tuple),
            ),
        ),
        max_leaves=8,
    )


rows = st.fixed_dictionaries(
    {
        **{c: st.one_of(st.none(), small_ints) for c in NUM_COLS},
        **{c: st.one_of(st.none(), texts) for c in TXT_COLS},
    }
)


def _sqlite(tree: sel.Node, row: dict[str, object]) -> bool | None:
    db = sqlite3.connect(":memory:")
    try:
        db.execute("PRAGMA case_sensitive_like = ON")
        db.execute("CREATE TABLE r (n1 INTEGER, n2 INTEGER, t1 TEXT, t2 TEXT)")
        db.execute("INSERT INTO r VALUES (?, ?, ?, ?)", [row[c] for c in (*NUM_COLS, *TXT_COLS)])
        (value,) = db.execute(f"SELECT {sel.to_text(tree)} FROM r").fetchone()
    finally:
        db.close()
    return None if value is None else bool(value)


def _record(row: dict[str, object]) -> Record:
    headers = tuple(Header(k, str(v).encode()) for k, v in row.items() if v is not None)
    return Record(b"k", b"v", headers, 0, 0)


@settings(max_examples=300, deadline=None)
@given(trees(), rows)
def test_evaluation_agrees_with_sqlite(tree: sel.Node, row: dict[str, object]) -> None:
    text = sel.to_text(tree)
    parsed = sel.parse(text)
    assert parsed == tree
    assert sel.compile_tree(parsed)(_record(row)) == _sqlite(tree, row), text


# ------------------------------------------------------------------ examples


def _matches(text: str, record: Record) -> bool:
    compiled = sel.compile_filter(None, text)
    assert compiled is not None
    return compiled.matches(record)


def test_key_timestamp_quoted_names_and_coercion() -> None:
    r = Record(
        b"order-7",
        b"v",
        (Header("content-type", b"json"), Header("price", b"12.5"), Header("vip", b"true")),
        1_000,
        0,
    )
    assert _matches("$key LIKE 'order-%' AND \"content-type\" = 'json'", r)
    assert _matches("price > 12 AND price BETWEEN 12.5 AND 13", r)
    assert not _matches("price > 'z'", r)  # text order: '12.5' < 'z'
    assert _matches("vip = TRUE AND $timestamp >= 1000", r)
    assert not _matches("missing = 1", r)  # UNKNOWN is not a match
    assert not _matches("NOT missing = 1", r)  # NOT UNKNOWN is UNKNOWN
    assert _matches("missing IS NULL", r)
    assert _matches("price IN (1, 12.5)", r)
    assert not _matches("$key = 1", r)  # text that is no number: UNKNOWN


def test_like_is_linear_not_exponential() -> None:
    value = "a" * 2000
    pattern = "%a" * 30 + "b"
    assert not sel.like(value, pattern, None)
    assert sel.like("50%", "50!%", "!")
    assert not sel.like("500", "50!%", "!")


def test_tags_keep_listed_tag_headers() -> None:
    f = sel.compile_filter("red, blue", None)
    assert f is not None
    assert f.matches(Record(None, b"", (Header("tag", b"blue"),), 0, 0))
    assert f.matches(Record(None, b"", (Header("tag", b"x"), Header("tag", b"red")), 0, 0))
    assert not f.matches(Record(None, b"", (Header("tags", b"red"),), 0, 0))
    assert not f.matches(Record(None, b"", (), 0, 0))
    both = sel.compile_filter("red", "n = 1")
    assert both is not None and both.params == (("tags", "red"), ("filter", "n = 1"))
    assert not both.matches(Record(None, b"", (Header("tag", b"red"),), 0, 0))
    with pytest.raises(sel.FilterParamError) as info:
        sel.compile_filter("a,,b", None)
    assert info.value.field == "tags" and info.value.error.column == 3
