// The parts of a ReceiveQueue's state that have a shape of their own: the line of waiting receivers and the framing
// queues of one kind share.

extension ReceiveQueue {
    /// The receivers waiting, first come first served. The first is kept inline: one receiver at a time is the
    /// contract's common case, and an idle connection's queue then holds its waiter without an array of its own
    /// (docs/benchmarks.md, memory per connection).
    @usableFromInline
    struct WaiterLine: Sendable {
        /// `nil` only when nobody waits (then `rest` is empty too).
        @usableFromInline var head: Waiter?
        @usableFromInline var rest: [Waiter] = []

        @inlinable init() {}

        @inlinable var isEmpty: Bool { head == nil }
        @inlinable var first: Waiter? { head }
        @inlinable var count: Int { head == nil ? 0 : 1 + rest.count }

        @inlinable mutating func append(_ waiter: Waiter) {
            if head == nil { head = waiter } else { rest.append(waiter) }
        }

        @inlinable @discardableResult mutating func removeFirst() -> Waiter {
            let first = head!
            head = rest.isEmpty ? nil : rest.removeFirst()
            return first
        }

        /// Takes out the waiter with this number, wherever it is in line.
        @inlinable mutating func remove(id: UInt64) -> Waiter? {
            if head?.id == id { return removeFirst() }
            guard let index = rest.firstIndex(where: { $0.id == id }) else { return nil }
            return rest.remove(at: index)
        }

        /// Everyone, in order, leaving the line empty.
        @inlinable mutating func removeAll() -> [Waiter] {
            guard let head else { return [] }
            let all = [head] + rest
            self = WaiterLine()
            return all
        }
    }

    /// How a queue's elements weigh, split and join
    /// (see ``ReceiveQueue/init(capacity:weigh:split:join:onSpaceAvailable:)``), in one object that queues of the
    /// same kind share: three closures in every queue would be 48 bytes of every connection (docs/benchmarks.md,
    /// memory per connection).
    public final class Framing: Sendable {
        @usableFromInline let weigh: @Sendable (Element) -> Int
        @usableFromInline let split: (@Sendable (inout Element, Int) -> Element?)?
        @usableFromInline let join: (@Sendable (inout Element, Element) -> Void)?

        public init(
            weigh: @escaping @Sendable (Element) -> Int = { _ in 1 },
            split: (@Sendable (inout Element, Int) -> Element?)? = nil,
            join: (@Sendable (inout Element, Element) -> Void)? = nil
        ) {
            self.weigh = weigh
            self.split = split
            self.join = join
        }
    }
}
