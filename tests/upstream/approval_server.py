"""A tiny stdio MCP server for the approval gates (tests/mcp/approval_client.py), on the
official Python SDK.

- `delete_repo(name)`: gated by a `require_approval` name pattern in the test;
- `drop_table(table)`: annotated `destructiveHint: true`;
- `read_note()`: neither.

Every call that reaches it is appended to the file named by $APPROVAL_CALLS, so the test
can tell that a refused call never got here.
"""

import os

from mcp.server import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("fixture")


def note(line: str) -> None:
    with open(os.environ["APPROVAL_CALLS"], "a") as f:
        f.write(line + "\n")


@server.tool()
def delete_repo(name: str) -> str:
    """Deletes a repository (pretends to)."""
    note(f"delete_repo {name}")
    return f"deleted {name}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def drop_table(table: str) -> str:
    """Drops a table (pretends to)."""
    note(f"drop_table {table}")
    return f"dropped {table}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_note() -> str:
    """Reads a note."""
    note("read_note")
    return "a note"


if __name__ == "__main__":
    server.run()
