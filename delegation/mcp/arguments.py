"""Tool arguments decoded as strictly as the runner path decodes its frames (SPEC §4).

The SDK validates a tool's arguments with a model built from the tool function's signature,
in pydantic's lax mode: unknown keys are dropped, ``"4"`` becomes 4, ``true`` becomes 1,
strings are pre-parsed as JSON, ``null`` is a value, and a failure is answered with a pydantic
dump. Here each tool gets a strict twin of that model (unknown keys refused, no coercion, no
``null``: an argument is omitted to take its default) that is both published as the tool's
input schema and checked before the SDK sees the call; a refusal is a −32602 naming the
argument, in the §9 refusal shape.
"""

from __future__ import annotations

import copy
import types
import typing
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase
from pydantic import ConfigDict, create_model

from delegation.errors import METHOD_NOT_FOUND, RpcError
from delegation.mcp.calls import refused
from delegation.mcp.extension_tools import call_hosted, hosted_tools
from delegation.wire.decode import parse_model, refuse_nul

PREFIX = "arguments"


class StrictArguments(ArgModelBase):
    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)


def _without_none(annotation: Any) -> Any:
    """``X | None`` → ``X``: an absent argument takes its default; an explicit null is refused."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kept = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(kept) == 1:
            return kept[0]
        return typing.Union[tuple(kept)]  # noqa: UP007 - built from a runtime tuple
    return annotation


def strict_twin(arg_model: type[ArgModelBase]) -> type[StrictArguments]:
    """The SDK's argument model of a tool, with the same fields (and descriptions) made strict."""
    fields = {}
    for name, info in arg_model.model_fields.items():
        annotation = _without_none(info.annotation)
        field = copy.copy(info)
        field.annotation = annotation
        fields[name] = (annotation, field)
    # Named as the SDK named it: the published schema keeps its title.
    return create_model(arg_model.__name__, __base__=StrictArguments, **fields)


def published_schema(model: type[StrictArguments]) -> dict:
    """The input schema agents read: no ``"default": null`` that would suggest null is valid."""
    schema = model.model_json_schema(by_alias=True)
    for prop in schema.get("properties", {}).values():
        if "default" in prop and prop["default"] is None:
            del prop["default"]
    return schema


def check(model: type[StrictArguments], arguments: Any) -> None:
    """Refuse what the runner path refuses: NUL anywhere, unknown keys, wrong types, null."""
    refuse_nul(arguments, PREFIX)
    parse_model(model, arguments, prefix=PREFIX)


class StrictMCPServer(MCPServer):
    """An ``MCPServer`` whose tools take only strictly valid arguments.

    Call :meth:`make_strict` once every tool is registered.
    """

    def make_strict(self) -> None:
        for tool in self._tool_manager.list_tools():
            model = strict_twin(tool.fn_metadata.arg_model)
            # The SDK validates (and a tool runs) with the same strict model, so nothing the
            # check below let through is reinterpreted on the way to the tool function.
            tool.fn_metadata.arg_model = model
            tool.parameters = published_schema(model)

    async def _handle_list_tools(self, ctx, params):
        # SPEC §15: the tools of the caller's run's hosted kodelet extensions come after ours.
        listed = await super()._handle_list_tools(ctx, params)
        ours = {tool.name for tool in listed.tools}
        hosted = await hosted_tools(Context(request_context=ctx, mcp_server=self))
        listed.tools.extend(tool for tool in hosted if tool.name not in ours)
        return listed

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context | None = None
    ) -> Any:
        tool = self._tool_manager.get_tool(name)
        try:
            if tool is None and context is not None:
                hosted = await call_hosted(context, name, arguments)
                if hosted is not None:
                    return hosted
            if tool is None:
                raise RpcError(METHOD_NOT_FOUND, f"unknown tool {name!r}")
            if issubclass(tool.fn_metadata.arg_model, StrictArguments):
                check(tool.fn_metadata.arg_model, arguments)
        except RpcError as error:
            return refused(error)
        return await super().call_tool(name, arguments, context)
