"""Tools: schemas, argument validation with clear messages, registry lookups."""

from __future__ import annotations

import asyncio

import pytest

from rl_core import UnknownPluginError
from rl_rollout.tools import (
    TOOLS,
    FunctionTool,
    ToolArgumentError,
    ToolResult,
    ToolSchema,
    build_tool,
)

ADD_SCHEMA = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": "integer", "minimum": 0},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


def test_schema_round_trips_openai_form():
    schema = ToolSchema.from_openai(ADD_SCHEMA)
    assert schema.name == "add" and schema.description == "Add two integers."
    assert schema.to_openai() == ADD_SCHEMA
    assert ToolSchema.from_openai(ADD_SCHEMA["function"]) == schema


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"description": "x"}, "has no 'name'"),
        ({"name": "", "description": "x"}, "ToolSchema.name='' is invalid"),
        (
            {"name": "t", "parameters": {"type": "array"}},
            "expected a JSON schema with type 'object'",
        ),
        (
            {"name": "t", "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}}},
            "is not a valid JSON schema",
        ),
    ],
)
def test_bad_schemas_are_rejected_with_the_field(schema, message):
    with pytest.raises(ValueError, match=message):
        ToolSchema.from_openai(schema)


def test_arguments_are_validated_against_the_schema():
    tool = FunctionTool(lambda a, b: a + b, ADD_SCHEMA)
    assert tool.validate_arguments({"a": 1, "b": 2}) == {"a": 1, "b": 2}
    cases = {
        "missing": (
            {"a": 1},
            "invalid arguments for tool 'add': (arguments): 'b' is a required property",
        ),
        "type": ({"a": "1", "b": 2}, "a: '1' is not of type 'integer'"),
        "range": ({"a": 1, "b": -1}, "b: -1 is less than the minimum of 0"),
        "extra": (
            {"a": 1, "b": 2, "c": 3},
            "Additional properties are not allowed ('c' was unexpected)",
        ),
        "not an object": ([1, 2], "got list [1, 2], expected a JSON object"),
    }
    for name, (args, message) in cases.items():
        with pytest.raises(ToolArgumentError) as info:
            tool.validate_arguments(args)
        assert message in str(info.value), name


def test_function_tools_run_sync_and_async_functions():
    async def mul(a, b):
        return ToolResult(text=str(a * b), metrics={"calls": 1.0})

    add = FunctionTool(lambda a, b: a + b, ADD_SCHEMA)
    times = FunctionTool(mul, {**ADD_SCHEMA["function"], "name": "mul"})

    async def main():
        return await asyncio.gather(add.execute({"a": 2, "b": 3}), times.execute({"a": 2, "b": 3}))

    r_add, r_mul = asyncio.run(main())
    assert (r_add.text, r_add.is_error) == ("5", False)
    assert (r_mul.text, r_mul.metrics) == ("6", {"calls": 1.0})
    assert times.name == "mul"


@pytest.mark.usefixtures("require_bwrap")
def test_registry_knows_the_python_tool_and_rejects_unknown_names():
    assert "python" in TOOLS.names()
    assert build_tool("python").name == "python"
    with pytest.raises(UnknownPluginError, match=r"unknown tool 'pyhton'.*did you mean 'python'"):
        build_tool("pyhton")


def test_in_process_registration():
    TOOLS.register("add_test", lambda: FunctionTool(lambda a, b: a + b, ADD_SCHEMA))
    try:
        assert build_tool("add_test").name == "add"
    finally:
        TOOLS.unregister("add_test")
