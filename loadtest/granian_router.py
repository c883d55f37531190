"""``qstate router`` with its HTTP served by granian (embedded in the router's asyncio loop)
instead of uvicorn, for ``loadtest.bench_server`` only:

    python -m loadtest.granian_router --http-port 8000 --grpc-port 50051 --storage ...

The router's own code, one line swapped: ``qstate.router.main`` builds a ``uvicorn.Server``
from its config and awaits ``serve()``; here that server is granian's ``embed.Server`` over
the same ASGI app, host and port (TLS and the workers' shared socket are not carried over).
"""

from __future__ import annotations

import sys
from typing import Any

from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.server.embed import Server

from qstate.router import main as router_main


class _Granian:
    def __init__(self, config: Any) -> None:
        self.config = config
        self.should_exit = False

    async def serve(self, sockets: Any = None) -> None:
        await Server(self.config.app, address=self.config.host, port=self.config.port,
                     interface=Interfaces.ASGI, http=HTTPModes.http1, websockets=False,
                     log_level=LogLevels.warning).serve()


if __name__ == "__main__":
    router_main.uvicorn.Server = _Granian  # type: ignore[misc,assignment]
    from qstate.cli import main

    sys.argv = ["qstate", "router", *sys.argv[1:]]
    main()
