"""Conclusions (SPEC §9): one strict schema, and the ``canopy-conclusion`` block ending a
run's final output, read where the ``result`` event (or ``run.finish``'s output) lands."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delegation.errors import INVALID_PARAMS, RpcError
from delegation.models import Event, Run
from delegation.wire.conclusions import STATUSES, conclusion_of_output, parse_conclusion
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)

text = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() and "\x00" not in s)
artifact = st.one_of(
    st.fixed_dictionaries({"path": text, "description": text}),
    st.fixed_dictionaries(
        {"url": st.from_regex(r"https://[a-z]{1,12}\.example/[a-z0-9]{0,12}", fullmatch=True)},
        optional={"description": text},
    ).map(lambda a: {"description": "link", **a}),
)
conclusions = st.fixed_dictionaries(
    {"status": st.sampled_from(STATUSES), "summary": text},
    optional={
        "artifacts": st.lists(artifact, max_size=4),
        "followUp": st.lists(text, max_size=4),
        "confidence": st.floats(min_value=0, max_value=1),
    },
)


@settings(max_examples=60, deadline=None)
@given(conclusions)
def test_it_round_trips_every_valid_conclusion_through_the_schema_and_the_block(raw):
    stored = parse_conclusion(raw)
    assert parse_conclusion(stored) == stored  # the stored shape is itself valid, unchanged
    assert stored == {"artifacts": [], "followUp": [], **raw}
    output = f"All done.\n\n```canopy-conclusion\n{json.dumps(raw, indent=2)}\n```\n"
    assert conclusion_of_output(output) == (stored, None)


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"status": "finished", "summary": "x"}, "conclusion.status"),
        ({"status": "done"}, "conclusion.summary: required"),
        ({"status": "done", "summary": " "}, "conclusion.summary"),
        ({"status": "done", "summary": "x", "confidence": 1.5}, "conclusion.confidence"),
        ({"status": "done", "summary": "x", "confidence": "0.5"}, "conclusion.confidence"),
        ({"status": "done", "summary": "x", "followUp": "a"}, "conclusion.followUp"),
        ({"status": "done", "summary": "x", "apiKey": "k"}, "conclusion.apiKey: unknown field"),
        ({"status": "done", "summary": "x", "artifacts": [{"path": "a"}]}, "description"),
        (
            {"status": "done", "summary": "x", "artifacts": [{"description": "d"}]},
            "conclusion.artifacts[0]",
        ),
        (
            {
                "status": "done",
                "summary": "x",
                "artifacts": [{"url": "javascript:alert(1)", "description": "d"}],
            },
            "conclusion.artifacts[0].url",
        ),
        ({"status": "done", "summary": "x", "confidence": None}, "conclusion.confidence"),
        (
            {"status": "done", "summary": "x", "followUp": ["y" * 4000] * 9},
            "conclusion: a conclusion must be at most 32768 bytes",
        ),
    ],
)
def test_it_refuses_an_invalid_conclusion_naming_the_field(raw, named):
    with pytest.raises(RpcError) as refused:
        parse_conclusion(raw)
    assert refused.value.code == INVALID_PARAMS
    assert named in refused.value.message, refused.value.message


def test_it_reads_only_a_block_that_ends_the_output():
    block = '```canopy-conclusion\n{"status": "done", "summary": "ok"}\n```'
    assert conclusion_of_output(f"text\n{block}\n\n")[0]["status"] == "done"
    assert conclusion_of_output(f"{block}\nand then more words") == (None, None)
    assert conclusion_of_output("```json\n{}\n```") == (None, None)
    assert conclusion_of_output("no block at all") == (None, None)


async def _events(run_id: str) -> list[Event]:
    return await adb(lambda: list(Event.objects.filter(run__run_id=run_id).order_by("sequence")))()


async def test_it_stores_the_block_of_a_result_event_as_the_runs_conclusion(runner):
    await runner.open("root-1")
    output = 'Fixed it.\n```canopy-conclusion\n{"status": "done", "summary": "Fixed the bug."}\n```'
    await runner.emit("root-1", [{"kind": "result", "text": output}])
    answer = await runner.finish("root-1", output=output)
    assert answer["conclusion"] == {
        "status": "done",
        "summary": "Fixed the bug.",
        "artifacts": [],
        "followUp": [],
    }
    run = await adb(Run.objects.get)(run_id="root-1")
    assert run.output == output
    events = await _events("root-1")
    assert [e.kind for e in events] == ["result", "conclusion"]
    assert events[1].input == answer["conclusion"] and events[1].data == {"source": "output"}


async def test_it_keeps_the_output_and_stores_an_error_event_for_an_invalid_block(runner):
    await runner.open("root-1")
    output = (
        'Done.\n```canopy-conclusion\n{"status": "done", "summary": "ok", "confidence": 7}\n```'
    )
    await runner.emit("root-1", [{"kind": "result", "text": output}])
    answer = await runner.finish("root-1", output=output)
    assert answer["conclusion"] is None
    assert (answer["status"], answer["output"]) == ("succeeded", output)
    events = await _events("root-1")
    assert [e.kind for e in events] == ["result", "error"]
    assert "canopy-conclusion.confidence" in events[1].error
    assert events[1].data["field"] == "canopy-conclusion.confidence"


async def test_it_reads_the_block_of_an_output_given_only_on_finish(runner):
    await runner.open("root-1")
    output = '```canopy-conclusion\n{"status": "blocked", "summary": "No access."}\n```'
    answer = await runner.finish("root-1", output=output)
    assert answer["conclusion"]["status"] == "blocked"


async def test_it_refuses_a_conclusion_event_from_a_runner(runner):
    await runner.open("root-1")
    error = await runner.error(
        "run.event",
        {"runId": "root-1", "from": 1, "events": [{"kind": "conclusion", "input": {}}]},
    )
    assert error["code"] == INVALID_PARAMS and "reserved for the server" in error["message"]
