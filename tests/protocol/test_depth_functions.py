"""Tests for delegation.depth (SPEC §3). Plain functions: no Django, no database."""

import asyncio
import math
import os
import threading
import uuid
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegation import depth

MAX = depth.MAX_LEVEL
ASCII_SPACE = " \t\n\r\v\f"


@pytest.fixture
def sid():
    session_id = f"conv-{uuid.uuid4()}"
    yield session_id
    depth.clear_session(session_id)


# --- constants ------------------------------------------------------------------------------


def test_it_exposes_the_upstream_names():
    assert depth.ENV_VAR == "PANDO_DELEGATION_DEPTH"
    assert depth.META_KEY == "pando:delegationDepth"
    assert depth.HEADER == "X-Pando-Delegation-Depth"
    assert depth.MAX_LEVEL == 9223372036854775807


def test_it_has_no_django_import():
    source = open(depth.__file__, encoding="utf-8").read()
    assert "django" not in source.lower()


# --- parse ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("7", 7),
        ("+7", 7),
        (" +7 \n", 7),
        ("\t\n\r\v\f3\f\v\r\n\t", 3),
        ("007", 7),
        ("+0", 0),
        ("0" * 5000 + "5", 5),
        ("9223372036854775807", MAX),
        ("+9223372036854775807", MAX),
        ("  9223372036854775807  ", MAX),
    ],
)
def test_it_parses_valid_text(text, expected):
    assert depth.parse(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "\n",
        "+",
        " + ",
        "-1",
        "-0",
        "++1",
        "+-1",
        "+ 1",
        "1 2",
        "1.5",
        "1.0",
        "1e2",
        "0x10",
        "0b1",
        "0o7",
        "1_0",
        "abc",
        "7a",
        "a7",
        "9223372036854775808",
        "99999999999999999999",
        "9" * 5000,
        "\u00a07",  # no-break space
        "7\u2003",  # em space
        "\u20287",  # line separator
        "\x1c7",  # str.isspace() is true for this, ASCII whitespace is not
        "\x007",
        "\u0663",  # ARABIC-INDIC DIGIT THREE
        "\uff17",  # FULLWIDTH DIGIT SEVEN
        "\u00b2",  # superscript two
    ],
)
def test_it_rejects_invalid_text(text):
    assert depth.parse(text) is None


@pytest.mark.parametrize("value", [None, 7, 7.0, b"7", ["7"]])
def test_it_returns_none_when_parse_gets_a_non_string(value):
    assert depth.parse(value) is None


# --- parse_json_value / from_meta -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (3, 3),
        (MAX, MAX),
        (0.0, 0),
        (-0.0, 0),
        (2.0, 2),
        (1e18, 10**18),
        ("3", 3),
        (" +3 ", 3),
    ],
)
def test_it_accepts_valid_json_values(value, expected):
    assert depth.parse_json_value(value) == expected
    assert depth.from_meta({depth.META_KEY: value}) == expected


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        -1,
        MAX + 1,
        2.5,
        -1.0,
        -0.5,
        math.nan,
        math.inf,
        -math.inf,
        float(2**63),  # float(MAX) rounds up past the int64 range
        1e300,
        "",
        "-1",
        "2.0",
        "nan",
        [],
        [3],
        {},
        {"level": 3},
        Fraction(3, 1),
        b"3",
    ],
)
def test_it_rejects_invalid_json_values(value):
    assert depth.parse_json_value(value) is None
    assert depth.from_meta({depth.META_KEY: value}) is None


@pytest.mark.parametrize("meta", [None, {}, {"other": 3}, [], [(depth.META_KEY, 3)], "3", 3])
def test_it_reads_no_level_from_meta_without_the_key(meta):
    assert depth.from_meta(meta) is None


def test_it_writes_meta_as_a_copy():
    base = {"trace": "abc", depth.META_KEY: 9}
    out = depth.meta(2, base)
    assert out == {"trace": "abc", depth.META_KEY: 2}
    assert base == {"trace": "abc", depth.META_KEY: 9}
    assert depth.meta(0) == {depth.META_KEY: 0}
    assert type(depth.meta(4)[depth.META_KEY]) is int
    assert depth.from_meta(depth.meta(5, {"x": 1})) == 5


# --- env ------------------------------------------------------------------------------------


def test_it_reads_the_env_from_a_mapping():
    assert depth.from_env({depth.ENV_VAR: " 4\n"}) == 4
    assert depth.from_env({depth.ENV_VAR: "-4"}) is None
    assert depth.from_env({depth.ENV_VAR: ""}) is None
    assert depth.from_env({}) is None


def test_it_reads_the_process_env_by_default(monkeypatch):
    monkeypatch.setenv(depth.ENV_VAR, "6")
    assert depth.from_env() == 6
    monkeypatch.setenv(depth.ENV_VAR, "six")
    assert depth.from_env() is None
    monkeypatch.delenv(depth.ENV_VAR)
    assert depth.from_env() is None


def test_it_formats_an_env_entry():
    assert depth.env_entry(3) == "PANDO_DELEGATION_DEPTH=3"
    assert depth.env_entry(0) == "PANDO_DELEGATION_DEPTH=0"


def test_it_builds_a_child_env_from_a_base():
    base = {"PATH": "/bin", depth.ENV_VAR: "1"}
    env = depth.child_env(2, base)
    assert env == {"PATH": "/bin", depth.ENV_VAR: "2"}
    assert base[depth.ENV_VAR] == "1"
    assert depth.from_env(env) == 2


def test_it_builds_a_child_env_from_the_process_env(monkeypatch):
    monkeypatch.setenv("CANOPY_TEST_MARKER", "yes")
    monkeypatch.setenv(depth.ENV_VAR, "0")
    env = depth.child_env(1)
    assert env["CANOPY_TEST_MARKER"] == "yes"
    assert env[depth.ENV_VAR] == "1"
    assert os.environ[depth.ENV_VAR] == "0"


# --- writers refuse bad levels --------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, MAX + 1])
@pytest.mark.parametrize(
    "write",
    [
        depth.meta,
        depth.env_entry,
        depth.child_env,
        lambda level: depth.with_context(level).__enter__(),
        lambda level: depth.set_session("conv-bad", level),
    ],
)
def test_it_refuses_to_write_an_out_of_range_level(write, bad):
    with pytest.raises(ValueError):
        write(bad)
    assert depth.from_context() is None
    assert depth.session("conv-bad") is None


@pytest.mark.parametrize("bad", [True, 1.0, "1", None])
def test_it_refuses_to_write_a_non_int_level(bad):
    with pytest.raises(TypeError):
        depth.meta(bad)
    with pytest.raises(TypeError):
        depth.child_env(bad, {})
    with pytest.raises(TypeError):
        depth.set_session("conv-bad", bad)


# --- context --------------------------------------------------------------------------------


def test_it_has_no_context_level_by_default():
    assert depth.from_context() is None


def test_it_sets_and_restores_the_context_level():
    with depth.with_context(2) as level:
        assert level == 2
        assert depth.from_context() == 2
        with depth.with_context(5):
            assert depth.from_context() == 5
        assert depth.from_context() == 2
    assert depth.from_context() is None


def test_it_restores_the_context_level_after_an_exception():
    with pytest.raises(RuntimeError):
        with depth.with_context(4):
            raise RuntimeError("boom")
    assert depth.from_context() is None


def test_it_keeps_context_levels_apart_across_asyncio_tasks():
    async def at(level):
        with depth.with_context(level):
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return depth.from_context()

    async def main():
        return await asyncio.gather(*(at(n) for n in range(10)))

    assert asyncio.run(main()) == list(range(10))
    assert depth.from_context() is None


def test_it_does_not_leak_the_context_level_into_other_threads():
    seen = []
    with depth.with_context(3):
        thread = threading.Thread(target=lambda: seen.append(depth.from_context()))
        thread.start()
        thread.join()
    assert seen == [None]


# --- session registry -----------------------------------------------------------------------


def test_it_records_and_clears_a_session_level(sid):
    assert depth.session(sid) is None
    depth.set_session(sid, 2)
    assert depth.session(sid) == 2
    depth.set_session(sid, 0)
    assert depth.session(sid) == 0
    depth.clear_session(sid)
    assert depth.session(sid) is None
    depth.clear_session(sid)  # clearing twice is harmless


def test_it_keeps_sessions_apart(sid):
    other = sid + "-other"
    try:
        depth.set_session(sid, 1)
        depth.set_session(other, 4)
        assert (depth.session(sid), depth.session(other)) == (1, 4)
    finally:
        depth.clear_session(other)


def test_it_updates_the_session_registry_safely_from_many_threads():
    prefix = f"conv-{uuid.uuid4()}"
    barrier = threading.Barrier(16)

    def work(worker):
        barrier.wait()
        for i in range(200):
            depth.set_session(f"{prefix}-{worker}-{i}", worker)
            assert depth.session(f"{prefix}-{worker}-{i}") == worker
            if i % 2:
                depth.clear_session(f"{prefix}-{worker}-{i}")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in range(16):
        for i in range(200):
            expected = None if i % 2 else w
            assert depth.session(f"{prefix}-{w}-{i}") == expected
            depth.clear_session(f"{prefix}-{w}-{i}")


# --- resolve --------------------------------------------------------------------------------


def test_it_resolves_to_zero_when_nothing_is_declared():
    assert depth.resolve(environ={}) == 0
    assert depth.resolve(None, "conv-unknown", {}) == 0


def test_it_resolves_in_spec_order(sid):
    """explicit -> context -> session -> env -> 0: the context level (a request's explicit
    value carried down the call stack) outranks the session's, as the README states."""
    env = {depth.ENV_VAR: "4"}
    depth.set_session(sid, 3)
    with depth.with_context(2):
        assert depth.resolve(1, sid, env) == 1
        assert depth.resolve(None, sid, env) == 2
    assert depth.resolve(None, sid, env) == 3
    assert depth.resolve(None, None, env) == 4
    assert depth.resolve(None, "conv-unknown", env) == 4
    assert depth.resolve(None, None, {}) == 0


@pytest.mark.parametrize("explicit", ["1", " +1 ", 1.0, 1])
def test_it_resolves_an_explicit_value_in_any_valid_form(explicit):
    assert depth.resolve(explicit, environ={depth.ENV_VAR: "9"}) == 1


def test_it_resolves_an_explicit_zero_rather_than_falling_through(sid):
    depth.set_session(sid, 3)
    assert depth.resolve(0, sid, {depth.ENV_VAR: "4"}) == 0


@pytest.mark.parametrize("explicit", [-1, "-1", True, 1.5, "1e2", math.nan, [], {}, ""])
def test_it_skips_an_invalid_explicit_value(explicit, sid):
    depth.set_session(sid, 3)
    assert depth.resolve(explicit, sid, {depth.ENV_VAR: "4"}) == 3
    assert depth.resolve(explicit, None, {depth.ENV_VAR: "4"}) == 4
    assert depth.resolve(explicit, None, {depth.ENV_VAR: "x"}) == 0


def test_it_resolves_from_the_process_env_by_default(monkeypatch):
    monkeypatch.setenv(depth.ENV_VAR, "5")
    assert depth.resolve() == 5
    monkeypatch.delenv(depth.ENV_VAR)
    assert depth.resolve() == 0


# --- spawning -------------------------------------------------------------------------------


def test_it_computes_the_child_level():
    assert depth.child_level(0) == 1
    assert depth.child_level(3) == 4
    assert depth.child_level(MAX - 1) == MAX


def test_it_refuses_a_child_level_past_the_maximum():
    with pytest.raises(ValueError):
        depth.child_level(MAX)
    with pytest.raises(ValueError):
        depth.child_level(-1)


@pytest.mark.parametrize(
    ("level", "max_depth", "allowed"),
    [
        (0, 3, True),
        (2, 3, True),
        (3, 3, False),
        (4, 3, False),
        (0, 1, True),
        (1, 1, False),
        (0, 0, False),  # MaxDepth 0 disables delegation
        (MAX, MAX, False),
    ],
)
def test_it_decides_whether_a_level_may_spawn(level, max_depth, allowed):
    assert depth.may_spawn(level, max_depth) is allowed


def test_it_words_the_refusal_for_the_model():
    assert depth.refusal_message(3, 3) == (
        "delegation depth limit reached: level 3 may not spawn (max 3); finish the work yourself"
    )
    assert depth.refusal_message(0, 0) == (
        "delegation depth limit reached: level 0 may not spawn (max 0); finish the work yourself"
    )


# --- properties -----------------------------------------------------------------------------

levels = st.integers(min_value=0, max_value=MAX)
ascii_space = st.text(alphabet=ASCII_SPACE, max_size=4)


@given(levels)
def test_it_round_trips_every_level_through_text(n):
    assert depth.parse(str(n)) == n


@given(levels, ascii_space, ascii_space, st.booleans())
def test_it_tolerates_surrounding_ascii_space_and_a_plus(n, before, after, plus):
    assert depth.parse(f"{before}{'+' if plus else ''}{n}{after}") == n


@given(st.integers(max_value=-1) | st.integers(min_value=MAX + 1))
def test_it_rejects_every_out_of_range_integer(n):
    assert depth.parse(str(n)) is None
    assert depth.parse_json_value(n) is None


@given(st.text())
def test_it_never_raises_on_arbitrary_text(text):
    level = depth.parse(text)
    assert level is None or 0 <= level <= MAX
    assert depth.from_meta({depth.META_KEY: text}) == level
    assert depth.from_env({depth.ENV_VAR: text}) == level


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_it_accepts_a_float_only_when_finite_integral_and_in_range(x):
    expected = int(x) if math.isfinite(x) and x == int(x) and 0 <= x <= MAX else None
    assert depth.parse_json_value(x) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=10,
)


@given(json_values)
def test_it_never_raises_on_arbitrary_json(value):
    level = depth.from_meta({depth.META_KEY: value})
    assert level is None or 0 <= level <= MAX
    level = depth.from_meta(value)
    assert level is None or 0 <= level <= MAX


@given(levels)
def test_it_round_trips_every_level_through_each_carrier(n):
    assert depth.from_meta(depth.meta(n)) == n
    assert depth.from_env(depth.child_env(n, {})) == n
    name, _, value = depth.env_entry(n).partition("=")
    assert depth.from_env({name: value}) == n
    assert depth.resolve(n, environ={}) == n
