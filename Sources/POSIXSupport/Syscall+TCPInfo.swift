internal import CSocketShims
package import ConnectionCore
internal import Glibc

// The kernel's view of a TCP connection (TCP_INFO).
extension Syscall {
    /// Round-trip time and retransmission counters of a TCP socket.
    package struct TCPInfo: Sendable, Hashable {
        /// Smoothed round-trip time in microseconds.
        package var rttMicroseconds: UInt32
        /// Round-trip time variation in microseconds.
        package var rttVarianceMicroseconds: UInt32
        /// Congestion window in segments.
        package var congestionWindow: UInt32
        /// Segments retransmitted over the connection's life.
        package var totalRetransmits: UInt32
        /// Segments currently considered lost.
        package var lost: UInt32
    }

    /// getsockopt(TCP_INFO).
    package static func tcpInfo(_ fd: Int32) throws(ConnectionError) -> TCPInfo {
        var info = csock_tcp_info()
        _ = try retrying("getsockopt(TCP_INFO)", { Int(csock_tcp_info(fd, &info)) })
        return TCPInfo(
            rttMicroseconds: info.rtt_us, rttVarianceMicroseconds: info.rttvar_us, congestionWindow: info.snd_cwnd,
            totalRetransmits: info.total_retrans, lost: info.lost)
    }
}
