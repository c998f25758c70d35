"""An MCP server behind Envoy, whose ext_authz filter asks toolgate about every request.

A plain FastMCP server over Streamable HTTP with no authorization of its own:
Envoy sits in front of it (the "Behind Envoy" configuration of docs/gateways.md) and lets
a request through only when toolgate's ``Authorization/Check`` answered OK.
Nothing here decides.

Each tool that runs appends one JSON line to ``--runs``: the tool, its
arguments and every ``toolgate-*`` header the request reached it with, so a
test can count what really ran and see that only toolgate's headers arrive.

    python server.py --port 8931 --runs runs.jsonl
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.dependencies import get_http_request

# The order tools are clients/mcp's, shared with the AuthZEN gateway test.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "mcp"))
from orders import add_tools, append_line  # noqa: E402


def build(runs: Path) -> FastMCP:
    server = FastMCP("orders")

    def ran(tool: str, arguments: dict[str, Any]) -> None:
        headers = {
            name: value
            for name, value in get_http_request().headers.items()
            if name.lower().startswith("toolgate-")
        }
        append_line(runs, {"tool": tool, "arguments": arguments, "headers": headers})

    add_tools(server, ran)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--runs", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    build(args.runs).run(
        transport="http", host="127.0.0.1", port=args.port, show_banner=False
    )


if __name__ == "__main__":
    main()
