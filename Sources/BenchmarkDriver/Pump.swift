public import ConnectionCore
import POSIXSupport
import Synchronization

/// The receiving end of a one-way pump: counts what arrives, discards it, and reports the count when the
/// sender asks (``PumpRunner`` is the other end).
///
/// - Byte streams (tcp, tls): the sender half-closes; the sink answers with the byte count (8 bytes, big
///   endian) and closes.
/// - WebSocket: the sender sends the text message `pump-end`; the sink answers with the byte count as text.
/// - UDP: each datagram starts with its sequence number (8 bytes, big endian); a datagram whose first 8 bytes
///   are all 0xFF asks for the counts: received, reordered, bytes, and the nanoseconds from the first datagram
///   received to the last (4 x 8 bytes; the receiver's own window, as iperf3 reports the receiver's rate).
public enum PumpSink {
    static let endText = "pump-end"
    /// `WebSocketOptions.maximumMessageSize`'s default: a sink receives any message its WebSocket accepts.
    static let largestWebSocketMessage = 64 * 1024 * 1024
    static let statsRequest = [UInt8](repeating: 0xFF, count: 8)

    /// Serves one connection until it ends. Everything is received into a buffer the sink owns
    /// (`Connection.receive(into:)`), so it allocates nothing per read or message.
    public static func serve(_ connection: any Connection) async {
        let buffer = UnsafeMutableRawBufferPointer.allocate(
            byteCount: max(connection.options.readChunkSize, connection.options.maxDatagramSize), alignment: 16)
        defer { buffer.deallocate() }
        do {
            switch connection.transport {
            case .udp:
                var received: UInt64 = 0
                var reordered: UInt64 = 0
                var bytes: UInt64 = 0
                var highest: UInt64 = 0
                var first: UInt64 = 0
                var last: UInt64 = 0
                while let datagram = try await connection.receive(into: buffer) {
                    guard datagram.count >= 8 else { continue }
                    let sequence = UInt64(bigEndian: buffer.loadUnaligned(as: UInt64.self))
                    if sequence == .max {  // the stats request: eight 0xFF bytes
                        try await connection.send(
                            encode(received) + encode(reordered) + encode(bytes) + encode(last &- first))
                        continue
                    }
                    last = MonotonicClock.nanoseconds()
                    if received == 0 { first = last }
                    received += 1
                    bytes += UInt64(datagram.count)
                    if sequence < highest { reordered += 1 } else { highest = sequence }
                }
            case .ws, .wss:
                // Whole messages, each into one buffer as large as the largest message a WebSocket accepts by
                // default; only the pages the messages reach are ever touched.
                let messages = UnsafeMutableRawBufferPointer.allocate(
                    byteCount: largestWebSocketMessage, alignment: 16)
                defer { messages.deallocate() }
                var bytes: UInt64 = 0
                while let message = try await connection.receive(into: messages) {
                    if message.kind == .text,
                        String(decoding: UnsafeRawBufferPointer(rebasing: messages[..<message.count]), as: UTF8.self)
                            == endText
                    {
                        try await connection.send(.text(String(bytes)))
                        bytes = 0
                    } else {
                        bytes += UInt64(message.count)
                    }
                }
            default:
                var bytes: UInt64 = 0
                while let chunk = try await connection.receive(into: buffer) { bytes += UInt64(chunk.count) }
                try await connection.send(encode(bytes))
            }
        } catch {
            // The sender vanished or the server is stopping.
        }
    }

    static func encode(_ value: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: value >> (56 - 8 * $0)) } }

    /// ``encode(_:)`` into the first 8 bytes of `bytes`, in place (a sender's payload: no allocation per message).
    static func encode(_ value: UInt64, into bytes: inout [UInt8]) {
        for index in 0..<8 { bytes[index] = UInt8(truncatingIfNeeded: value >> (56 - 8 * index)) }
    }

    static func decode(_ bytes: [UInt8], at offset: Int) -> UInt64 {
        bytes.withUnsafeBytes { decode($0, at: offset) }
    }

    /// ``decode(_:at:)`` from memory the caller owns (a receive buffer).
    static func decode(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> UInt64 {
        var value: UInt64 = 0
        for index in offset..<(offset + 8) { value = value << 8 | UInt64(bytes[index]) }
        return value
    }
}

/// One-way bulk transfer to a ``PumpSink``: `totalBytes` in writes of `size` bytes (UDP: `totalBytes / size`
/// datagrams). What is timed: from the first write to the sink's report, so the rate counts bytes delivered,
/// not bytes queued.
public struct PumpRunner: Sendable {
    public var size: Int
    public var totalBytes: Int
    /// Checked between writes: once requested, the sender stops and the sink's count ends the run as usual.
    public var stop: RunStop?
    /// How often ``onInterval`` gets what was written in the interval just ended (`nil`: never), iperf3's `-i`.
    /// Called on the sending task: it should only hand the figures over.
    public var reportEvery: Duration?
    public var onInterval: (@Sendable (Interval) -> Void)?
    /// UDP: how many datagrams go to the connection per `send(batch:)` (sendmmsg, UDP GSO where the kernel
    /// has it); 1 sends each datagram on its own with `send(contentsOf:)`, as a plain sendto loop does.
    public var batch = PumpRunner.defaultBatch
    /// 32 datagrams of 1,400 B: 44,800 B, one segmented send under UDP GSO's 64 KiB.
    public static let defaultBatch = 32

    /// What the sender handed to the connection in one interval (the sink's count comes at the end only).
    public struct Interval: Sendable {
        /// Since the first write.
        public var from: Duration
        public var to: Duration
        public var bytes: Int
        public var messages: Int
    }

    public init(size: Int, totalBytes: Int) {
        self.size = size
        self.totalBytes = totalBytes
    }

    /// Interval bookkeeping for the send loops; one clock read per write, only when intervals are asked for.
    private struct Intervals {
        let every: UInt64
        let report: (@Sendable (Interval) -> Void)?
        let start: UInt64
        var since: UInt64
        var bytes = 0
        var messages = 0

        init(_ runner: PumpRunner, start: UInt64) {
            report = runner.reportEvery == nil ? nil : runner.onInterval
            every = runner.reportEvery.map { UInt64(max(1, $0.wholeNanoseconds)) } ?? .max
            self.start = start
            since = start
        }

        @inline(__always)
        mutating func wrote(_ count: Int) {
            guard report != nil else { return }
            bytes += count
            messages += 1
            let now = MonotonicClock.nanoseconds()
            if now &- since >= every { flush(at: now) }
        }

        mutating func flush(at now: UInt64) {
            guard let report, messages > 0 else { return }
            report(
                Interval(
                    from: .nanoseconds(Int64(since &- start)), to: .nanoseconds(Int64(now &- start)), bytes: bytes,
                    messages: messages))
            since = now
            bytes = 0
            messages = 0
        }
    }

    /// Runs on `connection` (connected to a sink); the connection is finished afterwards (byte streams are
    /// half-closed).
    public func run(on connection: any Connection) async throws(ConnectionError) -> ScenarioResult {
        let outcome: Result<ScenarioResult, ConnectionError> = await withTaskExecutorPreference(
            connection.preferredExecutor
        ) {
            do throws(ConnectionError) {
                switch connection.transport {
                case .udp: return .success(try await runDatagrams(connection))
                default: return .success(try await runReliable(connection))
                }
            } catch {
                return .failure(error)
            }
        }
        return try outcome.get()
    }

    private func runReliable(_ connection: any Connection) async throws(ConnectionError) -> ScenarioResult {
        let chunk = [UInt8](repeating: 0xA5, count: size)
        let planned = max(1, totalBytes / size)
        let start = MonotonicClock.nanoseconds()
        var intervals = Intervals(self, start: start)
        var writes = 0
        while writes < planned {
            if let stop, stop.isRequested { break }
            try await connection.send(chunk)
            writes += 1
            intervals.wrote(size)
        }
        intervals.flush(at: MonotonicClock.nanoseconds())
        let delivered: UInt64
        if connection.transport.isByteStream {
            try await connection.closeOutput()
            let reply = try await connection.receive(exactly: 8)
            delivered = PumpSink.decode(reply, at: 0)
        } else {
            try await connection.send(.text(PumpSink.endText))
            guard let reply = try await connection.receive(), let count = UInt64(reply.text ?? "") else {
                throw ConnectionError(.protocolViolation, "the sink did not report its count")
            }
            delivered = count
        }
        let elapsed = MonotonicClock.nanoseconds() - start
        let sent = UInt64(writes * size)
        guard delivered == sent else {
            throw ConnectionError(.protocolViolation, "the sink received \(delivered) of \(sent) bytes")
        }
        var measurement = ScenarioResult()
        measurement.messages = writes
        measurement.elapsedNanoseconds = elapsed
        measurement.bytesPerSecond = Double(sent) / (Double(elapsed) / 1e9)
        measurement.messagesPerSecond = Double(writes) / (Double(elapsed) / 1e9)
        return measurement
    }

    private func runDatagrams(_ connection: any Connection) async throws(ConnectionError) -> ScenarioResult {
        let planned = max(1, totalBytes / size)
        let datagramSize = max(size, 8)
        let perSend = max(1, min(batch, planned))
        // One buffer holds a batch; each datagram is a slice of it, stamped with its sequence number.
        let storage = UnsafeMutableRawBufferPointer.allocate(byteCount: datagramSize * perSend, alignment: 8)
        defer { storage.deallocate() }
        storage.initializeMemory(as: UInt8.self, repeating: 0xA5)
        let slots = (0..<perSend).map {
            UnsafeMutableRawBufferPointer(rebasing: storage[($0 * datagramSize)..<(($0 + 1) * datagramSize)])
        }
        let fullBatch = slots.map { UnsafeRawBufferPointer($0) }
        let before = UDPCounters.read()
        let start = MonotonicClock.nanoseconds()
        var intervals = Intervals(self, start: start)
        var sendErrors = 0
        var count = 0
        while count < planned {
            if let stop, stop.isRequested { break }
            let now = min(perSend, planned - count)
            for index in 0..<now {
                slots[index].storeBytes(of: UInt64(count + index).bigEndian, toByteOffset: 0, as: UInt64.self)
            }
            count += now
            defer { for _ in 0..<now { intervals.wrote(datagramSize) } }
            do throws(ConnectionError) {
                if perSend == 1 {
                    try await connection.send(contentsOf: UnsafeRawBufferPointer(slots[0]))
                } else {
                    try await connection.send(batch: now == perSend ? fullBatch : Array(fullBatch[..<now]))
                }
            } catch {
                // ENOBUFS and the like: the sender goes on, as a UDP sender does. Which datagrams of a batch went
                // is not known: the whole batch counts as not sent.
                if error.kind == .closed || error.kind == .cancelled { throw error }
                sendErrors += now
            }
        }
        let sendElapsed = MonotonicClock.nanoseconds() - start
        intervals.flush(at: start + sendElapsed)
        // Ask for the counts (behind the data in the same socket); ask again if the request or answer is lost.
        var stats: [UInt8]?
        for _ in 0..<20 where stats == nil {
            try await connection.send(PumpSink.statsRequest)
            stats = await receive(from: connection, within: .milliseconds(200))
        }
        guard let stats, stats.count >= 24 else {
            throw ConnectionError(.timedOut, "the UDP sink did not report its counts")
        }
        let after = UDPCounters.read()
        let received = Int(PumpSink.decode(stats, at: 0))
        var measurement = ScenarioResult()
        measurement.messages = count - sendErrors
        measurement.elapsedNanoseconds = sendElapsed
        measurement.received = received
        measurement.lost = max(0, count - sendErrors - received)
        measurement.reordered = Int(PumpSink.decode(stats, at: 8))
        if let before, let after {
            measurement.kernelReceiveBufferDrops = Int(after.receiveBufferErrors &- before.receiveBufferErrors)
        }
        measurement.messagesPerSecond = Double(count - sendErrors) / (Double(sendElapsed) / 1e9)
        measurement.bytesPerSecond = Double(received * size) / (Double(sendElapsed) / 1e9)
        if stats.count >= 32 {
            measurement.receivedPerSecond = Self.goodput(received, over: PumpSink.decode(stats, at: 24))
        }
        return measurement
    }

    /// Datagrams per second over the sink's own window (first to last datagram received); `nil` for fewer than
    /// two datagrams, whose window says nothing.
    public static func goodput(_ received: Int, over nanoseconds: UInt64) -> Double? {
        guard received > 1, nanoseconds > 0 else { return nil }
        return Double(received - 1) / (Double(nanoseconds) / 1e9)
    }

    /// The next message within `limit`, or `nil`.
    private func receive(from connection: any Connection, within limit: Duration) async -> [UInt8]? {
        let box = Guarded<[UInt8]?>(nil)
        let reader = Task {
            if let message = try? await connection.receive() { box.withLock { $0 = message.bytes } }
        }
        _ = await runBounded(by: limit, onTimeout: { reader.cancel() }) { _ = await reader.value }
        return box.withLock { $0 }
    }
}
