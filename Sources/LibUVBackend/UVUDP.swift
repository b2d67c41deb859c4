internal import CLibUV
import ConnectionCore
public import POSIXSupport

/// What a UDP receive callback gets.
public enum UVDatagramResult {
    /// One datagram (valid only during the callback) and its sender. `truncated` when it did not fit.
    case datagram(UnsafeRawBufferPointer, from: SocketAddress, truncated: Bool)
    /// A receive error (for a connected socket, `ECONNREFUSED` after an ICMP port-unreachable).
    case failure(UVError)
}

/// A UDP handle (`uv_udp_t`): bind or connect, receive with a callback per datagram, send.
public final class UVUDP: UVHandle, @unchecked Sendable {
    private var onReceive: ((UVDatagramResult) -> Void)?
    private var buffer: UnsafeMutableRawBufferPointer?
    /// The largest datagram delivered whole.
    private let bufferSize: Int
    /// Datagrams per read: above 1, libuv reads them with recvmmsg(2) (`UV_UDP_RECVMMSG`) into as many chunks of
    /// the buffer, each of libuv's largest datagram (64 KiB), and calls back once per datagram.
    private let batch: Int
    private static let chunk = 64 * 1024
    /// Sends from other threads on a connected handle.
    private let direct = DirectSend()

    /// `uv_udp_init_ex` (call on the loop thread). `bufferSize` bounds the datagrams received whole; `batch` > 1
    /// reads up to that many datagrams per system call (a server's socket, where floods arrive).
    /// With a `family`, the socket is made now (a listener sets options on it before binding).
    public init(
        loop: UVLoop, bufferSize: Int = 65_536, batch: Int = 1, family: SocketAddress.Family? = nil
    ) throws(UVError) {
        self.bufferSize = bufferSize
        self.batch = max(1, batch)
        super.init(loop: loop, size: MemoryLayout<uv_udp_t>.size)
        let flags = self.batch > 1 ? UInt32(UV_UDP_RECVMMSG.rawValue) : 0
        let domain = family.map { $0 == .ipv4 ? AF_INET : AF_INET6 } ?? AF_UNSPEC
        try UVError.check(uv_udp_init_ex(loop.raw, udp, UInt32(domain) | flags))
        attach()
    }

    /// The receive buffer's size: one datagram, or `batch` of libuv's chunks.
    private var bufferCapacity: Int { batch > 1 ? batch * Self.chunk : bufferSize }

    var udp: UnsafeMutablePointer<uv_udp_t> { handle.assumingMemoryBound(to: uv_udp_t.self) }

    deinit { buffer?.deallocate() }

    override func releaseCallbacks() {
        onReceive = nil
        buffer?.deallocate()
        buffer = nil
    }

    /// `uv_udp_bind` (IPv6 sockets are IPv6-only). With `reusePort`, SO_REUSEPORT first (on a handle made for the
    /// address's family): sockets on several loops share the address, the kernel spreads peers over them by address.
    public func bind(_ address: SocketAddress, reusePort: Bool = false) throws(UVError) {
        if reusePort { try setReusePort(on: handle) }
        let flags = address.family == .ipv6 ? UInt32(UV_UDP_IPV6ONLY.rawValue) : 0
        try UVError.check(address.withSockAddr { pointer, _ in uv_udp_bind(udp, pointer, flags) })
    }

    /// `uv_udp_connect`: fixes the peer; sends then need no address, and may come from any thread
    /// (``sendFromAnyThread(_:)``).
    public func connect(_ address: SocketAddress) throws(UVError) {
        try UVError.check(address.withSockAddr { pointer, _ in uv_udp_connect(udp, pointer) })
        withFileno(of: handle) { direct.open($0.number) }
    }

    /// Off the loop thread, on a connected handle: sends the datagram on the calling thread when the socket has
    /// room and no datagram queued in libuv is ahead of it (`false`: hand it to the loop). Around libuv, not
    /// through it: libuv's own calls are for its loop's thread only, and closing the handle waits for such a send
    /// to finish.
    public func sendFromAnyThread(_ bytes: UnsafeRawBufferPointer) throws(UVError) -> Bool {
        switch direct.send(bytes) {
        case .sent: return true
        case .handOver: return false
        case .failed(let code): throw UVError(-code)
        }
    }

    public override func close(_ callback: (() -> Void)? = nil) {
        direct.close()
        super.close(callback)
    }

    /// `uv_udp_recv_start`.
    public func receiveStart(_ onReceive: @escaping (UVDatagramResult) -> Void) throws(UVError) {
        self.onReceive = onReceive
        if buffer == nil { buffer = .allocate(byteCount: bufferCapacity, alignment: 16) }
        try UVError.check(uv_udp_recv_start(udp, uvUDPAllocate, uvUDPReceive))
    }

    /// `uv_udp_recv_stop`.
    public func receiveStop() {
        uv_udp_recv_stop(udp)
    }

    fileprivate func allocate() -> uv_buf_t {
        uv_buf_init(buffer!.baseAddress!.assumingMemoryBound(to: CChar.self), UInt32(bufferCapacity))
    }

    fileprivate func didReceive(
        _ count: Int, _ data: UnsafePointer<uv_buf_t>?, _ from: UnsafePointer<sockaddr>?,
        _ flags: UInt32
    ) {
        if count < 0 {
            onReceive?(.failure(UVError(Int32(count))))
            return
        }
        // count == 0 with no address: "nothing more for now", not a datagram.
        guard let from, let sender = SocketAddress(UnsafeRawPointer(from), length: MemoryLayout<sockaddr_storage>.size)
        else { return }
        // A recvmmsg chunk holds any datagram; one above `bufferSize` is refused as a cut one would be.
        let truncated = flags & UInt32(UV_UDP_PARTIAL.rawValue) != 0 || count > bufferSize
        onReceive?(
            .datagram(
                UnsafeRawBufferPointer(start: data!.pointee.base, count: count), from: sender,
                truncated: truncated))
    }

    /// `uv_udp_try_send`: sends at once or fails (`EAGAIN` when the socket buffer is full, `EMSGSIZE` when
    /// too large). `to` is `nil` on a connected handle.
    public func trySend(_ bytes: UnsafeRawBufferPointer, to address: SocketAddress?) throws(UVError) -> Bool {
        var buffer = uv_buf_init(
            UnsafeMutablePointer(mutating: bytes.baseAddress?.assumingMemoryBound(to: CChar.self)), UInt32(bytes.count))
        let status: Int32
        if let address {
            status = address.withSockAddr { pointer, _ in uv_udp_try_send(udp, &buffer, 1, pointer) }
        } else {
            status = uv_udp_try_send(udp, &buffer, 1, nil)
        }
        if status == csuv_eagain() { return false }
        try UVError.check(status)
        return true
    }

    /// ``trySend(_:to:)-(UnsafeRawBufferPointer,_)`` for an array.
    public func trySend(_ bytes: [UInt8], to address: SocketAddress?) throws(UVError) -> Bool {
        let result: Result<Bool, UVError> = bytes.withUnsafeBytes { raw in
            Result { () throws(UVError) in try trySend(raw, to: address) }
        }
        return try result.get()
    }

    /// Sends datagrams straight on the socket, as few system calls as the kernel allows
    /// (`Syscall.sendDatagrams`: sendmmsg, UDP GSO), when nothing is queued in libuv before them (so order is
    /// kept). Returns how many went from `start` on: 0 when sends are queued or the socket buffer is full.
    func trySend(batch: [UnsafeRawBufferPointer], from start: Int) throws(ConnectionError) -> Int {
        guard !isClosing, uv_udp_get_send_queue_count(udp) == 0 else { return 0 }
        let sent = try withFileno(of: handle) { (fd) throws(ConnectionError) in
            try Syscall.sendDatagrams(fd, batch, from: start, dontWait: true)
        }
        switch sent {
        case .processed(let count): return count
        case .wouldBlock, nil: return 0
        }
    }

    /// `uv_udp_send`: queues one datagram (kept alive until the callback).
    public func send(
        _ bytes: [UInt8], to address: SocketAddress?, _ callback: @escaping (UVError?) -> Void
    )
        throws(UVError)
    {
        // Sends from other threads wait behind it until it has left (order kept).
        direct.loopHolds(1)
        let request = UVRequest<uv_udp_send_t>(keeping: bytes) { [self] status in
            direct.loopHolds(-1)
            callback(status < 0 ? UVError(status) : nil)
        }
        let status = request.kept.withUnsafeBytes { raw in
            var buffer = uv_buf_init(
                UnsafeMutablePointer(mutating: raw.baseAddress?.assumingMemoryBound(to: CChar.self)), UInt32(raw.count))
            if let address {
                return address.withSockAddr { pointer, _ in
                    uv_udp_send(request.raw, udp, &buffer, 1, pointer, uvUDPSent)
                }
            }
            return uv_udp_send(request.raw, udp, &buffer, 1, nil, uvUDPSent)
        }
        if status < 0 {
            request.abandon()
            direct.loopHolds(-1)
            throw UVError(status)
        }
    }

    /// SO_RCVBUF / SO_SNDBUF.
    public func setBufferSizes(receive: Int?, send: Int?) throws(UVError) {
        if var value = receive.map(Int32.init(clamping:)) {
            try UVError.check(uv_recv_buffer_size(csuv_handle(handle), &value))
        }
        if var value = send.map(Int32.init(clamping:)) {
            try UVError.check(uv_send_buffer_size(csuv_handle(handle), &value))
        }
    }

    /// `uv_udp_getsockname`.
    public var localAddress: SocketAddress {
        get throws(UVError) {
            var storage = sockaddr_storage()
            var length = Int32(MemoryLayout<sockaddr_storage>.size)
            let status = withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { uv_udp_getsockname(udp, $0, &length) }
            }
            try UVError.check(status)
            guard let address = withUnsafeBytes(of: &storage, { SocketAddress($0.baseAddress!, length: Int(length)) })
            else { throw UVError(-EAFNOSUPPORT) }
            return address
        }
    }
}

/// A timer handle (`uv_timer_t`).
public final class UVTimer: UVHandle, @unchecked Sendable {
    private var onFire: (() -> Void)?

    override func releaseCallbacks() { onFire = nil }

    /// `uv_timer_init` (call on the loop thread).
    public init(loop: UVLoop) throws(UVError) {
        super.init(loop: loop, size: MemoryLayout<uv_timer_t>.size)
        try UVError.check(uv_timer_init(loop.raw, handle.assumingMemoryBound(to: uv_timer_t.self)))
        attach()
    }

    /// `uv_timer_start`: fires after `milliseconds`, then every `repeatMilliseconds` when not 0.
    public func start(
        milliseconds: UInt64, repeatMilliseconds: UInt64 = 0, _ onFire: @escaping () -> Void
    )
        throws(UVError)
    {
        self.onFire = onFire
        try UVError.check(
            uv_timer_start(
                handle.assumingMemoryBound(to: uv_timer_t.self), uvTimerFired, milliseconds, repeatMilliseconds))
    }

    /// `uv_timer_stop`.
    public func stop() {
        uv_timer_stop(handle.assumingMemoryBound(to: uv_timer_t.self))
    }

    fileprivate func fire() { onFire?() }
}

private let uvUDPAllocate:
    @convention(c) (UnsafeMutablePointer<uv_handle_t>?, Int, UnsafeMutablePointer<uv_buf_t>?) -> Void = {
        handle, _, buffer in
        let udp = Unmanaged<UVUDP>.fromOpaque(uv_handle_get_data(handle)).takeUnretainedValue()
        buffer!.pointee = udp.allocate()
    }

private let uvUDPReceive:
    @convention(c) (UnsafeMutablePointer<uv_udp_t>?, Int, UnsafePointer<uv_buf_t>?, UnsafePointer<sockaddr>?, UInt32)
        -> Void = { handle, count, buffer, from, flags in
            let udp = Unmanaged<UVUDP>.fromOpaque(uv_handle_get_data(csuv_handle(handle))).takeUnretainedValue()
            udp.didReceive(count, buffer, from, flags)
            udp.loop.runCallbackWork()
        }

private let uvUDPSent: @convention(c) (UnsafeMutablePointer<uv_udp_send_t>?, Int32) -> Void = { request, status in
    UVRequest<uv_udp_send_t>.complete(UnsafeMutableRawPointer(request), status)
}

private let uvTimerFired: @convention(c) (UnsafeMutablePointer<uv_timer_t>?) -> Void = { handle in
    let timer = Unmanaged<UVTimer>.fromOpaque(uv_handle_get_data(csuv_handle(handle))).takeUnretainedValue()
    timer.fire()
}
