"""A stand-in for the Hugging Face Hub's file interface on loopback, for tests without the
internet (the client and our server are pointed at it with HF_ENDPOINT).

It serves what huggingface_hub asks of a file: `HEAD` and `GET /{repo}/resolve/{rev}/{path}`
with `X-Repo-Commit`, an `ETag` that is the file's SHA-256 (as the Hub states for files in
LFS), `Content-Length`, `Range` requests answered with 206, and `X-Error-Code` on a 404.
Faults on cue: `cut` files are cut off half-way on their first GET (the connection closes),
`corrupt` files are served with one byte changed under the true checksum, and a `hang_up`
hub closes every connection unanswered (a proxy, a captive portal or another server on the
port: the exchange breaks, nothing refuses it).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    files: dict[str, dict[str, Path]] = field(default_factory=dict)  # repo → path → file
    cut: set[str] = field(default_factory=set)  # paths cut off on their first GET
    corrupt: set[str] = field(default_factory=set)  # paths served with a byte changed
    hang_up: bool = False  # every request closed without an answer
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range
    _server: ThreadingHTTPServer | None = None

    def add(self, repo: str, path: str, source: Path) -> None:
        self.files.setdefault(repo, {})[path] = source

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def gets(self, path: str) -> list[str | None]:
        """The Range header of each GET of `path` (None: the whole file)."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + path)]

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                path = unquote(self.path.split("?")[0])
                hub.requests.append((self.command, path, self.headers.get("Range")))
                if hub.hang_up:
                    self.close_connection = True
                    return
                parts = path.strip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    return self._missing("RepoNotFound")
                repo, filename = "/".join(parts[:2]), "/".join(parts[4:])
                if repo not in hub.files:
                    return self._missing("RepoNotFound")
                source = hub.files[repo].get(filename)
                if source is None:
                    return self._missing("EntryNotFound")
                data = source.read_bytes()
                etag = hashlib.sha256(data).hexdigest()
                if filename in hub.corrupt:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                start = 0
                asked = self.headers.get("Range")
                if asked and asked.startswith("bytes="):
                    start = int(asked[6:].split("-")[0])
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if not body:
                    return
                if filename in hub.cut and start == 0:
                    hub.cut.discard(filename)  # once
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

            def _missing(self, code: str) -> None:
                self.send_response(404)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
