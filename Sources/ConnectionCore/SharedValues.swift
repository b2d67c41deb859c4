/// The values of an options struct, in one immutable object that every copy of the struct shares: a copy is one
/// reference, not the values, so a connection object that keeps the options it was made with costs 8 bytes for
/// them however many there are (`ConnectionOptions`, `WebSocketOptions`; docs/benchmarks.md, memory per
/// connection). A change makes a new object (`changing(_:)`); options are set before they are used.
public final class SharedValues<Values: Sendable & Hashable>: Sendable, Hashable {
    public let values: Values

    @inlinable public init(_ values: Values) { self.values = values }

    /// A new object with `change` applied to a copy of the values.
    @inlinable public func changing(_ change: (inout Values) -> Void) -> SharedValues {
        var values = values
        change(&values)
        return SharedValues(values)
    }

    public static func == (lhs: SharedValues, rhs: SharedValues) -> Bool {
        lhs === rhs || lhs.values == rhs.values
    }

    public func hash(into hasher: inout Hasher) { values.hash(into: &hasher) }
}
