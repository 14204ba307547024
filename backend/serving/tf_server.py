"""The embedded server's process: `transformers serve` behind a bearer token. Imports transformers.

`transformers serve` (5.25) has no API key option, so this entry point wraps the FastAPI app it builds
(`transformers.cli.serving.server.build_server`) with a middleware that answers 401 to any request
without `Authorization: Bearer <token>` (the token comes in FINETUNE_STUDIO_SERVE_TOKEN, never argv,
so `ps` does not show it). /health stays open: the launcher polls it before it knows the server is up.
The process ends with its client (FINETUNE_STUDIO_CLIENT_PID), as a worker does.

    python -m backend.serving.tf_server MODEL_DIR --port N --device cpu [--continuous-batching ...]
"""

from __future__ import annotations

import hmac
import os
import sys
import threading
import time
from typing import Any

from backend.training.model import packed_zero_points

TOKEN_ENV = "FINETUNE_STUDIO_SERVE_TOKEN"
OPEN_PATHS = frozenset({"/health"})


class BearerAuth:
    """ASGI middleware: 401 unless the request carries the token (constant-time compare)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        body = b'{"error": {"message": "missing or wrong API key: send Authorization: Bearer <token>", ' \
               b'"type": "invalid_request_error", "code": "invalid_api_key"}}'
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def install_auth(token: str) -> None:
    """Make every app `transformers serve` builds in this process require `token`."""
    from transformers.cli.serving import server

    original = server.build_server

    def build_server(*args: Any, **kwargs: Any) -> Any:
        app = original(*args, **kwargs)
        app.add_middleware(BearerAuth, token=token)
        return app

    server.build_server = build_server


def no_kernel_fallback() -> None:
    """Continuous batching swaps a half-precision model to flash attention and, without the flash_attn
    package, fetches `kernels-community/flash-attn` from the Hub (or loads a cached copy) with no flag to
    stop it; USE_HUB_KERNELS=0 does not reach that path, so the check it calls answers no here (and in
    the model's process, which imports this module as __mp_main__)."""
    from transformers.utils import import_utils

    import_utils.is_flash_attn_kernel_fallback_available = lambda fa_version: False


def watch_client() -> None:
    """Exit when the client that started us is gone, so a killed CLI or studio leaves no server behind."""
    raw = os.environ.get("FINETUNE_STUDIO_CLIENT_PID", "")
    if not raw.isdigit() or int(raw) == os.getpid():
        return
    from backend.runtime.processes import alive

    def run() -> None:
        while alive(int(raw)):
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=run, name="client-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        print(f"{TOKEN_ENV} is not set: the server refuses to start without a token", file=sys.stderr)
        return 2
    watch_client()
    install_auth(token)
    no_kernel_fallback()
    packed_zero_points.allow()  # awq-int4's asymmetric groups (backend/training/model/packed_zero_points.py)
    from transformers.cli.transformers import app  # its main() would first ask the Hub for a CLI update

    sys.argv = ["transformers", "serve", *argv]
    app()
    return 0


if __name__ == "__mp_main__":  # the model's process, which multiprocessing spawns afresh from this module
    no_kernel_fallback()
    packed_zero_points.allow()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
