import ConnectionCore
import POSIXSupport
import Synchronization

/// A TCP listener in the blocking style: an acceptor thread blocks in `accept(2)` and queues each new
/// connection (with its own reader thread) for ``accept()``. When too many accepted connections wait to be
/// taken, the acceptor stops accepting and the kernel's backlog holds the rest.
final class BSDTCPListener: Listener, Sendable {
    let transport = Transport.tcp
    let localEndpoint: Endpoint
    private let socket: BSDSocket
    private let lease: DescriptorLease
    private let options: ConnectionOptions
    private let accepted: AcceptedConnections
    private let gate = ConditionLock()
    private let life = SharedLifecycle()

    init(socket: BSDSocket, options: ConnectionOptions) throws(ConnectionError) {
        self.socket = socket
        self.options = options
        self.lease = DescriptorLease(closing: socket.close)
        self.localEndpoint = try socket.localAddress.endpoint(.tcp)
        let gate = gate
        self.accepted = AcceptedConnections(capacity: 128, onSpaceAvailable: { gate.withLock { gate.signal() } })
        _ = lease.retain()
        PosixThread.spawn(name: "bsd-accept-\(socket.label)") { [self] in acceptLoop() }
    }

    private func acceptLoop() {
        defer { lease.release() }
        while true {
            gate.withLock { gate.wait(until: { accepted.hasSpace || !life.isOpen }) }
            if !life.isOpen { return }
            let client: BSDSocket
            do throws(ConnectionError) {
                client = try socket.accept(options: options)
            } catch {
                if !life.isOpen { return }
                if error.kind == .resourceExhausted {
                    // Out of descriptors: clients wait in the backlog while this thread pauses (trying again at
                    // once would spin, since the socket stays readable); close() cuts the pause short.
                    BoundsLog.note(.descriptorLimit, "accepting paused for \(options.acceptBackoff): \(error)")
                    gate.withLock {
                        _ = gate.wait(until: { !life.isOpen }, timeout: options.acceptBackoff)
                    }
                    continue
                }
                accepted.finish(error)
                return
            }
            let connection: BSDConnection
            do throws(ConnectionError) {
                connection = try BSDConnection(socket: client, options: options)
            } catch {
                if error.kind == .resourceExhausted {
                    // No thread for its reader: that client is closed; the others wait in the backlog while
                    // accepting pauses, as when out of descriptors.
                    BoundsLog.note(.threadLimit, "accepting paused for \(options.acceptBackoff): \(error)")
                    gate.withLock {
                        _ = gate.wait(until: { !life.isOpen }, timeout: options.acceptBackoff)
                    }
                }
                continue  // or the client left before getpeername: not served
            }
            if !accepted.offer(connection) { return }
        }
    }

    func accept() async throws(ConnectionError) -> any Connection { try await accepted.accept() }

    func close() async {
        await life.close { [self] in
            await accepted.close(listener: {
                gate.withLock { gate.broadcast() }
                try? socket.shutdown(.both)  // wakes the thread blocked in accept(2) (EINVAL)
                lease.release()
                await lease.closed()  // the acceptor thread has ended: it offers nothing more
            })
        }
    }

    deinit {
        if life.beginCloseWithoutWaiting() {
            for connection in accepted.closeQueue() { Task { await connection.close() } }
            try? socket.shutdown(.both)
            lease.release()
        }
    }
}
