"""Server memory per WebSocket connection, with and without permessage-deflate (scripts/deflate-memory).

  ws_memory.py URL PID COUNT   opens COUNT connections to URL without compression, then COUNT with websockets'
                               default permessage-deflate; on each, one 1.1 KB JSON message is echoed (so the
                               server has inflated and compressed once); reads the server's resident memory
                               (/proc/PID/status VmRSS) before and with every connection open, prints one line
                               per mode: "MODE: N connections, +X KiB resident, Y KiB per connection"
"""
import asyncio
import json
import sys

import websockets


def resident_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit("no VmRSS")


async def measure(url, pid, count, compression):
    book = json.dumps({"type": "book", "bids": [[100 - level, level] for level in range(40)],
                       "asks": [[101 + level, level] for level in range(40)]})
    before = resident_kib(pid)
    connections = []
    for _ in range(count):
        connection = await websockets.connect(url, compression=compression, max_queue=4)
        await connection.send(book)
        if await connection.recv() != book:
            raise SystemExit("echo differs")
        if compression and not connection.protocol.extensions:
            raise SystemExit("the server did not agree to permessage-deflate")
        connections.append(connection)
    await asyncio.sleep(0.5)
    after = resident_kib(pid)
    for connection in connections:
        await connection.close()
    await asyncio.sleep(0.5)
    mode = "deflate" if compression else "plain"
    print(f"{mode}: {count} connections, +{after - before} KiB resident, {(after - before) / count:.1f} KiB per"
          " connection", flush=True)


async def main(url, pid, count):
    await measure(url, pid, count, None)
    await measure(url, pid, count, "deflate")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
