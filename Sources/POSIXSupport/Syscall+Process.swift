internal import CSocketShims
package import ConnectionCore
internal import Glibc

// The process: SIGPIPE, open descriptors (/proc/self/fd), CPU placement, standard error.
extension Syscall {
    /// Ignores SIGPIPE for the whole process (belt and braces: every send already passes MSG_NOSIGNAL).
    package static func ignoreSIGPIPE() {
        _ = signal(SIGPIPE, SIG_IGN)
    }

    /// Bytes the allocator (glibc malloc, every arena) has handed out and not had back: what the program holds,
    /// whatever the resident memory says about where the allocator put it (memory freed by one thread and taken
    /// again by another may sit in two arenas, and count twice in RSS).
    package static func heapInUseBytes() -> UInt64 {
        UInt64(csock_heap_in_use())
    }

    /// The number of open file descriptors of this process (entries of /proc/self/fd, minus the one used to
    /// list them).
    package static func openDescriptorCount() -> Int {
        guard let directory = opendir("/proc/self/fd") else { return -1 }
        defer { closedir(directory) }
        var count = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { $0.first }
            if name != UInt8(ascii: ".") { count += 1 }
        }
        return count - 1
    }

    /// The open descriptors of this process with what they point at, for leak reports.
    package static func openDescriptors() -> [String] {
        guard let directory = opendir("/proc/self/fd") else { return [] }
        let own = dirfd(directory)
        defer { closedir(directory) }
        var result: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            guard let fd = Int32(name), fd != own else { continue }
            var target = [CChar](repeating: 0, count: 256)
            let count = readlink("/proc/self/fd/\(name)", &target, 255)
            let text = count > 0 ? String(decoding: target[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
            result.append("\(fd) -> \(text)")
        }
        return result
    }

    /// Writes `text` to standard error in one write(2) (a log line from a library, without Foundation).
    package static func writeStandardError(_ text: String) {
        var text = text
        text.withUTF8 { bytes in _ = Glibc.write(2, bytes.baseAddress, bytes.count) }
    }

    /// Pins every thread of this process to `cpu` (threads created later inherit it from their creator).
    /// - Returns: how many threads were pinned.
    @discardableResult
    package static func pinProcess(toCPU cpu: Int) throws(ConnectionError) -> Int {
        guard let directory = opendir("/proc/self/task") else { throw .errno(Glibc.errno, "opendir /proc/self/task") }
        defer { closedir(directory) }
        var pinned = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            guard let tid = Int32(name) else { continue }
            if csock_pin_thread(tid, Int32(cpu)) != 0 {
                let code = Glibc.errno
                if code == ESRCH { continue }  // the thread ended meanwhile
                throw .errno(code, "sched_setaffinity(cpu \(cpu))")
            }
            pinned += 1
        }
        return pinned
    }

    /// The number of CPUs online.
    package static var cpuCount: Int { Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))) }

    /// Pins only the calling thread to `cpu`.
    package static func pinCurrentThread(toCPU cpu: Int) throws(ConnectionError) {
        if csock_pin_thread(0, Int32(cpu)) != 0 { throw .errno(Glibc.errno, "sched_setaffinity(cpu \(cpu))") }
    }
}
