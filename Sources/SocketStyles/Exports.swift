// What `import SocketStyles` brings: the contract, every backend, the WebSocket and TLS layers. Of the system-call
// layer (POSIXSupport) only `SocketAddress` is re-exported: native-style APIs (libuv's `UVTCP.connect(to:)`, the
// datagram calls) take one; `HostPins`, names the process resolves itself (as curl's --resolve); and `ShutdownHow`, which `BSDSocket.shutdown(_:)` takes. `Syscall`, threads and the epoll loop stay internal to the package.
@_exported public import AsyncBackend
@_exported public import BSDSocketBackend
@_exported public import ConnectionCore
@_exported public import LibUVBackend
@_exported public import NIOBackend
@_exported public import RunLoopBackend
@_exported public import TLSTransport
@_exported public import UringBackend
@_exported public import WebSocketCodec
@_exported public import WebSocketTransport

@_exported public import enum POSIXSupport.HostPins
@_exported public import enum POSIXSupport.ShutdownHow
@_exported public import struct POSIXSupport.SocketAddress
