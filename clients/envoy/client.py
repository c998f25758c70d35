"""One MCP client step through Envoy, printed as one JSON line.

The official MCP Python SDK's Streamable HTTP client, sending ``--token`` as
its bearer token (none when not given) and any extra ``--header name=value``
(a test forges ``toolgate-*`` headers with it).

    python client.py --url http://127.0.0.1:10000/mcp --token eyJ... \
        call get_order '{"order_id": "ord_1001"}'
    python client.py --url ... list

A step the transport fails prints ``{"failed": ...}``: for an HTTP error
(Envoy answering ``401``, say) its status and ``WWW-Authenticate``, else the
exception's type.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator

import sys
from pathlib import Path

import httpx

# The client step is clients/mcp's, shared with the AuthZEN gateway test.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "mcp"))
from orders import session_step  # noqa: E402


async def step(args: argparse.Namespace) -> dict:
    headers = dict(h.split("=", 1) for h in args.header)
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    return await session_step(
        args.url, headers, args.command, getattr(args, "tool", ""), getattr(args, "arguments", "{}")
    )

def leaves(e: BaseException) -> Iterator[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(e, BaseExceptionGroup):
        for inner in e.exceptions:
            yield from leaves(inner)
    else:
        yield e


async def guarded(args: argparse.Namespace) -> dict:
    try:
        return await asyncio.wait_for(step(args), timeout=30)
    except Exception as e:  # noqa: BLE001 - the step's failure is the answer
        for leaf in leaves(e):
            if isinstance(leaf, httpx.HTTPStatusError):
                return {
                    "failed": "http",
                    "status": leaf.response.status_code,
                    "www-authenticate": leaf.response.headers.get("www-authenticate"),
                }
        return {"failed": type(e).__name__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", default="")
    parser.add_argument("--header", action="append", default=[])
    commands = parser.add_subparsers(dest="command", required=True)
    call = commands.add_parser("call")
    call.add_argument("tool")
    call.add_argument("arguments")
    commands.add_parser("list")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(guarded(args)), sort_keys=True))


if __name__ == "__main__":
    main()
