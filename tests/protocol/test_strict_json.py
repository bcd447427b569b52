"""The strict decoder's duplicate-key rule (SPEC §4), for any JSON text: a text whose objects
repeat no key decodes to what ``json.loads`` gives; a text that repeats one, at any depth, is
refused naming that key. The decoder builds each object with ``dict()`` and looks for the
repeated key only when the object came out short (issue 39), so the property pins both ways.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delegation.errors import PARSE_ERROR, RpcError
from delegation.wire import loads_strict

keys = st.text(alphabet='abcdé"\\ ', min_size=0, max_size=4)
scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
# Objects as lists of pairs, so a key may repeat; rendered by hand below.
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4).map(lambda items: ("list", items))
        | st.lists(st.tuples(keys, inner), max_size=5).map(lambda pairs: ("object", pairs))
    ),
    max_leaves=30,
)


def _render(value) -> str:
    if isinstance(value, tuple) and value[0] == "list":
        return "[" + ",".join(_render(item) for item in value[1]) + "]"
    if isinstance(value, tuple):
        return "{" + ",".join(f"{json.dumps(k)}:{_render(v)}" for k, v in value[1]) + "}"
    return json.dumps(value)


def _first_repeated(value) -> str | None:
    """The key the decoder must name: json decodes depth first, innermost objects first."""
    if isinstance(value, tuple) and value[0] == "list":
        for item in value[1]:
            found = _first_repeated(item)
            if found is not None:
                return found
        return None
    if isinstance(value, tuple):
        seen = set()
        for _key, item in value[1]:
            found = _first_repeated(item)
            if found is not None:
                return found
        for key, _item in value[1]:
            if key in seen:
                return key
            seen.add(key)
    return None


@given(values)
def test_it_refuses_exactly_the_texts_that_repeat_a_key(value):
    text = _render(value)
    repeated = _first_repeated(value)
    if repeated is None:
        assert loads_strict(text) == json.loads(text)
        return
    with pytest.raises(RpcError) as refused:
        loads_strict(text)
    assert refused.value.code == PARSE_ERROR
    assert refused.value.message == f"parse error: duplicate key {repeated!r}"


def test_it_names_the_repeated_key_of_a_large_object():
    pairs = [f'"k{n}": {n}' for n in range(200)] + ['"k150": 0']
    with pytest.raises(RpcError, match="duplicate key 'k150'"):
        loads_strict("{" + ", ".join(pairs) + "}")
