// What a task suspension costs by itself, with nothing else running: a task that prefers a one-thread executor
// awaits a continuation that a closure queued on that same thread resumes (the shape of a loop backend's receive
// whose completion arrives on the loop), against the same hand-off as plain callbacks through the same queue.
// Built and run by scripts/experiments/task-floor (`swiftc -O`); not part of the package.
import Foundation
import Synchronization

/// A task executor on one thread: a queue of jobs and closures, run in order.
final class LoopExecutor: TaskExecutor, @unchecked Sendable {
    enum Work {
        case job(UnownedJob)
        case block(() -> Void)
    }
    private let queue = Mutex<[Work]>([])
    private let condition = NSCondition()

    init() {
        let thread = Thread { [unowned self] in self.run() }
        thread.start()
    }

    func enqueue(_ job: consuming ExecutorJob) { add(.job(UnownedJob(job))) }

    func add(_ work: Work) {
        condition.lock()
        queue.withLock { $0.append(work) }
        condition.signal()
        condition.unlock()
    }

    private func take() -> [Work] {
        queue.withLock { queue in
            let batch = queue
            queue.removeAll(keepingCapacity: true)
            return batch
        }
    }

    private func run() {
        while true {
            condition.lock()
            var batch = take()
            while batch.isEmpty {
                condition.wait()
                batch = take()
            }
            condition.unlock()
            for work in batch {
                switch work {
                case .job(let job): job.runSynchronously(on: asUnownedTaskExecutor())
                case .block(let block): block()
                }
            }
        }
    }
}

@inline(never) func suspend(_ loop: LoopExecutor) async {
    await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
        loop.add(.block { continuation.resume() })
    }
}

@inline(never) func suspendCancellable(_ loop: LoopExecutor) async {
    await withTaskCancellationHandler {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            loop.add(.block { continuation.resume() })
        }
    } onCancel: {}
}

/// Three async calls above the wait, as a wrapper, an adapter and a socket are.
@inline(never) func layer1(_ loop: LoopExecutor) async { await layer2(loop) }
@inline(never) func layer2(_ loop: LoopExecutor) async { await layer3(loop) }
@inline(never) func layer3(_ loop: LoopExecutor) async { await suspendCancellable(loop) }

/// The same hand-offs with no task: each callback queues the next.
func callbacks(_ loop: LoopExecutor, count: Int) async -> Double {
    final class Left: @unchecked Sendable { var count = 0 }
    return await withUnsafeContinuation { (done: UnsafeContinuation<Double, Never>) in
        let start = DispatchTime.now().uptimeNanoseconds
        let left = Left()
        left.count = count
        func step() {
            left.count -= 1
            if left.count == 0 {
                done.resume(returning: Double(DispatchTime.now().uptimeNanoseconds - start) / Double(count))
                return
            }
            loop.add(.block(step))
        }
        loop.add(.block(step))
    }
}

func timed(_ loop: LoopExecutor, count: Int, _ body: @escaping @Sendable (LoopExecutor) async -> Void) async -> Double {
    await Task(executorPreference: loop) {
        let start = DispatchTime.now().uptimeNanoseconds
        for _ in 0..<count { await body(loop) }
        return Double(DispatchTime.now().uptimeNanoseconds - start) / Double(count)
    }.value
}

let loop = LoopExecutor()
let count = 2_000_000
func ns(_ value: Double) -> String { String(format: "%.0f ns", value) }
for round in 1...3 {
    let plain = await timed(loop, count: count) { await suspend($0) }
    let cancellable = await timed(loop, count: count) { await suspendCancellable($0) }
    let layered = await timed(loop, count: count) { await layer1($0) }
    let handOff = await callbacks(loop, count: count)
    print(
        "run \(round): callback hand-off \(ns(handOff)), suspend and resume \(ns(plain)), "
            + "with a cancellation handler \(ns(cancellable)), three async calls above it \(ns(layered))")
}
