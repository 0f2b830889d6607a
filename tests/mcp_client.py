"""A real MCP client (the official Python SDK, `mcp`) for tests/tests/mcp.rs.

Starts the server command given after `--` over stdio, initializes, lists the tools, makes
the calls given as JSON in argv[1] (a list of [tool, arguments]) and prints one JSON document:
{"server": name, "instructions": ..., "tools": [{"name", "description", "read_only"}],
 "calls": [{"tool", "is_error", "texts": [...], "structured": ...}]}.
A tool call that the server refuses as a protocol error is {"tool", "protocol_error": message}.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(calls, command):
    params = StdioServerParameters(command=command[0], args=command[1:])
    out = {"calls": []}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out["server"] = init.server_info.name
            out["instructions"] = init.instructions
            tools = await session.list_tools()
            out["tools"] = [
                {
                    "name": t.name,
                    "description": t.description,
                    "read_only": bool(t.annotations and t.annotations.read_only_hint),
                }
                for t in tools.tools
            ]
            for tool, arguments in calls:
                try:
                    r = await session.call_tool(tool, arguments)
                except Exception as e:  # the server's JSON-RPC error, as the SDK raises it
                    out["calls"].append({"tool": tool, "protocol_error": str(e)})
                    continue
                out["calls"].append(
                    {
                        "tool": tool,
                        "is_error": bool(r.is_error),
                        "texts": [c.text for c in r.content if getattr(c, "type", "") == "text"],
                        "structured": r.structured_content,
                    }
                )
    json.dump(out, sys.stdout)


# A server that stops answering fails the test instead of hanging it.
TIMEOUT_S = 90

if __name__ == "__main__":
    sep = sys.argv.index("--")
    calls, command = json.loads(sys.argv[1]), sys.argv[sep + 1 :]
    try:
        asyncio.run(asyncio.wait_for(main(calls, command), TIMEOUT_S))
    except TimeoutError:
        sys.exit(f"mcp_client.py: no answer from {command} within {TIMEOUT_S} s")
