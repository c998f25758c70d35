"""An MCP server guarded by a third-party AuthZEN enforcement point, with toolgate as its PDP.

FastMCP serves the tools over Streamable HTTP and verifies each user's bearer
token (RS256, the public key given); apparitor's FastMCP middleware (the PEP)
asks toolgate's AuthZEN door about every ``tools/call`` before the tool runs,
with the verified token's ``sub`` as the subject. Nothing here decides: a
tool runs only when toolgate answered ``decision: true``.

Every refusal reaches the client as apparitor's fixed text, ``tool call not
authorized``: apparitor never forwards a PDP's reason to the model, and its
"requires human approval" refusal escalates only an allow, while toolgate
never answers ``true`` for a call that waits for an approver. A call that
needs one is refused the same way; toolgate holds its pending approval, and
the same call, once approved, runs once.

``tools/list`` is shaped by toolgate too, through AuthZEN Action Search
(``ListedByToolgate`` below): the tools this user could be allowed to call,
decided by Cedar partial evaluation. apparitor's own listing filter
(``filter_listings``) is not used: it asks about each tool as a call with
empty arguments, which toolgate answers as exactly that call, so a tool with
required arguments would be hidden from everyone.

Each tool that runs appends one JSON line to ``--runs`` (the tool and its
arguments), so a test can count what really ran.

    python server.py --port 8931 --pdp http://127.0.0.1:8080 \
        --public-key public.pem --runs runs.jsonl
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import httpx
from apparitor import ScannerConfig
from apparitor.fastmcp import FastMCPAuthorizationMiddleware
from apparitor.mapping import DefaultToolCallMapper
from fastmcp import FastMCP
from fastmcp.server.auth.providers.jwt import JWTVerifier
from fastmcp.server.dependencies import get_access_token
from fastmcp.server.middleware import Middleware

from orders import add_tools, append_line

ISSUER = "https://id.example.test"
AUDIENCE = "orders-mcp"

class ListedByToolgate(Middleware):  # type: ignore[misc]
    """Shows only the tools toolgate's Action Search answers for the verified user.

    Fails closed: no verified token, a PDP error or an answer that is not the
    spec's shape hides every tool.
    """

    def __init__(self, pdp: str, server: str) -> None:
        super().__init__()
        self._url = pdp.rstrip("/") + "/access/v1/search/action"
        self._server = server

    async def on_list_tools(self, context: Any, call_next: Any) -> Any:
        tools = await call_next(context)
        token = get_access_token()
        sub = (token.claims or {}).get("sub") if token is not None else None
        if not isinstance(sub, str) or not sub:
            return []
        request = {
            "subject": {
                "type": "identity",
                "id": sub,
                "properties": {"scopes": list(token.scopes)},
            },
            "resource": {"type": "mcp_server", "id": self._server},
        }
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                response = await client.post(self._url, json=request)
            response.raise_for_status()
            results = response.json()["results"]
            allowed = {r["name"] for r in results if isinstance(r.get("name"), str)}
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return []
        return [tool for tool in tools if tool.name in allowed]


def build(pdp: str, public_key: str, runs: Path) -> FastMCP:
    server = FastMCP(
        "orders",
        auth=JWTVerifier(public_key=public_key, issuer=ISSUER, audience=AUDIENCE),
    )
    config = ScannerConfig(
        pdp_url=pdp,
        # The PDP is toolgate on loopback: apparitor refuses non-HTTPS and
        # loopback PDPs unless told this is a local deployment.
        allow_insecure_pdp=True,
        # COAZ-MCP's default tools/call mapping: action tools/call, resource
        # {type: tool, id: <tool name>}, with the arguments sent unredacted
        # (toolgate validates, hashes and binds approvals to them).
        action_name="tools/call",
        resource_type="tool",
        redact_arguments=False,
        max_argument_bytes=65536,
        # One attempt: a PEP that retries a tools/call on its own makes each
        # retry its own operation.
        max_retries=0,
    )
    server.add_middleware(
        FastMCPAuthorizationMiddleware(
            config=config,
            subject_type="identity",
            mapper=DefaultToolCallMapper(config),
            gate_resources=False,
            gate_prompts=False,
        )
    )
    server.add_middleware(ListedByToolgate(pdp, "orders"))

    add_tools(server, lambda tool, arguments: append_line(runs, {"tool": tool, "arguments": arguments}))
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pdp", required=True, help="toolgate's base URL")
    parser.add_argument("--public-key", type=Path, required=True)
    parser.add_argument("--runs", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    server = build(args.pdp, args.public_key.read_text(encoding="utf-8"), args.runs)
    server.run(transport="http", host="127.0.0.1", port=args.port, show_banner=False)


if __name__ == "__main__":
    main()
