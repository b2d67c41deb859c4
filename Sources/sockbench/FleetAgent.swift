import BenchmarkDriver
import Foundation
import POSIXSupport
import SocketStyles

struct FleetError: Error, CustomStringConvertible {
    let message: String
    init(_ message: String) { self.message = message }
    var description: String { message }
}

/// One agent's control connection, each request with a time limit: past it the connection is closed, which ends
/// the request waiting on it.
actor FleetAgent {
    private let channel: LineChannel
    nonisolated let address: String
    private nonisolated let connection: any Connection

    private init(_ connection: any Connection, address: String) {
        channel = LineChannel(connection)
        self.connection = connection
        self.address = address
    }

    /// Connects to `address`, each attempt within `seconds`; an agent that is not there yet (a pod still
    /// starting) is tried again every half second for `wait` seconds.
    static func connect(_ address: String, within seconds: Double, wait: Double = 0) async throws -> FleetAgent {
        let until = MonotonicClock.nanoseconds() + UInt64(max(0, wait) * 1e9)
        while true {
            do {
                return try await attempt(address, within: seconds)
            } catch {
                guard MonotonicClock.nanoseconds() < until else { throw error }
                try await Task.sleep(for: .milliseconds(500))
            }
        }
    }

    private static func attempt(_ address: String, within seconds: Double) async throws -> FleetAgent {
        let endpoint: Endpoint
        do {
            endpoint = try Endpoint(url: address.contains("://") ? address : "tcp://\(address)")
        } catch {
            throw FleetError("not an address: \(error)")
        }
        let attempt = Task { () throws(ConnectionError) -> any Connection in
            try await Backend.async.connect(to: endpoint)
        }
        let limit = Task {
            try await Task.sleep(for: .seconds(seconds))
            attempt.cancel()
        }
        defer { limit.cancel() }
        do {
            return FleetAgent(try await attempt.value, address: address)
        } catch {
            throw FleetError("unreachable: \(error)")
        }
    }

    /// One request, one answer (what follows `ok `); `error ...`, a closed connection or no answer within
    /// `seconds` throw.
    func request(_ line: String, within seconds: Double) async throws -> String {
        let connection = connection
        let until = MonotonicClock.nanoseconds() + UInt64(seconds * 1e9)
        let limit = Task {
            try await Task.sleep(for: .seconds(seconds))
            await connection.close()
        }
        defer { limit.cancel() }
        let answer: String?
        do {
            try await channel.send(line)
            answer = try await channel.readLine()
        } catch {
            let verb = line.split(separator: " ").first ?? ""
            throw FleetError(
                MonotonicClock.nanoseconds() >= until
                    ? "no answer to `\(verb)` within \(fixed(seconds, 1)) s" : "\(error)")
        }
        guard let answer else {
            throw FleetError("the control connection closed during `\(line.split(separator: " ").first ?? "")`")
        }
        guard answer.hasPrefix("ok") else { throw FleetError("refused `\(line)`: \(answer)") }
        return String(answer.dropFirst(3))
    }

    /// The agent's monotonic clock minus ours, from the exchange of nine with the shortest round trip (NTP's
    /// way: the agent read its clock halfway through the round trip, give or take half of it).
    func clockOffset(within seconds: Double) async throws -> (offset: Int64, roundTrip: UInt64) {
        var best: (offset: Int64, roundTrip: UInt64)?
        for _ in 0..<9 {
            let sent = MonotonicClock.nanoseconds()
            let answer = try await request("clock", within: seconds)
            let back = MonotonicClock.nanoseconds()
            guard let theirs = UInt64(answer) else { throw FleetError("answered `clock` with '\(answer)'") }
            let roundTrip = back - sent
            let offset = Int64(bitPattern: theirs) - Int64(bitPattern: sent + roundTrip / 2)
            if best == nil || roundTrip < best!.roundTrip { best = (offset, roundTrip) }
        }
        return best!
    }

    func usage(_ id: String, within seconds: Double) async throws -> ResourceUsage {
        try JSONDecoder().decode(ResourceUsage.self, from: Data(try await request("usage \(id)", within: seconds).utf8))
    }

    func close() async { await connection.close() }
}
