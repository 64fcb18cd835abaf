"""A tiny stdio MCP server for tests/upstream.rs, on the official Python SDK.

- `add_tool(name)` registers a tool `name` (answering "I am <name>") and sends
  notifications/tools/list_changed.
- tools/list is paginated, two tools a page, so the client has to follow nextCursor.
"""

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp_types import ListToolsResult

PAGE = 2


async def paginated_list_tools(self, ctx, params):
    tools = await self.list_tools()
    start = int(params.cursor) if params is not None and params.cursor else 0
    end = start + PAGE
    return ListToolsResult(
        tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None
    )


# Before construction: the server binds the handler when it is created.
MCPServer._handle_list_tools = paginated_list_tools

server = MCPServer("dynamic")


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Registers a new tool and tells the client the list changed."""

    def added() -> str:
        return f"I am {name}"

    server.add_tool(added, name=name, description="added at run time")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


for n in ("first", "second", "third"):

    def make(n=n):
        def static() -> str:
            return n

        return static

    server.add_tool(make(), name=f"static_{n}", description=f"static tool {n}")

if __name__ == "__main__":
    server.run()
