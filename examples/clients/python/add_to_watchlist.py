"""Adds a movie to the signed-in user's watch list with the official Python SDK, on MCP 2026-07-28:
the SDK runs the MRTR rounds itself and hands the server's question to the elicitation callback.

    python add_to_watchlist.py URL TOKEN [MOVIE_ID]      (or MCP_URL, MCP_TOKEN, MOVIE_ID)
"""
import asyncio
import json
import os
import sys

import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

URL = sys.argv[1] if len(sys.argv) > 1 else os.environ["MCP_URL"]
TOKEN = sys.argv[2] if len(sys.argv) > 2 else os.environ["MCP_TOKEN"]
MOVIE_ID = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("MOVIE_ID", "6")
# "2026-07-28" speaks the stateless revision; "legacy" would open a 2025-11-25 session instead.
ERA = os.environ.get("MCP_ERA", "2026-07-28")


async def answer(context, params: types.ElicitRequestParams) -> types.ElicitResult:
    print(f"the server asks: {params.message}", file=sys.stderr)
    return types.ElicitResult(action="accept", content={"status": "WATCHED"})


async def main() -> types.CallToolResult:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        transport = streamable_http_client(URL, http_client=http)
        async with Client(transport, mode=ERA, elicitation_callback=answer) as client:
            return await client.call_tool("addToWatchlist", {"subject": {"movieId": MOVIE_ID}})


result = asyncio.run(main())
if result.is_error:
    sys.exit(f"tool error: {result.content[0].text}")
print(json.dumps(result.structured_content, indent=2))
