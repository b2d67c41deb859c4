import ArgumentParser
import BenchmarkDriver
import CFloor
import Foundation
import Histogram
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

    @Flag(help: "Stop when standard input reaches its end.")
    var exitOnStdinEOF = false

    func run() async throws {
        let socket: BSDSocket
        do throws(ConnectionError) {
            socket = try BSDSocket.listen(on: try Endpoint(url: url))
            Console.line("listening on \(try socket.localAddress.endpoint(socket.transport))")
        } catch {
            throw fail(error.description)
        }
        try pin(toCPU: cpu)
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw fail("pipe failed") }
        let (stopRead, stopWrite) = (pipeFDs[0], pipeFDs[1])
        let datagram: Int32 = socket.transport == .udp ? 1 : 0
        let fd = socket.descriptor
        let done = Task.detached {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                PosixThread.spawn(name: "cfloor-serve") {
                    _ = cfloor_serve(fd, datagram, stopRead)
                    continuation.resume()
                }
            }
        }
        let reason = await StopSignal.wait(stdinEOF: exitOnStdinEOF)
        var byte: UInt8 = 1
        _ = write(stopWrite, &byte, 1)
        await done.value
        close(stopRead)
        close(stopWrite)
        socket.close()
        Console.error("sockbench floor-serve: \(reason)")
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
    let fd = socket.descriptor
    let datagram: Int32 = endpoint.transport == .udp ? 1 : 0
    let outcome: (status: Int32, errno: Int32, samples: [UInt64], elapsed: UInt64) = await withCheckedContinuation {
        continuation in
        PosixThread.spawn(name: "cfloor-ping") {
            var samples = [UInt64](repeating: 0, count: count)
            let start = MonotonicClock.nanoseconds()
            let status = samples.withUnsafeMutableBufferPointer {
                cfloor_pingpong(fd, datagram, Int32(size), Int32(count), Int32(warmup), $0.baseAddress)
            }
            let code = errno
            continuation.resume(returning: (status, code, samples, MonotonicClock.nanoseconds() - start))
        }
    }
    guard outcome.status == 0 else { throw .errno(outcome.errno, "C floor ping-pong") }
    var histogram = LatencySummary.makeHistogram()
    for sample in outcome.samples { _ = histogram.record(max(1, sample)) }
    let measured = outcome.samples.reduce(0, +)
    return PingRunner.Result(
        latency: LatencySummary(histogram), lost: 0, stale: 0, elapsedNanoseconds: measured,
        roundTripsPerSecond: Double(count) / (Double(measured) / 1e9), histogram: histogram)
}
