extension AsyncSocket {
    /// Incoming messages (TCP chunks or UDP datagrams) until the peer finishes; one iterator at a time.
    public var messages: Messages { Messages(socket: self) }

    /// The AsyncSequence of ``messages``.
    public struct Messages: AsyncSequence, Sendable {
        public typealias Element = [UInt8]
        let socket: AsyncSocket

        public struct AsyncIterator: AsyncIteratorProtocol {
            let socket: AsyncSocket
            public mutating func next() async throws -> [UInt8]? {
                try await socket.receive()
            }
        }

        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(socket: socket) }
    }
}
