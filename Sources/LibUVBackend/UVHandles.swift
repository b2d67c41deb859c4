internal import CLibUV
@_spi(Loop) import ConnectionCore
internal import Glibc
public import POSIXSupport

/// What every libuv handle shares: its loop, its memory, and closing.
///
/// A handle object is created on the loop thread and used only there. It stays alive (retained through the
/// handle's data pointer) from its creation until libuv's close callback has run, however many Swift
/// references are dropped before; its memory is released after that callback, never before.
public class UVHandle: @unchecked Sendable {
    /// The loop this handle belongs to.
    public let loop: UVLoop
    let handle: UnsafeMutableRawPointer
    private var closeCallback: (() -> Void)?
    private(set) var isClosing = false

    init(loop: UVLoop, size: Int) {
        precondition(loop.isOnLoopThread, "libuv handles are created on their loop's thread")
        self.loop = loop
        self.handle = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 16)
    }

    /// Attaches this object to the initialised handle (one retain, dropped in the close callback).
    func attach() {
        uv_handle_set_data(csuv_handle(handle), Unmanaged.passRetained(self).toOpaque())
    }

    deinit {
        handle.deallocate()
    }

    /// `uv_close`: stops the handle; `callback` runs (on the loop) once libuv is done with it. Closing twice is a
    /// no-op.
    public func close(_ callback: (() -> Void)? = nil) {
        guard !isClosing else { return }
        isClosing = true
        closeCallback = callback
        uv_close(csuv_handle(handle), uvHandleClosed)
    }

    fileprivate func didClose() {
        let callback = closeCallback
        closeCallback = nil
        releaseCallbacks()
        callback?()
    }

    /// Drops the callbacks a subclass keeps once libuv can no longer call them. A callback usually captures its
    /// handle (a read callback that stops reading), so keeping it would keep the handle, and its read buffer,
    /// alive forever: a cycle per connection (the libuv backend's memory once grew by ~64 KiB per connection).
    func releaseCallbacks() {}
}

private let uvHandleClosed: @convention(c) (UnsafeMutablePointer<uv_handle_t>?) -> Void = { handle in
    let object = Unmanaged<UVHandle>.fromOpaque(uv_handle_get_data(handle)).takeRetainedValue()
    object.didClose()
}

/// What a read callback receives.
public enum UVReadResult {
    /// Bytes that arrived (valid only during the callback).
    case data(UnsafeRawBufferPointer)
    /// The peer finished sending (`UV_EOF`).
    case endOfStream
    /// A read error.
    case failure(UVError)
}

/// A TCP handle (`uv_tcp_t`): connect, listen/accept, read, write, shutdown.
public final class UVTCP: UVHandle, @unchecked Sendable {
    private var onRead: ((UVReadResult) -> Void)?
    private var onConnection: ((UVError?) -> Void)?
    /// Between ``readStart(_:)`` and the close.
    private var reading = false
    /// The size of the reads libuv makes: a read callback with fewer bytes emptied the socket.
    let readBufferSize: Int
    /// Writes from other threads (``writeFromAnyThread(_:)``).
    private let direct = DirectSend()

    /// `uv_tcp_init_ex` on `loop` (call on the loop thread). `readBufferSize` is what the alloc callback hands out
    /// for each read: the loop thread's buffer (`ThreadReadBuffer`), shared by every handle of the loop, since
    /// each read is consumed inside its read callback; an idle connection keeps no read buffer. With a
    /// `family`, the socket is made now (a listener sets options on it before binding); without, at bind or connect.
    public init(loop: UVLoop, readBufferSize: Int = 64 * 1024, family: SocketAddress.Family? = nil) throws(UVError) {
        self.readBufferSize = readBufferSize
        super.init(loop: loop, size: MemoryLayout<uv_tcp_t>.size)
        let domain = family.map { $0 == .ipv4 ? AF_INET : AF_INET6 } ?? AF_UNSPEC
        try UVError.check(uv_tcp_init_ex(loop.raw, handle.assumingMemoryBound(to: uv_tcp_t.self), UInt32(domain)))
        attach()
    }

    var tcp: UnsafeMutablePointer<uv_tcp_t> { handle.assumingMemoryBound(to: uv_tcp_t.self) }

    override func releaseCallbacks() {
        onRead = nil
        onConnection = nil
        reading = false
    }

    /// `uv_tcp_bind`. With `reusePort`, SO_REUSEPORT first (on a handle made with ``init(loop:readBufferSize:family:)``
    /// for the address's family, whose socket exists before the bind): listeners on several loops then share the
    /// address, and the kernel spreads new connections over them.
    public func bind(_ address: SocketAddress, reusePort: Bool = false) throws(UVError) {
        if reusePort { try setReusePort(on: handle) }
        let status = address.withSockAddr { pointer, _ in uv_tcp_bind(tcp, pointer, 0) }
        try UVError.check(status)
    }

    /// `uv_listen`: `onConnection` runs for each incoming connection; call ``accept()`` in it.
    public func listen(backlog: Int32, onConnection: @escaping (UVError?) -> Void) throws(UVError) {
        self.onConnection = onConnection
        try UVError.check(uv_listen(csuv_stream(handle), backlog, uvConnection))
    }

    fileprivate func connectionArrived(_ status: Int32) {
        onConnection?(status < 0 ? UVError(status) : nil)
    }

    /// `uv_accept` into a new TCP handle.
    public func accept() throws(UVError) -> UVTCP {
        let client = try UVTCP(loop: loop, readBufferSize: readBufferSize)
        let status = uv_accept(csuv_stream(handle), csuv_stream(client.handle))
        if status < 0 {
            client.close()
            throw UVError(status)
        }
        return client
    }

    /// `uv_tcp_connect`: `callback` gets `nil` once connected, or the error.
    public func connect(to address: SocketAddress, _ callback: @escaping (UVError?) -> Void) throws(UVError) {
        let request = UVRequest<uv_connect_t> { status in callback(status < 0 ? UVError(status) : nil) }
        let status = address.withSockAddr { pointer, _ in uv_tcp_connect(request.raw, tcp, pointer, uvConnectDone) }
        if status < 0 {
            request.abandon()
            throw UVError(status)
        }
    }

    /// `uv_read_start`: `onRead` runs for each read (data, end of stream, or error).
    public func readStart(_ onRead: @escaping (UVReadResult) -> Void) throws(UVError) {
        self.onRead = onRead
        reading = true
        try UVError.check(uv_read_start(csuv_stream(handle), uvAllocate, uvRead))
    }

    /// `uv_read_stop`: no read callbacks until ``readStart(_:)`` again; the kernel buffers, then TCP flow
    /// control slows the peer.
    public func readStop() {
        uv_read_stop(csuv_stream(handle))
    }

    fileprivate func allocate() -> uv_buf_t {
        let buffer = ThreadReadBuffer.take(readBufferSize)
        return uv_buf_init(buffer.baseAddress!.assumingMemoryBound(to: CChar.self), UInt32(buffer.count))
    }

    fileprivate func didRead(_ count: Int, _ buffer: UnsafePointer<uv_buf_t>?) {
        if count > 0 {
            onRead?(.data(UnsafeRawBufferPointer(start: buffer!.pointee.base, count: count)))
        } else if count < 0 {
            let error = UVError(Int32(count))
            if error.isEOF, let reset = pendingSocketError() {
                // libuv reports a hang-up after a partial read as the end of the stream without reading on
                // (uv__stream_io), so a reset that came right behind the data would pass for a FIN.
                onRead?(.failure(reset))
            } else {
                onRead?(error.isEOF ? .endOfStream : .failure(error))
            }
        }
        // count == 0 is "nothing read this time" (EAGAIN), not the end of the stream.
    }

    /// On the loop thread, while reading: one non-blocking recv(2) on the handle's socket into the loop thread's
    /// read buffer, for a receive that runs on the loop (libuv fills that buffer only inside its own read, which
    /// cannot be running now), copied out at once. `.processed(nil)` is the end of the stream; `drained`: the read
    /// took less than the buffer.
    func readNow() throws(ConnectionError) -> IOResult<(bytes: [UInt8], drained: Bool)?> {
        guard reading else { return .wouldBlock }
        let readBuffer = ThreadReadBuffer.take(readBufferSize)
        switch try readNow(into: readBuffer) {
        case .wouldBlock: return .wouldBlock
        case .processed(0): return .processed(nil)
        case .processed(let count):
            return .processed(
                ([UInt8](UnsafeRawBufferPointer(rebasing: readBuffer[..<count])), count < readBuffer.count))
        }
    }

    /// ``readNow()`` into a caller's buffer (`Connection.receive(into:)`); `.processed(0)` is the
    /// end of the stream.
    func readNow(into buffer: UnsafeMutableRawBufferPointer) throws(ConnectionError) -> IOResult<Int> {
        guard !isClosing, reading else { return .wouldBlock }
        let received = try withFileno(of: handle) { (fd) throws(ConnectionError) in
            try Syscall.recv(fd, buffer, dontWait: true)
        }
        return received ?? .wouldBlock
    }

    /// The socket's pending error (SO_ERROR: a reset, say), if any; reading it clears it.
    private func pendingSocketError() -> UVError? {
        guard let code = withFileno(of: handle, { try? Syscall.pendingError($0) }) ?? nil, code != 0 else {
            return nil
        }
        return UVError(-code)
    }

    /// On the loop thread: resets the connection (see `Syscall.resetConnection`), for an abort; the close that
    /// follows then sends nothing more.
    func resetConnection() {
        guard !isClosing else { return }
        withFileno(of: handle) { Syscall.resetConnection($0) }
    }

    /// `uv_try_write`: writes what the kernel takes at once, without queueing. Returns the count written
    /// (0 when it would block).
    public func tryWrite(_ bytes: UnsafeRawBufferPointer) throws(UVError) -> Int {
        guard !bytes.isEmpty else { return 0 }
        var buffer = uv_buf_init(
            UnsafeMutablePointer(mutating: bytes.baseAddress!.assumingMemoryBound(to: CChar.self)), UInt32(bytes.count))
        let status = uv_try_write(csuv_stream(handle), &buffer, 1)
        if status == csuv_eagain() { return 0 }
        try UVError.check(status)
        return Int(status)
    }

    /// On the loop thread, once connected: sends may come from any thread from now on
    /// (``writeFromAnyThread(_:)``).
    func allowWritesFromAnyThread() {
        withFileno(of: handle) { direct.open($0.number) }
    }

    /// Off the loop thread, with no write of this handle queued or in progress (the caller lets one send through
    /// at a time, and each returns once libuv has written what it queued): one send(2) on the calling thread.
    /// Returns how many bytes the socket took (0: closed or full); the caller queues the rest on the loop.
    /// Around libuv, not through it: libuv's own calls are for its loop's thread only, and closing the handle
    /// waits for such a send to finish.
    public func writeFromAnyThread(_ bytes: UnsafeRawBufferPointer) throws(UVError) -> Int {
        switch direct.send(bytes) {
        case .sent(let count): return count
        case .handOver: return 0
        case .failed(let code): throw UVError(-code)
        }
    }

    public override func close(_ callback: (() -> Void)? = nil) {
        direct.close()
        super.close(callback)
    }

    /// ``tryWrite(_:)-(UnsafeRawBufferPointer)`` for an array.
    public func tryWrite(_ bytes: [UInt8]) throws(UVError) -> Int {
        let result: Result<Int, UVError> = bytes.withUnsafeBytes { raw in
            Result { () throws(UVError) in try tryWrite(raw) }
        }
        return try result.get()
    }

    /// `uv_write`: queues `bytes` (kept alive until the callback, as libuv copies only the buffer array);
    /// `callback` gets `nil` once written, or the error (`ECANCELED` when the handle was closed first).
    public func write(_ bytes: [UInt8], _ callback: @escaping (UVError?) -> Void) throws(UVError) {
        let request = UVRequest<uv_write_t>(keeping: bytes) { status in callback(status < 0 ? UVError(status) : nil) }
        let status = request.kept.withUnsafeBytes { raw in
            var buffer = uv_buf_init(
                UnsafeMutablePointer(mutating: raw.baseAddress?.assumingMemoryBound(to: CChar.self)), UInt32(raw.count))
            return uv_write(request.raw, csuv_stream(handle), &buffer, 1, uvWriteDone)
        }
        if status < 0 {
            request.abandon()
            throw UVError(status)
        }
    }

    /// `uv_shutdown`: sends FIN after every queued write.
    public func shutdown(_ callback: @escaping (UVError?) -> Void) throws(UVError) {
        let request = UVRequest<uv_shutdown_t> { status in callback(status < 0 ? UVError(status) : nil) }
        let status = uv_shutdown(request.raw, csuv_stream(handle), uvShutdownDone)
        if status < 0 {
            request.abandon()
            throw UVError(status)
        }
    }

    /// `uv_tcp_nodelay`.
    public func setNoDelay(_ on: Bool) throws(UVError) {
        try UVError.check(uv_tcp_nodelay(tcp, on ? 1 : 0))
    }

    /// SO_RCVBUF / SO_SNDBUF through `uv_recv_buffer_size` / `uv_send_buffer_size` (on an open socket).
    public func setBufferSizes(receive: Int?, send: Int?) throws(UVError) {
        if var value = receive.map(Int32.init(clamping:)) {
            try UVError.check(uv_recv_buffer_size(csuv_handle(handle), &value))
        }
        if var value = send.map(Int32.init(clamping:)) {
            try UVError.check(uv_send_buffer_size(csuv_handle(handle), &value))
        }
    }

    /// `uv_tcp_getsockname`.
    public var localAddress: SocketAddress {
        get throws(UVError) { try address(uv_tcp_getsockname) }
    }

    /// `uv_tcp_getpeername`.
    public var peerAddress: SocketAddress {
        get throws(UVError) { try address(uv_tcp_getpeername) }
    }

    private func address(
        _ call: (UnsafePointer<uv_tcp_t>?, UnsafeMutablePointer<sockaddr>?, UnsafeMutablePointer<Int32>?) -> Int32
    ) throws(UVError) -> SocketAddress {
        var storage = sockaddr_storage()
        var length = Int32(MemoryLayout<sockaddr_storage>.size)
        let status = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { call(tcp, $0, &length) }
        }
        try UVError.check(status)
        guard let address = withUnsafeBytes(of: &storage, { SocketAddress($0.baseAddress!, length: Int(length)) })
        else { throw UVError(-EAFNOSUPPORT) }
        return address
    }
}

/// A one-shot libuv request (`uv_connect_t`, `uv_write_t`, `uv_shutdown_t`, `uv_udp_send_t`): its memory, the
/// bytes it must keep alive, and its callback. Retained from submission until libuv calls back.
final class UVRequest<Raw> {
    let raw: UnsafeMutablePointer<Raw>
    let kept: [UInt8]
    private let callback: (Int32) -> Void

    init(keeping bytes: [UInt8] = [], _ callback: @escaping (Int32) -> Void) {
        raw = .allocate(capacity: 1)
        kept = bytes
        self.callback = callback
        UnsafeMutableRawPointer(raw).assumingMemoryBound(to: uv_req_t.self).pointee.data =
            Unmanaged.passRetained(self).toOpaque()
    }

    deinit { raw.deallocate() }

    /// The submission failed: libuv will not call back, so drop the retain now.
    func abandon() {
        Unmanaged.passUnretained(self).release()
    }

    static func complete(_ pointer: UnsafeMutableRawPointer?, _ status: Int32) {
        let request = pointer!.assumingMemoryBound(to: uv_req_t.self)
        let object = Unmanaged<UVRequest<Raw>>.fromOpaque(request.pointee.data).takeRetainedValue()
        object.callback(status)
    }
}

private let uvConnection: @convention(c) (UnsafeMutablePointer<uv_stream_t>?, Int32) -> Void = { stream, status in
    let server = Unmanaged<UVTCP>.fromOpaque(uv_handle_get_data(csuv_handle(stream))).takeUnretainedValue()
    server.connectionArrived(status)
}

private let uvConnectDone: @convention(c) (UnsafeMutablePointer<uv_connect_t>?, Int32) -> Void = { request, status in
    UVRequest<uv_connect_t>.complete(UnsafeMutableRawPointer(request), status)
}

private let uvWriteDone: @convention(c) (UnsafeMutablePointer<uv_write_t>?, Int32) -> Void = { request, status in
    UVRequest<uv_write_t>.complete(UnsafeMutableRawPointer(request), status)
}

private let uvShutdownDone: @convention(c) (UnsafeMutablePointer<uv_shutdown_t>?, Int32) -> Void = {
    request, status in
    UVRequest<uv_shutdown_t>.complete(UnsafeMutableRawPointer(request), status)
}

private let uvAllocate:
    @convention(c) (UnsafeMutablePointer<uv_handle_t>?, Int, UnsafeMutablePointer<uv_buf_t>?) -> Void = {
        handle, _, buffer in
        let tcp = Unmanaged<UVTCP>.fromOpaque(uv_handle_get_data(handle)).takeUnretainedValue()
        buffer!.pointee = tcp.allocate()
    }

private let uvRead: @convention(c) (UnsafeMutablePointer<uv_stream_t>?, Int, UnsafePointer<uv_buf_t>?) -> Void = {
    stream, count, buffer in
    let tcp = Unmanaged<UVTCP>.fromOpaque(uv_handle_get_data(csuv_handle(stream))).takeUnretainedValue()
    tcp.didRead(count, buffer)
    tcp.loop.runCallbackWork()
}

/// SO_REUSEPORT on a handle whose socket exists (made with a family, before its bind), through `Syscall` as every
/// socket option; its errno comes back as libuv's negative code.
func setReusePort(on handle: UnsafeMutableRawPointer) throws(UVError) {
    var fd: uv_os_fd_t = -1
    try UVError.check(uv_fileno(csuv_handle(handle), &fd))
    do throws(ConnectionError) {
        try BorrowedDescriptor.lend(fd) { (fd) throws(ConnectionError) in try Syscall.setOption(fd, .reusePort, true) }
    } catch {
        throw UVError(-(error.systemCode?.code ?? EINVAL))
    }
}

/// Runs `body` with the socket of a libuv handle (`uv_fileno`), which libuv owns and keeps open while the handle
/// is (call on the loop thread, the handle not closing); `nil` when the handle has no socket yet.
func withFileno<R, E: Error>(
    of handle: UnsafeMutableRawPointer, _ body: (borrowing BorrowedDescriptor) throws(E) -> R
) throws(E) -> R? {
    var fd: uv_os_fd_t = -1
    guard uv_fileno(csuv_handle(handle), &fd) == 0 else { return nil }
    return try BorrowedDescriptor.lend(fd, body)
}
