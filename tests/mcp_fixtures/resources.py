"""Python resources for the MCP resource tests (named in ``mcp.expose_resources``)."""

from __future__ import annotations

from openstarry.mcp.resources import resource


@resource("notes://today", description="Today's note.")
def today() -> str:
    return "Buy milk."


@resource("notes://day/{day}", mime_type="text/markdown")
async def day(day: str) -> str:
    return f"# Notes of {day}"
