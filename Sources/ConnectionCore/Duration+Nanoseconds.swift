extension Duration {
    /// The duration in whole nanoseconds; a negative duration counts as 0. The one conversion every timer,
    /// deadline and benchmark window here uses.
    public var wholeNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0, attoseconds >= 0 else { return 0 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }
}
