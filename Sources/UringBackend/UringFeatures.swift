internal import CURing
internal import Glibc

/// The kernel features the `uring` backend uses where the kernel has them, each probed once, and each possible to
/// turn off to measure what it buys:
///
/// - `SOCKETSTYLES_URING_OFF`: a comma-separated list of `multishot-accept`, `multishot-recvmsg`, `skip-success`
///   and `poll-first`; each named feature is not used (the backend takes its fallback path, as on a kernel without
///   it).
/// - `SOCKETSTYLES_URING_SQPOLL`: `MS` or `MS@CPU`; a kernel thread polls each ring's submission queue and sleeps
///   after MS milliseconds without work (IORING_SETUP_SQPOLL), on CPU when given (IORING_SETUP_SQ_AFF; otherwise
///   where the process may run). Off by default: measured slower here (docs/backends/uring.md).
/// - `SOCKETSTYLES_URING_SENDZC`: bytes; a TCP send of at least that many that goes from the caller's bytes (more
///   than the send queue holds) goes with zero copy (IORING_OP_SEND_ZC). Off by default: measured slower over
///   loopback, where the kernel copies anyway (docs/backends/uring.md).
///
/// Both are read once, when the first ring is made; compare's server processes inherit them.
public struct UringFeatures: Sendable, CustomStringConvertible {
    /// Whether a feature runs: used, turned off by `SOCKETSTYLES_URING_OFF`, or missing from this kernel.
    public enum Use: String, Sendable {
        case on
        case off
        case absent
    }

    /// One multishot accept per listener (Linux 5.19); the fallback is one accept per client.
    public var multishotAccept: Use
    /// The UDP server's one multishot recvmsg into a provided buffer ring (Linux 6.0); the fallback is one recvmsg
    /// per datagram into the listener's buffer.
    public var multishotReceive: Use
    /// Sends linked before a receive post no completion when they succeed (IOSQE_CQE_SKIP_SUCCESS, Linux 5.17).
    /// Probed per ring; `absent` here only when turned off.
    public var skipSuccess: Use
    /// A receive linked behind a send (`UringRing.sendThenReceive`, the native ping-pong and echo) waits for data
    /// before its first try instead of trying at once and finding nothing (IORING_RECVSEND_POLL_FIRST, Linux 5.19).
    public var pollFirst: Use
    /// `SOCKETSTYLES_URING_SQPOLL`'s idle time in milliseconds; 0 when off.
    public var submissionPollingIdle: UInt32
    /// The CPU `SOCKETSTYLES_URING_SQPOLL` pins the polling thread to, if it names one.
    public var submissionPollingCPU: Int32?
    /// `SOCKETSTYLES_URING_SENDZC`'s smallest zero-copy send in bytes, where the kernel has IORING_OP_SEND_ZC;
    /// `nil` when off.
    public var zeroCopySendsFrom: Int?

    /// Whether this kernel has IORING_OP_SEND_ZC (Linux 6.0), probed once.
    static let kernelSendsZeroCopy = csur_probe_send_zc() != 0

    /// What this process uses, probed at first use.
    public static let current: UringFeatures = {
        let off = Set(
            (getenv("SOCKETSTYLES_URING_OFF").map { String(cString: $0) } ?? "")
                .split(separator: ",").map { String($0.filter { !$0.isWhitespace }) })
        func use(_ name: String, _ probe: () -> Bool) -> Use {
            off.contains(name) ? .off : probe() ? .on : .absent
        }
        let pollingParts = (getenv("SOCKETSTYLES_URING_SQPOLL").map { String(cString: $0) } ?? "")
            .split(separator: "@", maxSplits: 1)
        let polling = pollingParts.first.flatMap { UInt32($0) } ?? 0
        let pollingCPU = pollingParts.count == 2 ? Int32(pollingParts[1]) : nil
        var zeroCopy: Int?
        if let raw = getenv("SOCKETSTYLES_URING_SENDZC"), let bytes = Int(String(cString: raw)), bytes > 0,
            kernelSendsZeroCopy
        {
            zeroCopy = bytes
        }
        return UringFeatures(
            multishotAccept: use("multishot-accept") { csur_probe_multishot(0) != 0 },
            multishotReceive: use("multishot-recvmsg") { csur_probe_multishot(1) != 0 },
            skipSuccess: off.contains("skip-success") ? .off : .on,
            pollFirst: use("poll-first") { csur_probe_poll_first() != 0 },
            submissionPollingIdle: polling, submissionPollingCPU: pollingCPU, zeroCopySendsFrom: zeroCopy)
    }()

    /// One line for a report's machine description.
    public var description: String {
        func named(_ use: Use, _ what: String) -> String {
            switch use {
            case .on: what
            case .off: "\(what) turned off"
            case .absent: "no \(what) (kernel)"
            }
        }
        let polling =
            submissionPollingIdle > 0
            ? "SQPOLL (idle \(submissionPollingIdle) ms\(submissionPollingCPU.map { ", CPU \($0)" } ?? ""))"
            : "no SQPOLL"
        let zeroCopy = zeroCopySendsFrom.map { "zero-copy sends from \($0) B" } ?? "no zero-copy sends"
        return [
            named(multishotAccept, "multishot accept"), named(multishotReceive, "multishot recvmsg (buffer ring)"),
            named(skipSuccess, "skip-success sends"), named(pollFirst, "poll-first linked receives"), polling,
            zeroCopy,
        ].joined(separator: ", ")
    }
}
