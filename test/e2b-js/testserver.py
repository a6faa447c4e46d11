# A small HTTP and WebSocket server that basic.test.mjs runs inside a
# sandbox to check E2B host routing (https://<port>-<id>.<domain>) through
# the daemon: GET serves files from the directory given; a WebSocket
# upgrade (on any path, as websockify's /websockify) is accepted, greets
# with an RFB-like banner like a VNC server behind websockify would, then
# echoes every message back.
#
# usage: python3 testserver.py PORT DIRECTORY

import base64
import functools
import hashlib
import http.server
import sys

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() != "websocket":
            return super().do_GET()
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        if "binary" in self.headers.get("Sec-WebSocket-Protocol", ""):
            self.send_header("Sec-WebSocket-Protocol", "binary")
        self.end_headers()
        self.send_message(b"RFB 003.008\n")
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                break
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = int.from_bytes(self.rfile.read(2), "big")
            elif n == 127:
                n = int.from_bytes(self.rfile.read(8), "big")
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if opcode == 8:
                break
            self.send_message(data)
        self.close_connection = True

    def send_message(self, data):
        assert len(data) < 126
        self.wfile.write(bytes([0x82, len(data)]) + data)
        self.wfile.flush()


def main():
    port, directory = int(sys.argv[1]), sys.argv[2]
    handler = functools.partial(Handler, directory=directory)
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as srv:
        srv.serve_forever()


if __name__ == "__main__":
    main()
