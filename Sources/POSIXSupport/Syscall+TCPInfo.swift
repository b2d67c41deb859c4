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
        /// Whether the kernel gave the TCP state: not for a socket it keeps only as a timewait entry (TIME-WAIT, or
        /// an orphaned FIN-WAIT-2 once the program closed it), whose other fields are then 0.
        package var hasTCPState = true
        /// Slow-start threshold in segments (a very large number until the first loss).
        package var slowStartThreshold: UInt32 = 0
        /// The congestion-control state: 0 open, 1 disorder, 2 CWR, 3 recovery, 4 loss.
        package var congestionState: UInt8 = 0
        /// The sender's maximum segment size, bytes.
        package var maximumSegmentSize: UInt32 = 0
        /// The round-trip time's variance, and the lowest round trip seen, microseconds.
        package var rttVarianceMicroseconds: UInt32 = 0
        package var minimumRTTMicroseconds: UInt32 = 0
        /// Bytes a second: the rate TCP paces its sends at, and its last measured delivery rate.
        package var pacingRate: UInt64 = 0
        package var deliveryRate: UInt64 = 0
        /// Bytes over the connection's life: sent (retransmissions included), acknowledged by the peer,
        /// retransmitted.
        package var bytesSent: UInt64 = 0
        package var bytesAcked: UInt64 = 0
        package var bytesRetransmitted: UInt64 = 0
        /// The congestion-control algorithm ("cubic", "bbr"); empty when the kernel did not say.
        package var congestionControl = ""

        init(_ view: csock_tcp_view) {
            state = view.state
            receiveQueue = view.receive_queue
            sendQueue = view.send_queue
            notSentBytes = view.notsent_bytes
            unacked = view.unacked
            totalRetransmits = view.total_retrans
            backoff = view.backoff
            rttMicroseconds = view.rtt_us
            ackTimeoutMicroseconds = view.ato_us
            congestionWindow = view.snd_cwnd
            hasTCPState = view.has_info != 0
            slowStartThreshold = view.snd_ssthresh
            congestionState = view.ca_state
            maximumSegmentSize = view.snd_mss
            rttVarianceMicroseconds = view.rttvar_us
            minimumRTTMicroseconds = view.min_rtt_us
            pacingRate = view.pacing_rate
            deliveryRate = view.delivery_rate
            bytesSent = view.bytes_sent
            bytesAcked = view.bytes_acked
            bytesRetransmitted = view.bytes_retrans
            congestionControl = withUnsafeBytes(of: view.congestion) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
        }
    }

    /// A NETLINK_SOCK_DIAG socket kept open, to read one connection's view many times a second (a query on it took
    /// a fraction of opening one per query: see `TCPSampler` in the lessons, which measures its own cost).
    package final class TCPDiagnostics: Sendable {
        private let descriptor: SocketDescriptor

        package init() throws(ConnectionError) {
            let fd = csock_tcp_diag_open()
            guard fd >= 0 else { throw .errno(Glibc.errno, "socket(AF_NETLINK, NETLINK_SOCK_DIAG)") }
            descriptor = SocketDescriptor(adopting: fd)
        }

        /// The connection from `local` to `remote` as the kernel sees it now, or `nil`.
        package func view(local: Endpoint, remote: Endpoint) -> TCPView? {
            guard let (family, here, there) = Syscall.diagAddresses(local, remote) else { return nil }
            var view = csock_tcp_view()
            let found = descriptor.ifOpen {
                csock_tcp_view_on($0.number, family, here, local.port, there, remote.port, &view)
            }
            guard found == 0 else {
                return nil
            }
            return TCPView(view)
        }

        /// Closes the socket (also done when the value goes).
        package func close() { _ = descriptor.close() }
    }

    static func diagAddresses(_ local: Endpoint, _ remote: Endpoint) -> (Int32, [UInt8], [UInt8])? {
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
        return (here.family, here.bytes, there.bytes)
    }

    /// The connection from `local` to `remote` as the kernel sees it, or `nil` when there is none (closed, or
    /// in another network namespace) or a host is not an address.
    package static func tcpView(local: Endpoint, remote: Endpoint) -> TCPView? {
        guard let (family, here, there) = diagAddresses(local, remote) else { return nil }
        var view = csock_tcp_view()
        guard csock_tcp_view(family, here, local.port, there, remote.port, &view) == 0 else { return nil }
        return TCPView(view)
    }
}
