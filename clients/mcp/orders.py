"""What the gateway tests' MCP servers and clients share.

The three order tools (``add_tools``), each reporting its run through a
callback before it answers, and one MCP client step (``session_step``) with
the official MCP Python SDK's Streamable HTTP client. ``server.py`` and
``client.py`` here (behind an AuthZEN enforcement point) and
``clients/envoy``'s (behind Envoy) are thin around them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastmcp import FastMCP
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

Ran = Callable[[str, dict[str, Any]], None]


def add_tools(server: FastMCP, ran: Ran) -> None:
    """get_order, refund_order and delete_account; each calls ``ran`` first."""

    @server.tool
    def get_order(order_id: str) -> dict[str, Any]:
        """Look up one order by id: status, items and totals."""
        ran("get_order", {"order_id": order_id})
        return {"order_id": order_id, "status": "delivered", "total_cents": 50000}

    @server.tool
    def refund_order(
        order_id: str, amount_cents: int, currency: str, reason: str
    ) -> dict[str, Any]:
        """Refund part or all of an order to the original payment method."""
        ran(
            "refund_order",
            {
                "order_id": order_id,
                "amount_cents": amount_cents,
                "currency": currency,
                "reason": reason,
            },
        )
        return {"refund_id": f"re_{order_id}", "status": "succeeded"}

    @server.tool
    def delete_account(customer_id: str, confirm: bool, reason: str) -> dict[str, Any]:
        """Permanently delete a customer account."""
        ran(
            "delete_account",
            {"customer_id": customer_id, "confirm": confirm, "reason": reason},
        )
        return {"deleted": customer_id}


def append_line(path: Path, line: dict[str, Any]) -> None:
    """One JSON line appended to ``path`` and synced before the tool answers."""
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line, sort_keys=True) + "\n")
        out.flush()
        os.fsync(out.fileno())


async def session_step(
    url: str, headers: dict[str, str], command: str, tool: str = "", arguments: str = "{}"
) -> dict[str, Any]:
    """``list`` the tools, or ``call`` one with its JSON ``arguments``."""
    async with streamablehttp_client(
        url, headers=headers, timeout=timedelta(seconds=10)
    ) as (read, write, _):
        async with ClientSession(
            read, write, read_timeout_seconds=timedelta(seconds=10)
        ) as session:
            await session.initialize()
            if command == "list":
                listed = await session.list_tools()
                return {"tools": sorted(t.name for t in listed.tools)}
            result = await session.call_tool(tool, json.loads(arguments))
            return {
                "isError": result.isError,
                "text": [c.text for c in result.content if c.type == "text"],
                "structured": result.structuredContent,
            }
