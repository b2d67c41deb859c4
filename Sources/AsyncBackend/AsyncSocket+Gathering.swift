@_spi(Loop) import ConnectionCore
import POSIXSupport

// TCP sends made back to back on the reactor's thread, gathered into one system call (`SendGathering`): the send
// path's steps that gather, write what gathered, and ask the reactor to write it before it next waits.
extension AsyncSocket {
    enum GatherStep { case done, write, writeGatheredFirst }

    /// Inside the write gate (TCP): on the reactor's thread, the send gathers or says why not; elsewhere, what
    /// gathered is written first. Not `async`, so that the send's frame stays small.
    @inline(never)
    func gatherStep(_ gather: (UInt32) -> SendGathering.Offer) -> GatherStep {
        guard reactor.loop.inLoop else { return gathering.isEmpty ? .write : .writeGatheredFirst }
        switch gather(reactor.loop.turn) {
        case .gathered(let askFlush):
            if askFlush { writeGatheredBeforeSleep() }
            return .done
        case .direct: return .write
        case .full: return .writeGatheredFirst
        }
    }

    /// Inside the write gate (TCP): what gathered, written now; what the socket does not take waits for room.
    func writeGathered() async throws(ConnectionError) {
        guard
            let rest = try gathering.take(writeNow: writeAvailable, keepBuffer: true)
        else {
            return
        }
        try await sendHeld(count: rest.count, countsDatagrams: false) { (fd, offset) throws(ConnectionError) in
            try rest.withBytes { (buffer) throws(ConnectionError) in
                try Syscall.send(fd, UnsafeRawBufferPointer(rebasing: buffer[offset...]), dontWait: true)
            }
        }
    }

    /// What the socket takes of `bytes` now.
    private func writeAvailable(_ bytes: UnsafeRawBufferPointer) throws(ConnectionError) -> Int {
        try checkUsable()
        return try descriptor.withDescriptor { (fd) throws(ConnectionError) in try Syscall.sendAvailable(fd, bytes) }
    }

    /// Asks the reactor to write what gathered before it next sleeps (TCP, on its thread).
    private func writeGatheredBeforeSleep() {
        reactor.loop.beforeSleep { [self] in
            guard
                let rest = gathering.writeNow(
                    gate: writeGate,
                    writeNow: writeAvailable)
            else { return }
            // The socket took part: the rest waits for room as any send's does, the write gate held until it went.
            Task { [self] in
                defer { writeGate.leave() }
                guard (try? checkUsable()) != nil else { return }
                try? await sendHeld(count: rest.count, countsDatagrams: false) {
                    (fd, offset) throws(ConnectionError) in
                    try rest.withBytes { (buffer) throws(ConnectionError) in
                        try Syscall.send(fd, UnsafeRawBufferPointer(rebasing: buffer[offset...]), dontWait: true)
                    }
                }
            }
        }
    }
}
