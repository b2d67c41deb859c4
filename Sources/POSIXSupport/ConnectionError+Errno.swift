internal import CSocketShims
public import ConnectionCore
internal import Glibc

extension ConnectionError {
    /// Maps an errno value to the shared error kinds, keeping the code and its symbolic name.
    /// - Parameters:
    ///   - code: the errno value, read right after the failing call.
    ///   - operation: what was being done, e.g. `connect to tcp://127.0.0.1:9`.
    public static func errno(_ code: Int32, _ operation: String) -> ConnectionError {
        let kind: Kind
        switch code {
        case ECONNREFUSED: kind = .refused
        case ETIMEDOUT: kind = .timedOut
        case ECONNRESET, EPIPE, ECONNABORTED, ENOTCONN: kind = .reset
        case EADDRINUSE: kind = .addressInUse
        case EADDRNOTAVAIL: kind = .addressNotAvailable
        case EMSGSIZE: kind = .messageTooLarge
        case ENETUNREACH, EHOSTUNREACH, ENETDOWN, EHOSTDOWN: kind = .unreachable
        case EACCES, EPERM: kind = .permissionDenied
        case EMFILE, ENFILE, ENOBUFS, ENOMEM: kind = .resourceExhausted
        case EAFNOSUPPORT, EPROTONOSUPPORT, EOPNOTSUPP: kind = .unsupported
        case EBADF: kind = .closed
        case ECANCELED: kind = .cancelled
        default: kind = .system
        }
        let name = csock_errno_name(code).map { String(cString: $0) } ?? "errno \(code)"
        let text = String(cString: strerror(code))
        return ConnectionError(
            kind, "\(operation): \(text)", systemCode: SystemCode(domain: "errno", code: code, name: name))
    }
}
