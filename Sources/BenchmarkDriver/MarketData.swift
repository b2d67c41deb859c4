/// Realistic WebSocket text: market-data JSON like the feeds the seeds' clients read (an order book update
/// of price levels), about 1.1 KB with 40 levels a side. Consecutive updates differ in their sizes only, so a
/// compressor with context takeover finds most of each message in the one before it.
public enum MarketData {
    /// The order book update number `sequence`.
    public static func book(_ sequence: Int, levels: Int = 40) -> String {
        let bids = (0..<levels).map { "[\(10_000 - $0 * 5).25,\(($0 * 7 + sequence) % 90 + 1)]" }
        let asks = (0..<levels).map { "[\(10_005 + $0 * 5).75,\(($0 * 3 + sequence) % 70 + 1)]" }
        return #"{"type":"book","symbol":"BTC-USD","sequence":\#(sequence),"bids":[\#(bids.joined(separator: ","))],"#
            + #""asks":[\#(asks.joined(separator: ","))]}"#
    }
}
