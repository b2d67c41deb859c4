public import ConnectionCore
public import Logging

extension BoundsLog {
    /// A `BoundsLog.handler` that sends each diagnostic line to `logger`: the message is the line, the level
    /// `level`, and the metadata says which kind of event it was (`socketstyles.event`: `connection limit`, `idle
    /// timeout`, `descriptor limit`, `udp peer limit`).
    ///
    /// Install it before the first listener starts, or any time later (it replaces the standard-error handler
    /// `Backend.listen` installs when none is set):
    ///
    /// ```swift
    /// BoundsLog.handler = BoundsLog.logging(to: Logger(label: "chat-server"))
    /// ```
    public static func logging(
        to logger: Logger, level: Logger.Level = .warning
    ) -> @Sendable (BoundsLog.Event, String) -> Void {
        { event, line in
            logger.log(level: level, "\(line)", metadata: ["socketstyles.event": "\(event.rawValue)"])
        }
    }
}
