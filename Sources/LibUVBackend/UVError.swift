internal import CLibUV
public import ConnectionCore
import POSIXSupport

/// A libuv status code (negative), with its name from `uv_err_name` (e.g. `ECONNREFUSED`).
public struct UVError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The status as libuv returned it (negative; `UV_E*`).
    public let code: Int32

    /// Wraps a libuv status.
    public init(_ code: Int32) { self.code = code }

    /// `uv_err_name`, e.g. `ECONNREFUSED`, `EOF`.
    public var name: String { String(cString: uv_err_name(code)) }

    /// `uv_strerror`, e.g. "connection refused".
    public var message: String { String(cString: uv_strerror(code)) }

    public var description: String { "\(name): \(message)" }

    /// `true` for `UV_EOF`.
    public var isEOF: Bool { code == csuv_eof() }

    /// `true` for `UV_ECANCELED`.
    public var isCanceled: Bool { code == csuv_ecanceled() }

    /// The shared error kind for this status. On Unix a uv status is a negated errno, so the errno mapping
    /// applies; the name kept is libuv's (`UV_ECONNREFUSED`).
    public func connectionError(_ operation: String) -> ConnectionError {
        let systemCode = ConnectionError.SystemCode(domain: "uv", code: code, name: "UV_" + name)
        if csuv_is_eai(code) != 0 {
            return ConnectionError(.hostNotFound, "\(operation): \(message)", systemCode: systemCode)
        }
        if isCanceled { return ConnectionError(.cancelled, "\(operation): \(message)", systemCode: systemCode) }
        if isEOF { return ConnectionError(.closed, "\(operation): end of stream", systemCode: systemCode) }
        var error = ConnectionError.errno(-code, operation)
        error.detail = "\(operation): \(message)"
        error.systemCode = systemCode
        return error
    }

    /// Throws when `status` is an error.
    @discardableResult
    static func check(_ status: Int32) throws(UVError) -> Int32 {
        if status < 0 { throw UVError(status) }
        return status
    }
}
