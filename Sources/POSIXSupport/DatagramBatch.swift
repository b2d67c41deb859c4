internal import CSocketShims
public import ConnectionCore
internal import Glibc

/// Datagrams received with one recvmmsg(2), each with its sender: what a UDP server under a flood reads with one
/// system call where recvfrom(2) needs one per datagram. The slots (`capacity` of `slotSize` bytes, the largest
/// datagram the socket's connections accept) are allocated once and reused by every receive; pages that no
/// datagram reached are never touched, so a batch of small datagrams keeps little resident. One reader at a time.
///
/// A recvmmsg that finds one datagram still looks for a second under the socket's lock before it returns: about
/// 0.4 us of a 64-byte UDP echo's round trip on this project's machine (a C server with recvmmsg 32 against one
/// with recvfrom, 11.8 against 11.4 us). So a batch made `singlesAfterSingles` asks for one datagram after
/// receives that found one each (request and answer), as recvmsg(2) would, and looks for a whole batch again every
/// eighth receive: a flood fills that probe and the batches come back. A receive that asked for one cannot tell
/// whether it emptied the socket: only a reader whose wait is level-triggered (poll, or epoll without EPOLLET)
/// may take ``drained`` then as "wait before reading again"; one waiting for edges would miss a datagram that
/// came before its last wait.
public final class DatagramBatch: @unchecked Sendable {
    /// The most bytes one datagram may have; a larger one is reported by ``length(_:)``, its bytes cut.
    public let slotSize: Int
    /// The most datagrams one receive takes.
    public let capacity: Int
    /// How many datagrams the last ``receive(_:dontWait:)`` took.
    public private(set) var count = 0
    /// Whether the last receive took fewer datagrams than it asked for (the socket was empty then), or, for a
    /// batch made `singlesAfterSingles`, asked for one (then a guess: a receive now would most likely find
    /// nothing, so the caller waits for readiness first; with level-triggered readiness a wrong guess costs a wait
    /// that returns at once, never a datagram).
    public private(set) var drained = false
    /// Whether runs of single datagrams are read one at a time (see the type's documentation).
    public let singlesAfterSingles: Bool
    /// Receives in a row that found one datagram.
    private var singles = 0
    private let slots: UnsafeMutableRawBufferPointer
    private let lengths: UnsafeMutablePointer<UInt32>
    /// `capacity` sockaddr_storage records.
    private let addresses: UnsafeMutableRawPointer
    private static let addressSize = csock_sockaddr_storage_size()
    private let addressLengths: UnsafeMutablePointer<socklen_t>

    /// - Parameters:
    ///   - capacity: the most datagrams one receive takes (at most 64).
    ///   - slotSize: the largest datagram accepted whole.
    ///   - singlesAfterSingles: ask for one datagram while they come one at a time; only for a reader that waits
    ///     for level-triggered readiness before each receive the batch calls drained.
    public init(capacity: Int = 16, slotSize: Int, singlesAfterSingles: Bool = false) {
        self.singlesAfterSingles = singlesAfterSingles
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
    public func receive(
        _ descriptor: borrowing BorrowedDescriptor, dontWait: Bool
    ) throws(ConnectionError) -> IOResult<Int> {
        let fd = descriptor.number
        count = 0
        let asked = singlesAfterSingles && singles > 0 && singles % 8 != 0 ? 1 : capacity
        let result = try Syscall.retryingIO("recvmmsg") {
            Int(
                csock_recv_datagrams(
                    fd, slots.baseAddress, slotSize, Int32(asked), lengths, addresses, addressLengths,
                    dontWait ? 1 : 0))
        }
        if case .processed(let received) = result {
            count = received
            singles = received == 1 ? singles &+ 1 : 0
            drained = received < asked || asked == 1
        }
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

extension DatagramDemultiplexer where Address == SocketAddress {
    /// Hands each datagram of the batch's last receive to its sender's connection: one larger than a slot as a
    /// `.messageTooLarge` failure for that peer, one from a sender that is not an IP address to nobody.
    public func deliver(_ batch: DatagramBatch) {
        for index in 0..<batch.count {
            guard let from = try? batch.sender(index) else { continue }
            let length = batch.length(index)
            if length > batch.slotSize {
                deliverFailure(
                    ConnectionError(.messageTooLarge, "a \(length)-byte datagram exceeds \(batch.slotSize) bytes"),
                    from: from)
            } else {
                deliver([UInt8](batch.bytes(index)), from: from)
            }
        }
    }
}
