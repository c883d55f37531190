"""``loadtest.raw_asgi`` served by granian embedded in an asyncio loop (uvloop), as
``loadtest.granian_router`` serves the router: ``python -m loadtest.raw_granian PORT``."""

from __future__ import annotations

import sys

import uvloop
from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.server.embed import Server

from loadtest.raw_asgi import app


async def _serve(port: int) -> None:
    await Server(app, address="127.0.0.1", port=port, interface=Interfaces.ASGI,
                 http=HTTPModes.http1, websockets=False, log_level=LogLevels.warning).serve()


if __name__ == "__main__":
    uvloop.run(_serve(int(sys.argv[1])))
