public import ConnectionCore

/// Many connections opened at once: the fan-in scenarios' clients, the broadcast scenario's.
public enum ConnectionBatch {
    /// Opens `count` connections with `connect`, `batchSize` at a time (so a listen backlog is not overrun), each
    /// handed to `prepare` once open (a first round trip, a hello), and returns them in the order they opened. On the
    /// first failure every connection opened is closed, and the error is thrown with how far it got.
    public static func open(
        _ count: Int, batchSize: Int = 64,
        connect: @escaping @Sendable () async throws(ConnectionError) -> any Connection,
        prepare: @escaping @Sendable (any Connection) async throws(ConnectionError) -> Void = { _ in }
    ) async throws(ConnectionError) -> [any Connection] {
        var opened: [any Connection] = []
        while opened.count < count {
            let batch = min(batchSize, count - opened.count)
            let results = await withTaskGroup(of: Result<any Connection, ConnectionError>.self) { group in
                for _ in 0..<batch {
                    group.addTask {
                        do throws(ConnectionError) {
                            let connection = try await connect()
                            do throws(ConnectionError) { try await prepare(connection) } catch {
                                await connection.close()
                                throw error
                            }
                            return .success(connection)
                        } catch {
                            return .failure(error)
                        }
                    }
                }
                var results: [Result<any Connection, ConnectionError>] = []
                for await result in group { results.append(result) }
                return results
            }
            for result in results {
                guard case .failure(var error) = result else { continue }
                for case .success(let connection) in results { await connection.close() }
                for connection in opened { await connection.close() }
                error.detail = "after \(opened.count) of \(count) connections: " + error.detail
                throw error
            }
            for case .success(let connection) in results { opened.append(connection) }
        }
        return opened
    }
}
