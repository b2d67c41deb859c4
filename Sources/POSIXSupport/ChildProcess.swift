internal import CSocketShims
public import ConnectionCore
import Glibc
import Synchronization

/// A child process started with posix_spawn, its standard input and output as pipes. Used where Foundation's
/// `Process` would add run-loop machinery to the calling thread (its `waitUntilExit` spins a run loop that
/// Foundation creates on demand), which tests that count descriptors must not see.
public final class ChildProcess: Sendable {
    /// The child's process id.
    public let pid: Int32
    /// The pipes' ends on our side; each closed once (the owner type is the sockets' one: any descriptor).
    private let stdinFD: SocketDescriptor
    private let stdoutFD: SocketDescriptor
    /// The status once reaped.
    private let exitStatus = Guarded<Int32?>(nil)
    private var exited: Bool { exitStatus.withLock { $0 != nil } }
    /// The exit status once ``wait()`` returned (0 before).
    public var status: Int32 { exitStatus.withLock { $0 ?? 0 } }

    /// Starts `arguments[0]` (a path) with `arguments`; stderr goes with stdout when `mergeErrors`. With
    /// `outputReaderGone`, the child's stdout is a pipe whose reading end is closed before it starts (a reader
    /// that went away: its writes fail with EPIPE), and what we read is its stderr.
    public init(
        _ arguments: [String], mergeErrors: Bool = true, outputReaderGone: Bool = false
    )
        throws(ConnectionError)
    {
        var input: [Int32] = [0, 0]
        var output: [Int32] = [0, 0]
        guard csock_pipe_cloexec(&input) == 0 else { throw .errno(errno, "pipe2") }
        guard csock_pipe_cloexec(&output) == 0 else {
            let code = errno
            close(input[0])
            close(input[1])
            throw .errno(code, "pipe2")
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, input[0], 0)
        var gone: [Int32] = [-1, -1]
        if outputReaderGone {
            guard csock_pipe_cloexec(&gone) == 0 else {
                let code = errno
                for fd in input + output { close(fd) }
                throw .errno(code, "pipe2")
            }
            close(gone[0])
            posix_spawn_file_actions_adddup2(&actions, gone[1], 1)
            posix_spawn_file_actions_adddup2(&actions, output[1], 2)
        } else {
            posix_spawn_file_actions_adddup2(&actions, output[1], 1)
            if mergeErrors { posix_spawn_file_actions_adddup2(&actions, output[1], 2) }
        }
        // The child starts with no signal blocked and default handlers: posix_spawn would otherwise pass on
        // this process's mask (threads here block signals to route them), and a tool timed by SIGALRM, such
        // as sockperf, would never see its timer.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGPIPE, SIGINT, SIGTERM, SIGALRM, SIGUSR1, SIGUSR2, SIGCHLD] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var cArguments: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for argument in cArguments { free(argument) } }
        var child: pid_t = 0
        let result = posix_spawn(&child, arguments[0], &actions, &attributes, &cArguments, environ)
        close(input[0])
        close(output[1])
        if gone[1] >= 0 { close(gone[1]) }
        guard result == 0 else {
            close(input[1])
            close(output[0])
            throw .errno(result, "posix_spawn \(arguments[0])")
        }
        pid = child
        stdinFD = SocketDescriptor(adopting: input[1])
        stdoutFD = SocketDescriptor(adopting: output[0])
    }

    deinit {
        if !exited { _ = try? wait() }
    }

    /// Reads one line of the child's output (without the newline); empty at the end.
    public func readLine() -> String {
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while let count = stdoutFD.ifOpen({ read($0.number, &byte, 1) }) {
            if count < 0 && errno == EINTR { continue }
            if count <= 0 || byte == UInt8(ascii: "\n") { break }
            line.append(byte)
        }
        return String(decoding: line, as: UTF8.self)
    }

    /// Reads the child's output to its end.
    public func readToEnd() -> String {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while let count = stdoutFD.ifOpen({ read($0.number, &buffer, buffer.count) }) {
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { break }
            bytes += buffer[..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Writes `text` to the child's standard input.
    public func write(_ text: String) throws(ConnectionError) {
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count,
            let count = stdinFD.ifOpen({ fd in
                bytes[offset...].withUnsafeBytes { Glibc.write(fd.number, $0.baseAddress, $0.count) }
            })
        {
            if count < 0 {
                if errno == EINTR { continue }
                throw .errno(errno, "writing to child \(pid)")
            }
            offset += count
        }
    }

    /// Asks the child to stop (SIGTERM), or makes it (`force`: SIGKILL, for tools that may ignore SIGTERM).
    public func terminate(force: Bool = false) {
        if !exited { kill(pid, force ? SIGKILL : SIGTERM) }
    }

    /// Closes the child's standard input (children that stop at its end then exit).
    public func closeInput() {
        stdinFD.close()
    }

    /// Waits for the child to exit (blocking the calling thread), closes the pipes, returns the exit status.
    @discardableResult
    public func wait() throws(ConnectionError) -> Int32 {
        if let status = exitStatus.withLock({ $0 }) { return status }
        var raw: Int32 = 0
        while waitpid(pid, &raw, 0) < 0 {
            if errno != EINTR { throw .errno(errno, "waitpid") }
        }
        reaped(raw)
        return status
    }

    /// Records the status waitpid gave (128 + the signal for a child a signal stopped) and closes the pipes.
    private func reaped(_ raw: Int32) {
        exitStatus.withLock { $0 = (raw & 0x7f) == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f) }
        closeInput()
        stdoutFD.close()
    }

    /// Waits up to `limit` for the child to exit (looking every 10 ms) and returns its status as ``wait()`` does,
    /// or `nil` when it is still running.
    public func wait(upTo limit: Duration) -> Int32? {
        let deadline = ContinuousClock.now + limit
        while !exited {
            var raw: Int32 = 0
            let result = waitpid(pid, &raw, WNOHANG)
            if result == pid {
                reaped(raw)
            } else if result < 0 && errno != EINTR {
                return nil
            } else if ContinuousClock.now >= deadline {
                return nil
            } else if result == 0 {
                usleep(10_000)
            }
        }
        return status
    }

    /// Runs `arguments` to completion and returns (exit status, output).
    public static func run(_ arguments: [String]) throws(ConnectionError) -> (status: Int32, output: String) {
        let child = try ChildProcess(arguments)
        child.closeInput()
        let output = child.readToEnd()
        return (try child.wait(), output)
    }
}
