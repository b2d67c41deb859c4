import ArgumentParser
import BenchmarkDriver
import ConnectionTestKit
import Foundation
import POSIXSupport
import SocketStyles
import Synchronization

/// `sockbench broadcast-clients URL --connections N --messages M`: one process of `broadcast-N`'s clients
/// (``Broadcast``). Opens N connections (64 at a time), each saying hello so that the server counts it in, prints
/// `ready N`, receives until every client has had message M - 1 (or a line `stop`, or the end of standard input),
/// then prints its report (``BroadcastClientReport``) as one line of JSON and exits.
struct BroadcastClients: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "broadcast-clients",
        abstract: "One process of compare's broadcast clients (run by `sockbench compare`).",
        shouldDisplay: false)

    @Argument(help: "The broadcast server, tcp:// or ws://.")
    var url: String

    @Option(help: "The connection style of the clients.")
    var backend: String = Backend.async.name

    @Option(help: "Clients to connect.")
    var connections: Int

    @Option(help: "Messages the run sends, numbered from 0; a client is done with the last.")
    var messages: Int

    @Option(help: "Messages numbered below this are not measured (their order still is).")
    var warmup: Int = 0

    @Option(help: "Pin this process to a CPU.")
    var cpu: Int?

    func run() async throws {
        let (endpoint, backend) = try parseTarget(url: url, backend: backend)
        guard connections >= 1, messages >= 1 else { throw fail("--connections and --messages must be at least 1") }
        try pin(toCPU: cpu)
        let clients: [any Connection]
        do throws(ConnectionError) {
            clients = try await ConnectionBatch.open(connections) { () throws(ConnectionError) in
                try await backend.connect(to: endpoint)
            } prepare: { connection throws(ConnectionError) in
                try await BroadcastReceipts.hello(on: connection)
            }
        } catch {
            throw fail("broadcast-clients: \(error)")
        }
        let last = UInt64(messages - 1)
        let done = DoneCount()
        let before = ResourceUsage.read()
        let all = clients
        // Closes every connection (ending every receive) once all are done, or on `stop` / end of input.
        let (finished, finish) = AsyncStream<Void>.makeStream()
        PosixThread.spawn(name: "broadcast-stdin") {
            while let line = readLine(), line != "stop" {}
            finish.yield()
        }
        Console.line("ready \(clients.count)")
        let receipts = await withTaskGroup(of: BroadcastReceipts?.self) { group in
            for client in all {
                group.addTask(executorPreference: client.preferredExecutor) {
                    let receipts = await BroadcastReceipts.receive(on: client) { $0 >= last }
                    if done.count.add(1, ordering: .relaxed).newValue == all.count { finish.yield() }
                    return receipts
                }
            }
            group.addTask {
                for await _ in finished { break }
                for client in all { await client.close() }
                return nil
            }
            var collected: [BroadcastReceipts] = []
            for await case let receipts? in group {
                collected.append(receipts)
                if collected.count == all.count { break }
            }
            finish.yield()
            return collected
        }
        let after = ResourceUsage.read()
        for client in all { await client.close() }
        let cpu = before.flatMap { before in after.map { $0.since(before).cpuNanoseconds } } ?? 0
        let report = BroadcastClientReport(
            receipts, warmup: UInt64(warmup), cpuNanoseconds: cpu)
        let data = try JSONEncoder().encode(report)
        Console.line(String(decoding: data, as: UTF8.self))
    }
}

/// How many clients have had the last message.
private final class DoneCount: Sendable {
    let count = Atomic<Int>(0)
}
