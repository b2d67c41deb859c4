import Glibc

/// A receive buffer per thread, for the reads that finish within one synchronous call (recv(2) once the socket is
/// readable): the bytes are read into the calling thread's buffer and copied out at the length that arrived, so
/// an idle connection keeps no read buffer of its own. With 10,000 idle connections a 64 KiB buffer per
/// connection, one page of it touched, was 4 KiB of the server's memory per connection (docs/benchmarks.md);
/// SwiftNIO's receive allocator and uWebSockets' shared receive buffer avoid it the same way.
///
/// A reader whose bytes arrive after its call returned (an io_uring receive, which the kernel completes later)
/// needs a buffer that outlives the wait, and cannot use this one.
@_spi(Loop) public enum ThreadReadBuffer {
    /// Each thread's buffer: a `Header` followed by its bytes, freed when the thread ends.
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let status = pthread_key_create(&key) { free($0) }
        precondition(status == 0, "pthread_key_create failed: \(status)")
        return key
    }()

    private struct Header { var capacity: Int }
    private static let headerSize = (MemoryLayout<Header>.size + 15) & ~15

    /// The calling thread's buffer, `count` bytes long (grown when a larger one is asked for). Valid until this
    /// thread asks again: use it only within a stretch of code that does not suspend.
    public static func take(_ count: Int) -> UnsafeMutableRawBufferPointer {
        let count = max(1, count)
        if let block = pthread_getspecific(key) {
            let header = block.assumingMemoryBound(to: Header.self)
            if header.pointee.capacity >= count {
                return UnsafeMutableRawBufferPointer(start: block + headerSize, count: count)
            }
            free(block)
        }
        guard let block = malloc(headerSize + count) else {
            fatalError("out of memory for a \(count)-byte read buffer")
        }
        block.initializeMemory(as: Header.self, to: Header(capacity: count))
        pthread_setspecific(key, block)
        return UnsafeMutableRawBufferPointer(start: block + headerSize, count: count)
    }
}
