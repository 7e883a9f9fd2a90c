"""Tools and helpers for the MCP server tests (importable as ``mcp_fixtures``)."""
