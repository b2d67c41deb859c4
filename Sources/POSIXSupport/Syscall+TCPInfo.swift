internal import CSocketShims
package import ConnectionCore
internal import Glibc

// The kernel's view of a TCP connection (TCP_INFO), found by its addresses.
extension Syscall {
    /// The kernel's view of a TCP connection, found by its addresses (sock_diag(7)): what `ss -ti` shows.
    package struct TCPView: Sendable, Hashable {
        /// The TCP state (1 established, 4 FIN-WAIT-1, ... as in the kernel's `TCP_ESTABLISHED` and on).
        package var state: UInt8
        /// Bytes received and not yet read by the program.
        package var receiveQueue: UInt32
        /// Bytes sent and not yet acknowledged, plus those not yet sent.
        package var sendQueue: UInt32
        /// Bytes the program wrote that TCP has not sent yet (Nagle, the congestion or the peer's window).
        package var notSentBytes: UInt32
        /// Segments sent and not yet acknowledged.
        package var unacked: UInt32
        /// Segments retransmitted over the connection's life.
        package var totalRetransmits: UInt32
        /// Retransmission timeouts in a row now (the backoff).
        package var backoff: UInt8
        /// Smoothed round-trip time in microseconds.
        package var rttMicroseconds: UInt32
        /// The delayed-ACK timeout in microseconds.
        package var ackTimeoutMicroseconds: UInt32
        /// Congestion window in segments.
        package var congestionWindow: UInt32
    }

    /// The connection from `local` to `remote` as the kernel sees it, or `nil` when there is none (closed, or
    /// in another network namespace) or a host is not an address.
    package static func tcpView(local: Endpoint, remote: Endpoint) -> TCPView? {
        func address(_ host: Endpoint.Host) -> (family: Int32, bytes: [UInt8])? {
            var bytes = [UInt8](repeating: 0, count: 16)
            switch host {
            case .ipv4(let text): return inet_pton(AF_INET, text, &bytes) == 1 ? (AF_INET, bytes) : nil
            case .ipv6(let text): return inet_pton(AF_INET6, text, &bytes) == 1 ? (AF_INET6, bytes) : nil
            case .name: return nil
            }
        }
        guard let here = address(local.host), let there = address(remote.host), here.family == there.family else {
            return nil
        }
        var view = csock_tcp_view()
        guard csock_tcp_view(here.family, here.bytes, local.port, there.bytes, remote.port, &view) == 0 else {
            return nil
        }
        return TCPView(
            state: view.state, receiveQueue: view.receive_queue, sendQueue: view.send_queue,
            notSentBytes: view.notsent_bytes, unacked: view.unacked, totalRetransmits: view.total_retrans,
            backoff: view.backoff, rttMicroseconds: view.rtt_us, ackTimeoutMicroseconds: view.ato_us,
            congestionWindow: view.snd_cwnd)
    }
}
