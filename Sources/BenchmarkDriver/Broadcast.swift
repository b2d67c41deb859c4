public import ConnectionCore
public import Histogram
import POSIXSupport
import Synchronization

/// Broadcast to many clients, the request form of the WebSocket shootouts: one client (the asker) sends a request,
/// the server sends a message to every other connected client and then answers the asker. What it measures is how
/// long a style takes to reach thousands of clients: per message, from the request's intended send time to the
/// first and to the last client's receipt.
///
/// Every message starts with an ASCII line, `B` and a kind letter, then the sequence number, the request's send time
/// and the server's time as 16 hexadecimal digits each (CLOCK_MONOTONIC nanoseconds, one clock for every process of
/// the machine): `Bq` a request, `Bm` the message sent to every client (followed by the market-data JSON the `json`
/// rows use), `Ba` the answer to the asker. Over WebSocket a message is a text message; over tcp each has a 4-byte
/// big-endian length in front.
public enum Broadcast {
    /// What a message is.
    public enum Kind: UInt8, Sendable {
        case request = 0x71  // q
        case message = 0x6D  // m
        case answer = 0x61  // a
        /// A client saying it is there: answered at once, so the client knows the server counts it in.
        case hello = 0x68  // h
    }

    /// A message's first line.
    public struct Header: Sendable, Equatable {
        public var kind: Kind
        public var sequence: UInt64
        /// The request's (intended) send time, CLOCK_MONOTONIC nanoseconds.
        public var sent: UInt64
        /// When the server began sending it to everyone (0 in a request).
        public var server: UInt64

        public init(kind: Kind, sequence: UInt64, sent: UInt64, server: UInt64 = 0) {
            self.kind = kind
            self.sequence = sequence
            self.sent = sent
            self.server = server
        }
    }

    /// `B`, the kind, three numbers of 16 hexadecimal digits each with a space before, and a newline.
    public static let headerSize = 2 + 3 * 17 + 1

    /// The header and `body`.
    public static func encode(_ header: Header, body: String = "") -> [UInt8] {
        var bytes: [UInt8] = [UInt8(ascii: "B"), header.kind.rawValue]
        bytes.reserveCapacity(headerSize + body.utf8.count)
        for number in [header.sequence, header.sent, header.server] {
            bytes.append(UInt8(ascii: " "))
            for shift in stride(from: 60, through: 0, by: -4) {
                let digit = UInt8((number >> UInt64(shift)) & 0xF)
                bytes.append(digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10)
            }
        }
        bytes.append(UInt8(ascii: "\n"))
        bytes += body.utf8
        return bytes
    }

    /// The header at the start of `bytes`, or `nil` when they do not start with one.
    public static func decode(_ bytes: UnsafeRawBufferPointer) -> Header? {
        guard bytes.count >= headerSize, bytes[0] == UInt8(ascii: "B"), let kind = Kind(rawValue: bytes[1]),
            bytes[headerSize - 1] == UInt8(ascii: "\n")
        else { return nil }
        var numbers: [UInt64] = []
        for field in 0..<3 {
            let start = 2 + field * 17
            guard bytes[start] == UInt8(ascii: " ") else { return nil }
            var value: UInt64 = 0
            for byte in bytes[(start + 1)..<(start + 17)] {
                let digit: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
                default: return nil
                }
                value = value << 4 | UInt64(digit)
            }
            numbers.append(value)
        }
        return Header(kind: kind, sequence: numbers[0], sent: numbers[1], server: numbers[2])
    }

    public static func decode(_ bytes: [UInt8]) -> Header? { bytes.withUnsafeBytes { decode($0) } }

    /// Sends one message: a text message over WebSocket, length-prefixed over a byte stream.
    public static func send(_ bytes: [UInt8], on connection: any Connection) async throws(ConnectionError) {
        try await send(Framed(bytes), on: connection)
    }

    /// A message made ready to send once, to be sent to many connections: its length prefix and its WebSocket
    /// message built once, not per client.
    public struct Framed: Sendable {
        let prefixed: [UInt8]
        let text: Message

        public init(_ bytes: [UInt8]) {
            let length = UInt32(bytes.count)
            prefixed =
                [UInt8(length >> 24), UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF)]
                + bytes
            text = Message(kind: .text, bytes: bytes)
        }
    }

    public static func send(_ framed: Framed, on connection: any Connection) async throws(ConnectionError) {
        if connection.transport.isByteStream {
            try await connection.send(framed.prefixed)
        } else {
            try await connection.send(framed.text)
        }
    }

    /// The largest message either side accepts.
    public static let largestMessage = 1 << 20

    /// Receives one message (`nil` when the peer finished).
    public static func receive(on connection: any Connection) async throws(ConnectionError) -> [UInt8]? {
        guard connection.transport.isByteStream else { return try await connection.receive()?.bytes }
        let prefix: [UInt8]
        do throws(ConnectionError) {
            prefix = try await connection.receive(exactly: 4)
        } catch  where error.kind == .closed {
            return nil
        }
        let length = Int(prefix[0]) << 24 | Int(prefix[1]) << 16 | Int(prefix[2]) << 8 | Int(prefix[3])
        guard length <= largestMessage else {
            throw ConnectionError(
                .protocolViolation, "a broadcast message of \(length) bytes (at most \(largestMessage))")
        }
        return try await connection.receive(exactly: length)
    }

    /// The server's side of one connection (a client's hello is answered at once): each request it sends is sent, as a message with the market-data JSON,
    /// to every connection `everyone()` returns but this one, one after another, then answered. Returns when the
    /// peer finishes or fails; a client that cannot be sent to is skipped (it is closed by its own task).
    public static func serve(
        _ connection: any Connection, everyone: @Sendable () -> [any Connection]
    ) async {
        let me = ObjectIdentifier(connection)
        do {
            while let bytes = try await receive(on: connection) {
                guard let request = decode(bytes), request.kind == .request || request.kind == .hello else {
                    throw ConnectionError(.protocolViolation, "not a broadcast request")
                }
                if request.kind == .hello {
                    try await send(
                        encode(Header(kind: .answer, sequence: request.sequence, sent: request.sent)), on: connection)
                    continue
                }
                var header = request
                header.kind = .message
                header.server = MonotonicClock.nanoseconds()
                let message = Framed(encode(header, body: MarketData.book(Int(request.sequence % 1_000_000))))
                for other in everyone() where ObjectIdentifier(other) != me {
                    try? await send(message, on: other)
                }
                header.kind = .answer
                try await send(encode(header), on: connection)
            }
        } catch {
            // The asker vanished or sent garbage: this connection is done, the others go on.
        }
    }
}

/// One client's receipts of broadcast messages: what arrived, when, and whether each came once and in order.
public struct BroadcastReceipts: Sendable {
    /// Per message received, in arrival order: its sequence number and when it arrived.
    public private(set) var sequences: [UInt64] = []
    public private(set) var arrivals: [UInt64] = []
    /// Latency of each, from the request's send time, nanoseconds.
    public private(set) var latencies: [UInt64] = []
    /// Messages that came again, or after a later one.
    public private(set) var duplicates = 0
    public private(set) var outOfOrder = 0
    private var highest: UInt64?

    public init() {}

    public mutating func record(_ header: Header, at now: UInt64) {
        if let highest {
            if header.sequence == highest {
                duplicates += 1
                return
            }
            if header.sequence < highest { outOfOrder += 1 }
        }
        highest = max(highest ?? 0, header.sequence)
        sequences.append(header.sequence)
        arrivals.append(now)
        latencies.append(now >= header.sent ? now - header.sent : 0)
    }

    public typealias Header = Broadcast.Header

    /// Says hello and waits for the answer: from then on the server sends this client every message.
    public static func hello(on connection: any Connection) async throws(ConnectionError) {
        try await Broadcast.send(
            Broadcast.encode(Header(kind: .hello, sequence: 0, sent: MonotonicClock.nanoseconds())), on: connection)
        while let bytes = try await Broadcast.receive(on: connection) {
            if Broadcast.decode(bytes)?.kind == .answer { return }
        }
        throw ConnectionError(.closed, "the broadcast server closed before answering hello")
    }

    /// The receipts of one client, read until the connection ends or `until` returns `true` after a message.
    /// `clockOffset`: this host's monotonic clock minus the asker's (0 on one host), taken off every arrival.
    public static func receive(
        on connection: any Connection, clockOffset: Int64 = 0, until done: @Sendable (UInt64) -> Bool
    ) async -> BroadcastReceipts {
        var receipts = BroadcastReceipts()
        do {
            while let bytes = try await Broadcast.receive(on: connection) {
                let now = UInt64(bitPattern: Int64(bitPattern: MonotonicClock.nanoseconds()) &- clockOffset)
                guard let header = Broadcast.decode(bytes), header.kind == .message else { continue }
                receipts.record(header, at: now)
                if done(header.sequence) { break }
            }
        } catch {
            // The run is over (the connection was closed) or the server went away: what arrived is the answer.
        }
        return receipts
    }
}

/// What one process of broadcast clients saw, merged by the run: per message the first and last arrival among its
/// clients and how many got it; per client how many it got and its own p99; every latency in a histogram; and the
/// messages that came twice or out of order.
public struct BroadcastClientReport: Sendable, Codable {
    public struct PerMessage: Sendable, Codable {
        public var sequence: UInt64
        public var first: UInt64
        public var last: UInt64
        public var clients: Int
    }

    public var clients: Int
    public var messages: [PerMessage]
    public var received: [Int]
    public var clientP99s: [UInt64]
    /// Every receipt's latency from the request's send time, nanoseconds.
    public var histogram: Histogram<UInt64>
    public var duplicates: Int
    public var outOfOrder: Int
    /// The client process's CPU time while it received, nanoseconds.
    public var cpuNanoseconds: UInt64

    /// `warmup`: messages numbered below it are checked for order and duplicates but not measured.
    public init(_ all: [BroadcastReceipts], warmup: UInt64, cpuNanoseconds: UInt64) {
        clients = all.count
        var bySequence: [UInt64: PerMessage] = [:]
        var histogram = LatencySummary.makeHistogram()
        var received: [Int] = []
        var clientP99s: [UInt64] = []
        for receipts in all {
            var measured: [UInt64] = []
            for (index, sequence) in receipts.sequences.enumerated() where sequence >= warmup {
                let arrival = receipts.arrivals[index]
                var entry =
                    bySequence[sequence] ?? PerMessage(sequence: sequence, first: arrival, last: arrival, clients: 0)
                entry.first = min(entry.first, arrival)
                entry.last = max(entry.last, arrival)
                entry.clients += 1
                bySequence[sequence] = entry
                measured.append(receipts.latencies[index])
                _ = histogram.record(max(1, receipts.latencies[index]))
            }
            received.append(measured.count)
            if let p99 = Fairness.percentile(99, of: measured) { clientP99s.append(p99) }
        }
        messages = bySequence.values.sorted { $0.sequence < $1.sequence }
        self.received = received
        self.clientP99s = clientP99s
        self.histogram = histogram
        duplicates = all.map(\.duplicates).reduce(0, +)
        outOfOrder = all.map(\.outOfOrder).reduce(0, +)
        self.cpuNanoseconds = cpuNanoseconds
    }
}

/// What a broadcast run measured, merged over its client processes.
public struct BroadcastFigures: Sendable, Codable {
    /// Nearest-rank percentiles of a set of per-message times, nanoseconds.
    public struct Percentiles: Sendable, Codable, Equatable {
        public var p50: UInt64
        public var p95: UInt64
        public var p99: UInt64
        public var max: UInt64

        /// `nil` when `values` is empty.
        public init?(_ values: [UInt64]) {
            guard let max = values.max() else { return nil }
            p50 = Fairness.percentile(50, of: values)!
            p95 = Fairness.percentile(95, of: values)!
            p99 = Fairness.percentile(99, of: values)!
            self.max = max
        }
    }

    /// Clients connected (besides the asker), and the processes they were spread over.
    public var clients: Int
    public var processes: Int
    /// Messages measured (after the warm-up ones).
    public var messages: Int
    /// Per message, from the request's intended send time to the first client's receipt, and to the last's (a
    /// message some client never got is left out of these and counted in ``missing``).
    public var firstReceipt: Percentiles?
    public var lastReceipt: Percentiles?
    /// The asker's: from the request's intended send time to the server's answer, after it sent to everyone.
    public var answer: Percentiles?
    /// Receipts that never came (clients x messages, less what arrived), and receipts that came twice or after a
    /// later message.
    public var missing: Int
    public var duplicates: Int
    public var outOfOrder: Int
    /// The client processes' CPU time while they received, nanoseconds (beside the server's).
    public var clientCPUNanoseconds: UInt64

    /// Merges the client processes' reports. `sent`: each measured message's sequence number and intended send
    /// time; `answers`: the asker's answer latencies, nanoseconds. Returns the figures, every receipt's latency of
    /// the measured messages (a histogram over all clients), and the fairness over the clients.
    public static func merge(
        _ reports: [BroadcastClientReport], sent: [UInt64: UInt64], answers: [UInt64]
    ) -> (figures: BroadcastFigures, latency: LatencySummary?, fairness: Fairness) {
        let clients = reports.map(\.clients).reduce(0, +)
        var first: [UInt64: UInt64] = [:]
        var last: [UInt64: UInt64] = [:]
        var got: [UInt64: Int] = [:]
        for report in reports {
            for message in report.messages where sent[message.sequence] != nil {
                first[message.sequence] = min(first[message.sequence] ?? .max, message.first)
                last[message.sequence] = max(last[message.sequence] ?? 0, message.last)
                got[message.sequence, default: 0] += message.clients
            }
        }
        var firsts: [UInt64] = []
        var lasts: [UInt64] = []
        var missing = 0
        for (sequence, time) in sent {
            let count = got[sequence] ?? 0
            missing += clients - count
            if let arrival = first[sequence] { firsts.append(arrival &- min(arrival, time)) }
            if count == clients, let arrival = last[sequence] { lasts.append(arrival &- min(arrival, time)) }
        }
        var histogram = LatencySummary.makeHistogram()
        for report in reports { histogram.add(report.histogram) }
        let figures = BroadcastFigures(
            clients: clients, processes: reports.count, messages: sent.count, firstReceipt: Percentiles(firsts),
            lastReceipt: Percentiles(lasts), answer: Percentiles(answers), missing: missing,
            duplicates: reports.map(\.duplicates).reduce(0, +), outOfOrder: reports.map(\.outOfOrder).reduce(0, +),
            clientCPUNanoseconds: reports.map(\.cpuNanoseconds).reduce(0, +))
        let fairness = Fairness(
            throughputs: reports.flatMap(\.received).map(Double.init), p99s: reports.flatMap(\.clientP99s))
        return (figures, histogram.totalCount > 0 ? LatencySummary(histogram) : nil, fairness)
    }
}
