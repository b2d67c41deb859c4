import BenchmarkDriver
import ConnectionCore
import Foundation
import SocketStyles
import Synchronization

/// What `ping` and `pump` share around their runner: a ``RunStop`` requested by SIGINT or SIGTERM (remembering
/// which) or by the end of `--time`, and interval lines printed in order, off the measuring task (to standard
/// error with `--json`, so standard output stays JSON).
final class RunControl<Interval: Sendable>: Sendable {
    let stop = RunStop()
    private final class Signalled: Sendable { let reason = Guarded<String?>(nil) }
    private let signalled = Signalled()
    private let signals: Task<Void, Never>
    private let timer: Task<Void, Never>?
    private let sink: AsyncStream<Interval>.Continuation
    private let printer: Task<Void, Never>

    init(seconds: Double?, json: Bool, line: @escaping @Sendable (Interval) -> String) {
        let stop = stop
        let signalled = signalled
        signals = Task {
            let reason = await StopSignal.wait(stdinEOF: false)
            if Task.isCancelled { return }
            signalled.reason.withLock { $0 = reason }
            stop.request()
        }
        timer = seconds.map { seconds in
            Task {
                try? await Task.sleep(for: .milliseconds(Int64(seconds * 1000)))
                if !Task.isCancelled { stop.request() }
            }
        }
        let (intervals, sink) = AsyncStream.makeStream(of: Interval.self)
        self.sink = sink
        printer = Task {
            for await interval in intervals {
                if json { Console.error(line(interval)) } else { Console.line(line(interval)) }
            }
        }
    }

    /// For the runner's interval callback.
    @Sendable func report(_ interval: Interval) { sink.yield(interval) }

    /// "stopped by SIGINT" when a signal ended the run.
    var stoppedBy: String? { signalled.reason.withLock { $0 } }

    /// The run is over: the last interval lines are printed, the signal watch and the timer end.
    func finish() async {
        sink.finish()
        await printer.value
        signals.cancel()
        timer?.cancel()
    }

    /// The start of an interval line, iperf3's way: `[  1.00-  2.00 s] `.
    static func span(_ from: Duration, _ to: Duration) -> String {
        String(
            format: "[%6.2f-%6.2f s] ", Double(from.wholeNanoseconds) / 1e9, Double(to.wholeNanoseconds) / 1e9)
    }
}
