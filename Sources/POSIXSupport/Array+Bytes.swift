public import ConnectionCore

extension Array where Element == UInt8 {
    /// `withUnsafeBytes` for bodies that throw ``ConnectionError`` (the standard one only rethrows untyped).
    @inlinable
    public func withBytes<R>(
        _ body: (UnsafeRawBufferPointer) throws(ConnectionError) -> R
    ) throws(ConnectionError)
        -> R
    {
        let result: Result<R, ConnectionError> = withUnsafeBytes { buffer in
            Result { () throws(ConnectionError) -> R in try body(buffer) }
        }
        return try result.get()
    }
}
