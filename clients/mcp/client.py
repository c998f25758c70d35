"""One MCP client step against server.py, printed as one JSON line.

The official MCP Python SDK's Streamable HTTP client, with a bearer token
for ``--subject`` signed by ``--private-key`` (the key pair keys.py wrote).

    python client.py --url http://127.0.0.1:8931/mcp --private-key private.pem \
        --public-key public.pem --subject alice --scope orders:read \
        call get_order '{"order_id": "ord_1001"}'
    python client.py ... list
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from fastmcp.server.auth.providers.jwt import RSAKeyPair
from pydantic import SecretStr

from orders import session_step
from server import AUDIENCE, ISSUER


async def step(args: argparse.Namespace) -> dict:
    keys = RSAKeyPair(
        private_key=SecretStr(args.private_key.read_text(encoding="utf-8")),
        public_key=args.public_key.read_text(encoding="utf-8"),
    )
    token = keys.create_token(
        subject=args.subject,
        issuer=ISSUER,
        audience=AUDIENCE,
        scopes=args.scope,
        expires_in_seconds=300,
    )
    headers = {"Authorization": f"Bearer {token}"}
    return await session_step(
        args.url, headers, args.command, getattr(args, "tool", ""), getattr(args, "arguments", "{}")
    )

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--private-key", type=Path, required=True)
    parser.add_argument("--public-key", type=Path, required=True)
    parser.add_argument("--subject", required=True)
    parser.add_argument("--scope", action="append", default=[])
    commands = parser.add_subparsers(dest="command", required=True)
    call = commands.add_parser("call")
    call.add_argument("tool")
    call.add_argument("arguments")
    commands.add_parser("list")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(asyncio.wait_for(step(args), timeout=30)), sort_keys=True))


if __name__ == "__main__":
    main()
