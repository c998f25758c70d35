"""Writes an RS256 key pair for the MCP users' tokens: private.pem, public.pem.

    python keys.py <folder>
"""

from __future__ import annotations

import sys
from pathlib import Path

from fastmcp.server.auth.providers.jwt import RSAKeyPair


def main() -> None:
    folder = Path(sys.argv[1])
    keys = RSAKeyPair.generate()
    (folder / "private.pem").write_text(keys.private_key.get_secret_value(), encoding="utf-8")
    (folder / "public.pem").write_text(keys.public_key, encoding="utf-8")


if __name__ == "__main__":
    main()
