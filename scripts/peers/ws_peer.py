"""An independent WebSocket peer (Python `websockets`) for SocketStyles' interop tests.

  ws_peer.py server [CERT KEY] [--deflate]
      echo server on 127.0.0.1, port 0; prints "listening on ws://127.0.0.1:PORT/" (wss:// when given a
      certificate chain and key in PEM files) and serves until standard input closes
  ws_peer.py client URL [CA] [--deflate]
      connects, checks echoes of text and binary messages, a ping and a clean close; prints "ok" and exits 0,
      or prints the failure and exits 1. For wss:// URLs the server's certificate is verified against the CA
      file, host name included.

Compression is off unless --deflate is given; then it is websockets' default permessage-deflate (what it
offers and accepts out of the box), the client fails unless the server agreed to it, and JSON messages are
added to the echoes. The size limits are raised to 16 MiB.
"""
import json
import asyncio
import os
import ssl
import sys

import websockets


async def echo(connection):
    try:
        async for message in connection:
            await connection.send(message)
    except websockets.ConnectionClosed:
        pass


def compression():
    return "deflate" if "--deflate" in sys.argv else None


async def serve(cert=None, key=None):
    context = None
    if cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
    async with websockets.serve(
        echo, "127.0.0.1", 0, compression=compression(), max_size=16 * 1024 * 1024 + 1024, ssl=context
    ) as server:
        port = server.sockets[0].getsockname()[1]
        scheme = "wss" if context else "ws"
        print(f"listening on {scheme}://127.0.0.1:{port}/", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)


async def client(url, ca=None):
    context = None
    if url.startswith("wss:"):
        context = ssl.create_default_context(cafile=ca)  # verifies the chain and the host name
    async with websockets.connect(
        url, compression=compression(), max_size=16 * 1024 * 1024 + 1024, ssl=context
    ) as connection:
        if compression():
            agreed = [extension.name for extension in connection.protocol.extensions]
            if agreed != ["permessage-deflate"]:
                raise SystemExit(f"the server agreed to {agreed}, not permessage-deflate")
            for sequence in range(50):
                book = json.dumps({"type": "book", "sequence": sequence, "bids": [[100 - level, sequence % 7 + level]
                                   for level in range(40)], "asks": [[101 + level, level] for level in range(40)]})
                await connection.send(book)
                if await connection.recv() != book:
                    raise SystemExit(f"the echo of order book {sequence} differs")
        for size in (0, 1, 125, 126, 65535, 65536, 1024 * 1024):
            text = "é" * (size // 2)
            await connection.send(text)
            reply = await connection.recv()
            if reply != text:
                raise SystemExit(f"text echo of {size} bytes differs")
            data = os.urandom(size)
            await connection.send(data)
            reply = await connection.recv()
            if reply != data:
                raise SystemExit(f"binary echo of {size} bytes differs")
        pong = await connection.ping(b"ping?")
        await asyncio.wait_for(pong, 5)
        await connection.close(1000, "done")
        if connection.close_code != 1000:
            raise SystemExit(f"close code {connection.close_code}, expected 1000")
    print("ok", flush=True)


if __name__ == "__main__":
    arguments = [argument for argument in sys.argv[1:] if not argument.startswith("--")]
    if arguments[0] == "server":
        asyncio.run(serve(*arguments[1:3]))
    else:
        asyncio.run(client(*arguments[1:3]))
