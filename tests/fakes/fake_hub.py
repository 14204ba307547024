"""FakeHub: a local HTTP server that answers the few Hub calls a model download makes.

`model_info` (file list, sizes, commit) and `resolve` (HEAD and ranged GET of one file), serving
the files of a local folder as repository `repo_id`. Tests point `HubDownload(endpoint=...)` at it,
so the real huggingface_hub client code runs with no network. `delay` slows each 64 KiB chunk so a
test can cancel mid-file; `gated` answers as a gated repository does.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SHA = "0123456789abcdef0123456789abcdef01234567"
CHUNK = 64 * 1024


class FakeHub:
    def __init__(self, repo_id: str, folder: Path, delay: float = 0.0, gated: bool = False) -> None:
        self.repo_id, self.folder, self.delay, self.gated = repo_id, folder, delay, gated
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
                hub.requests.append(f"HEAD {self.path}")
                self._resolve(body=False)

            def do_GET(self) -> None:  # noqa: N802
                hub.requests.append(f"GET {self.path}")
                if self.path.startswith("/api/models/"):
                    self._model_info()
                else:
                    self._resolve(body=True)

            def _refuse(self, status: int, code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _model_info(self) -> None:
                repo = self.path.split("?")[0][len("/api/models/"):].split("/revision/")[0]
                if repo != hub.repo_id:
                    return self._refuse(401, "RepoNotFound", "Repository not found")
                if hub.gated:
                    return self._refuse(403, "GatedRepo", "Access to this model is restricted")
                siblings = [{"rfilename": name, "size": path.stat().st_size, "blobId": hub.etag(name)}
                            for name, path in hub.files()]
                body = json.dumps({"id": repo, "modelId": repo, "sha": SHA, "siblings": siblings,
                                   "private": False, "tags": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _resolve(self, body: bool) -> None:
                prefix = f"/{hub.repo_id}/resolve/"
                if not self.path.startswith(prefix):
                    return self._refuse(404, "EntryNotFound", "Entry not found")
                _, _, name = self.path[len(prefix):].partition("/")
                path = hub.folder / name
                if not path.is_file():
                    return self._refuse(404, "EntryNotFound", "Entry not found")
                data = path.read_bytes()
                start = 0
                ranged = self.headers.get("Range", "")
                if ranged.startswith("bytes="):
                    start = int(ranged[len("bytes="):].split("-")[0] or 0)
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("ETag", f'"{hub.etag(name)}"')
                self.send_header("X-Repo-Commit", SHA)
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if not body:
                    return
                for offset in range(start, len(data), CHUNK):
                    try:
                        self.wfile.write(data[offset:offset + CHUNK])
                        self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        return
                    if hub.delay:
                        time.sleep(hub.delay)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def files(self) -> list[tuple[str, Path]]:
        return sorted((p.relative_to(self.folder).as_posix(), p) for p in self.folder.rglob("*") if p.is_file())

    def etag(self, name: str) -> str:
        return hashlib.sha1((self.folder / name).read_bytes()).hexdigest()

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
