import ConnectionCore
import Logging
import SocketStylesLogging
import Synchronization
import Testing

/// What a CapturingHandler was given.
private final class Records: Sendable {
    let list = Guarded<[CapturingHandler.Record]>([])
}

/// A LogHandler that keeps what it is given.
private struct CapturingHandler: LogHandler {
    struct Record: Sendable {
        var level: Logger.Level
        var message: String
        var metadata: Logger.Metadata
    }
    let records: Records
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        records.list.withLock {
            $0.append(Record(level: event.level, message: "\(event.message)", metadata: event.metadata ?? [:]))
        }
    }
}

@Suite struct LoggingHookTests {
    @Test func boundsLinesBecomeLogRecords() {
        let records = Records()
        let logger = Logger(label: "test") { _ in CapturingHandler(records: records) }
        let handler = BoundsLog.logging(to: logger, level: .notice)
        handler(.connectionLimit, "refused 127.0.0.1:5 on 127.0.0.1:6: 1 connections open")
        handler(.idleTimeout, "closed 127.0.0.1:7: idle for 1 s")
        let seen = records.list.withLock { $0 }
        #expect(seen.count == 2)
        #expect(seen.map(\.level) == [.notice, .notice])
        #expect(seen.first?.message == "refused 127.0.0.1:5 on 127.0.0.1:6: 1 connections open")
        #expect(seen.map { $0.metadata["socketstyles.event"]?.description } == ["connection limit", "idle timeout"])
    }

    @Test func aLoggerBelowTheLevelDropsTheLine() {
        let records = Records()
        var logger = Logger(label: "test") { _ in CapturingHandler(records: records) }
        logger.logLevel = .error
        BoundsLog.logging(to: logger)(.descriptorLimit, "accepting paused")
        #expect(records.list.withLock { $0.isEmpty })
    }
}
