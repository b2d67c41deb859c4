import ArgumentParser
import BenchmarkDriver
import CFloor
import Foundation
import Histogram
import POSIXSupport
import SocketStyles

/// `sockbench floor-serve`: the C floor's echo server (blocking C, one client at a time for TCP).
struct FloorServe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "floor-serve",
        abstract: "Run the C floor's echo server (plain blocking C) until SIGINT, SIGTERM or the end of stdin."
    )

    @Argument(help: "Where to listen, e.g. tcp://127.0.0.1:0.")
    var url: String

    @Option(help: "Pin the server to this CPU.")
    var cpu: Int?

    @Flag(help: "Count and discard (the C sink for pump scenarios) instead of echoing.")
    var sink = false

    @Flag(help: "Stop when standard input reaches its end.")
    var exitOnStdinEOF = false

    @OptionGroup var buffers: SocketBufferOption

    @Flag(help: "Print no line when stopping (compare's child servers: compare reports for them).")
    var quiet = false

    func run() async throws {
        let socket: BSDSocket
        do throws(ConnectionError) {
            socket = try BSDSocket.listen(on: try Endpoint(url: url), options: .with { buffers.apply(to: &$0) })
            Console.line("listening on \(try socket.localAddress.endpoint(socket.transport))")
        } catch {
            throw fail(error.description)
        }
        try pin(toCPU: cpu)
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw fail("pipe failed") }
        let (stopRead, stopWrite) = (pipeFDs[0], pipeFDs[1])
        let datagram: Int32 = socket.transport == .udp ? 1 : 0
        let sink = sink
        // The C server's thread works on the number: borrowed until it has ended.
        let reason = try? await socket.withDescriptorAsync { (fd) async throws(ConnectionError) in
            let number = fd.number
            let done = Task.detached {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    PosixThread.spawn(name: "cfloor-serve") {
                        _ = sink ? cfloor_sink(number, datagram, stopRead) : cfloor_serve(number, datagram, stopRead)
                        continuation.resume()
                    }
                }
            }
            let reason = await StopSignal.wait(stdinEOF: exitOnStdinEOF)
            var byte: UInt8 = 1
            _ = write(stopWrite, &byte, 1)
            await done.value
            return reason
        }
        close(stopRead)
        close(stopWrite)
        socket.close()
        guard !quiet else { return }
        Console.error("sockbench floor-serve: \(reason ?? "the socket closed")")
    }
}

/// Runs the C floor's ping-pong client on a thread of its own (it blocks) and summarises it.
func runFloorPing(
    endpoint: Endpoint, size: Int, count: Int, warmup: Int
) async throws(ConnectionError)
    -> PingRunner.Result
{
    let socket = try BSDSocket.connect(to: endpoint)
    defer { socket.close() }
    let datagram: Int32 = endpoint.transport == .udp ? 1 : 0
    // The C client's thread works on the number: borrowed until it has ended.
    let outcome: (status: Int32, errno: Int32, samples: [UInt64]) = try await socket.withDescriptorAsync {
        (fd) async throws(ConnectionError) in
        let number = fd.number
        return await withCheckedContinuation { continuation in
            PosixThread.spawn(name: "cfloor-ping") {
                var samples = [UInt64](repeating: 0, count: count)
                let status = samples.withUnsafeMutableBufferPointer {
                    cfloor_pingpong(number, datagram, Int32(size), Int32(count), Int32(warmup), $0.baseAddress)
                }
                let code = errno
                continuation.resume(returning: (status, code, samples))
            }
        }
    }
    guard outcome.status == 0 else { throw .errno(outcome.errno, "C floor ping-pong") }
    return PingRunner.Result(samples: outcome.samples, elapsedNanoseconds: outcome.samples.reduce(0, +))
}

/// Runs the C floor's pump (blocking C writes) to a C sink on a thread of its own; the same figures as
/// ``PumpRunner``.
func runFloorPump(endpoint: Endpoint, size: Int, totalBytes: Int) async throws(ConnectionError) -> ScenarioResult {
    let socket = try BSDSocket.connect(to: endpoint)
    defer { socket.close() }
    let datagram = endpoint.transport == .udp
    let before = UDPCounters.read()
    let outcome: (status: Int32, errno: Int32, result: cfloor_pump_result) = try await socket.withDescriptorAsync {
        (fd) async throws(ConnectionError) in
        let number = fd.number
        return await withCheckedContinuation { continuation in
            PosixThread.spawn(name: "cfloor-pump") {
                var result = cfloor_pump_result()
                let status = cfloor_pump(number, datagram ? 1 : 0, Int32(size), UInt64(totalBytes), &result)
                let code = errno
                continuation.resume(returning: (status, code, result))
            }
        }
    }
    guard outcome.status == 0 else { throw .errno(outcome.errno, "C floor pump") }
    let result = outcome.result
    let seconds = Double(max(1, result.send_ns)) / 1e9
    var measurement = ScenarioResult()
    measurement.messages = Int(result.sent)
    measurement.elapsedNanoseconds = result.send_ns
    measurement.messagesPerSecond = Double(result.sent) / seconds
    if datagram {
        measurement.received = Int(result.delivered)
        measurement.lost = Int(result.sent) - Int(result.delivered)
        measurement.reordered = Int(result.reordered)
        if let before, let after = UDPCounters.read() {
            measurement.kernelReceiveBufferDrops = Int(after.receiveBufferErrors &- before.receiveBufferErrors)
        }
        measurement.bytesPerSecond = Double(Int(result.delivered) * size) / seconds
        measurement.receivedPerSecond = PumpRunner.goodput(Int(result.delivered), over: result.receive_ns)
    } else {
        guard result.delivered == result.sent * UInt64(size) else {
            throw ConnectionError(
                .protocolViolation, "the C sink received \(result.delivered) of \(result.sent * UInt64(size)) bytes")
        }
        measurement.bytesPerSecond = Double(result.delivered) / seconds
    }
    return measurement
}

/// Runs the C floor's open-loop client (a sleeping paced sender and a receiving thread) on a thread of its own;
/// the same figures as ``RateRunner``: latency from the intended and from the actual send time, the first
/// `warmup` not recorded, echoes missing half a second after the last send counted as lost.
func runFloorRate(
    endpoint: Endpoint, perSecond: Int, duration: Duration, warmup: Duration, pacing: Pacing
) async throws(ConnectionError) -> ScenarioResult {
    let runner = RateRunner(perSecond: perSecond, duration: duration, warmup: warmup, pacing: pacing)
    let spin: Int32 = pacing == .spin ? 1 : 0
    let total = runner.total
    let socket = try BSDSocket.connect(to: endpoint)
    defer { socket.close() }
    let datagram: Int32 = endpoint.transport == .udp ? 1 : 0
    let interval = UInt64(1e9 / Double(perSecond))
    typealias Times = (intended: [UInt64], actual: [UInt64], received: [UInt64])
    let outcome: (status: Int32, errno: Int32, times: Times, received: Int32, waiting: UInt64) =
        try await socket.withDescriptorAsync { (fd) async throws(ConnectionError) in
            let number = fd.number
            return await withCheckedContinuation { continuation in
                PosixThread.spawn(name: "cfloor-rate") {
                    var times: Times = (
                        [UInt64](repeating: 0, count: total), [UInt64](repeating: 0, count: total),
                        [UInt64](repeating: 0, count: total)
                    )
                    var received: Int32 = 0
                    var waiting: UInt64 = 0
                    let status = times.intended.withUnsafeMutableBufferPointer { intended in
                        times.actual.withUnsafeMutableBufferPointer { actual in
                            times.received.withUnsafeMutableBufferPointer { echoed in
                                cfloor_rate(
                                    number, datagram, Int32(runner.size), Int32(total), interval, spin,
                                    intended.baseAddress,
                                    actual.baseAddress, echoed.baseAddress, &received, &waiting)
                            }
                        }
                    }
                    let code = errno
                    continuation.resume(returning: (status, code, times, received, waiting))
                }
            }
        }
    guard outcome.status == 0 else { throw .errno(outcome.errno, "C floor open-loop client") }
    var measurement = runner.result(
        intended: outcome.times.intended, actual: outcome.times.actual, received: outcome.times.received)
    measurement.pacingCPUNanoseconds = outcome.waiting
    return measurement
}
