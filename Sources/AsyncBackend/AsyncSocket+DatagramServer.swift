@_spi(Loop) import ConnectionCore
import POSIXSupport
import Synchronization

/// A UDP server's side of ``AsyncSocket``: the reactor's thread reads its datagrams in batches, and replies go to
/// each sender by address.
extension AsyncSocket {
    /// A datagram server's reads, without a task: from now on the reactor's thread reads the datagrams that arrive
    /// (recvmmsg, up to the batch's capacity each) when the socket becomes readable and hands each batch to
    /// `deliver` there, at most 32 datagrams per turn of the loop. A task that waited for each batch was resumed
    /// once per datagram besides the peer's own task. Until ``close()``.
    func receiveOnReactor(into batch: DatagramBatch, deliver: @escaping @Sendable (DatagramBatch) -> Void) {
        let policy = LoopConfined(ReadBeforeWait(), on: reactor.loop.thread)
        let read: @Sendable () -> Void = { [self] in
            readDatagrams(into: batch, policy: policy, afterWait: true, deliver: deliver)
        }
        readiness.onReadable(read)
        reactor.loop.perform(read)  // what came before the handler was set made its edge already
    }

    /// Reads what is there on the reactor's thread. Edge-triggered: reads until a batch comes back short (the
    /// socket was empty then, and the next datagram makes an edge) or would block; a turn that stops at its limit
    /// with datagrams left comes back after the loop's other work, as no edge will report them. After datagrams
    /// (their answers are the work the loop runs next), reads once more before the loop waits, as
    /// ``ReadBeforeWait`` decides: an edge for what that read takes only makes a later read find nothing.
    /// Returns whether it found datagrams.
    @discardableResult
    private func readDatagrams(
        into batch: DatagramBatch, policy: LoopConfined<ReadBeforeWait>, afterWait: Bool,
        deliver: @escaping @Sendable (DatagramBatch) -> Void
    ) -> Bool {
        guard readGate.tryEnter() else { return false }  // a close waits for the gate: the socket is closing
        defer { readGate.leave() }
        guard (try? checkUsable()) != nil else { return false }
        var taken = 0
        var reads = 0
        reading: while taken < 32 && reads < 8 {
            reads += 1
            do throws(ConnectionError) {
                switch try descriptor.withDescriptor({ (fd) throws(ConnectionError) in
                    try batch.receive(fd, dontWait: true)
                }) {
                case .processed(let count):
                    taken += count
                    deliver(batch)
                    if count < batch.capacity { break reading }
                case .wouldBlock:
                    break reading
                }
            } catch {
                if error.kind == .closed || error.kind == .cancelled { return taken > 0 }
                // A stale ICMP error for an earlier sendto: the socket lives on.
            }
            if taken >= 32 || reads >= 8 {
                reactor.loop.perform { [self] in
                    readDatagrams(into: batch, policy: policy, afterWait: true, deliver: deliver)
                }
                return true
            }
        }
        let again = policy.withValue { policy in
            if taken > 0 {
                policy.found(afterWait: afterWait)
            } else if !afterWait {
                policy.missed()
            }
            return taken > 0 && policy.readsFirst
        }
        if again {
            reactor.loop.beforeNextWait(for: self) { [self] in
                readDatagrams(into: batch, policy: policy, afterWait: false, deliver: deliver)
            }
        }
        return taken > 0
    }

    /// sendto on an unconnected UDP socket.
    func send(_ bytes: [UInt8], to address: SocketAddress) async throws(ConnectionError) {
        if !writeGate.tryEnter() { await writeGate.enter() }
        defer { writeGate.leave() }
        try checkUsable()
        while true {
            let result = try descriptor.withDescriptor { (fd) throws(ConnectionError) in
                try bytes.withBytes { (buffer) throws(ConnectionError) in
                    try Syscall.sendTo(fd, buffer, to: address, dontWait: true)
                }
            }
            if case .processed = result { return }
            try await waitForRoom()
        }
    }
}
