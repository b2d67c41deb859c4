internal import CSocketShims
public import ConnectionCore
internal import Glibc

/// Datagrams received with one recvmmsg(2), each with its sender: what a UDP server under a flood reads with one
/// system call where recvfrom(2) needs one per datagram. The slots (`capacity` of `slotSize` bytes, the largest
/// datagram the socket's connections accept) are allocated once and reused by every receive; pages that no
/// datagram reached are never touched, so a batch of small datagrams keeps little resident. One reader at a time.
public final class DatagramBatch: @unchecked Sendable {
    /// The most bytes one datagram may have; a larger one is reported by ``length(_:)``, its bytes cut.
    public let slotSize: Int
    /// The most datagrams one receive takes.
    public let capacity: Int
    /// How many datagrams the last ``receive(_:dontWait:)`` took.
    public private(set) var count = 0
    private let slots: UnsafeMutableRawBufferPointer
    private let lengths: UnsafeMutablePointer<UInt32>
    /// `capacity` sockaddr_storage records.
    private let addresses: UnsafeMutableRawPointer
    private static let addressSize = csock_sockaddr_storage_size()
    private let addressLengths: UnsafeMutablePointer<socklen_t>

    public init(capacity: Int = 16, slotSize: Int) {
        self.capacity = max(1, min(capacity, 64))
        self.slotSize = slotSize
        slots = .allocate(byteCount: self.capacity * slotSize, alignment: 16)
        lengths = .allocate(capacity: self.capacity)
        addresses = .allocate(byteCount: self.capacity * Self.addressSize, alignment: 16)
        addressLengths = .allocate(capacity: self.capacity)
    }

    deinit {
        slots.deallocate()
        lengths.deallocate()
        addresses.deallocate()
        addressLengths.deallocate()
    }

    /// Receives what is there, up to ``capacity`` datagrams: waits for the first unless `dontWait`, never for
    /// the others. `.wouldBlock` when none is there and `dontWait`.
    public func receive(_ fd: Int32, dontWait: Bool) throws(ConnectionError) -> IOResult<Int> {
        count = 0
        let result = try Syscall.retryingIO("recvmmsg") {
            Int(
                csock_recv_datagrams(
                    fd, slots.baseAddress, slotSize, Int32(capacity), lengths, addresses, addressLengths,
                    dontWait ? 1 : 0))
        }
        if case .processed(let received) = result { count = received }
        return result
    }

    /// Datagram `index`'s real length: more than ``slotSize`` when it did not fit (its bytes are cut).
    public func length(_ index: Int) -> Int { Int(lengths[index]) }

    /// Datagram `index`'s bytes (valid until the next receive), at most ``slotSize``.
    public func bytes(_ index: Int) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(
            rebasing: slots[(index * slotSize)..<(index * slotSize + min(length(index), slotSize))])
    }

    /// Datagram `index`'s sender.
    public func sender(_ index: Int) throws(ConnectionError) -> SocketAddress {
        let record = UnsafeRawPointer(addresses + index * Self.addressSize)
        guard let address = SocketAddress(record, length: Int(addressLengths[index]))
        else { throw ConnectionError(.unsupported, "recvmmsg: sender is not an IP address") }
        return address
    }
}
