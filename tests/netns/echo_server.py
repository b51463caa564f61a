"""A pod's test server: HTTP on 8080 and a TCP line echo on 9000, both answering who they are
and which source address they saw: ``<identity> <client address>``. Prints ``ready`` once bound.

Run inside a pod namespace: ``ip netns exec NS python echo_server.py IDENTITY``.
"""

from __future__ import annotations

import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

IDENTITY = sys.argv[1] if len(sys.argv) > 1 else "pod"


class Http(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"{IDENTITY} {self.client_address[0]}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Echo(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline().decode().strip()
        self.wfile.write(f"{IDENTITY} {self.client_address[0]} {line}\n".encode())


class TcpServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def main() -> None:
    http = ThreadingHTTPServer(("0.0.0.0", 8080), Http)
    http.daemon_threads = True
    tcp = TcpServer(("0.0.0.0", 9000), Echo)
    threading.Thread(target=tcp.serve_forever, daemon=True).start()
    print("ready", flush=True)
    http.serve_forever()


if __name__ == "__main__":
    main()
