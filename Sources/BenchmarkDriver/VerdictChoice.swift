/// How a verdict chooses among the backends that held a load, one rule for every kind of verdict
/// (``WorkloadVerdict``, ``BroadcastVerdict``): the lowest figure wins; where the run cannot tell other figures from
/// it (`indistinguishable`), the cheapest of those wins, but never one that another backend beats on both the
/// figure and the cost (ties are not transitive: a backend tied with the fastest can have a lower, cheaper
/// neighbour that is not tied with it). Every backend tied with the fastest is still named as tied. When none held
/// it, the first of `rest` (closest first) is named with what it missed.
struct VerdictChoice<Entry: VerdictEntry> {
    /// Held first, the chosen one at their head; then the rest.
    var entries: [Entry]
    var best: String?
    var closest: String?
    /// The backends tied with the fastest, other than the chosen one.
    var tied: [String]
    var reason: String

    /// What the reason says of an entry.
    struct Description {
        /// The figure and its range over the repetitions, as printed.
        var value: String
        var range: String
        var repetitions: Int
        var cost: String
    }

    /// `held`, lowest figure first; `rest`, closest first. `lowest`: how the reason names the figure when one
    /// backend is clear of the others (`p99`, `last-receipt p95`); `figure`: when it is not (`p99`, `p95`).
    init(
        held: [Entry], rest: [Entry], figure value: (Entry) -> UInt64, indistinguishable: (Entry, Entry) -> Bool,
        cheaper: (Entry, Entry) -> Bool, describe: (Entry) -> Description, lowest: String, figure: String
    ) {
        let name = { (entry: Entry) in entry.backend }
        var held = held
        best = nil
        closest = nil
        tied = []
        if let fastest = held.first {
            let tiedEntries = held.filter { indistinguishable($0, fastest) }
            let undominated = tiedEntries.filter { entry in
                !held.contains { value($0) < value(entry) && cheaper($0, entry) }
            }
            let chosen = undominated.min(by: cheaper)!
            let chosenName = name(chosen)
            best = chosenName
            tied = tiedEntries.map(name).filter { $0 != chosenName }
            held.removeAll { name($0) == chosenName }
            held.insert(chosen, at: 0)
            let about = describe(chosen)
            if tiedEntries.count == 1 {
                reason =
                    "\(chosenName) held it with the lowest \(lowest) (\(about.value), \(about.range) over \(about.repetitions) repetition(s)), clear of every other backend's"
            } else {
                let cheapest = tiedEntries.allSatisfy { name($0) == chosenName || cheaper(chosen, $0) }
                reason =
                    "\(chosenName) held it; its \(figure) (\(about.value), \(about.range)) is not distinguishable in this run from "
                    + tied.joined(separator: ", ") + "'s, and "
                    + (cheapest
                        ? "among those it costs the least: \(about.cost)"
                        : "none of those beats it on both \(figure) and cost: \(about.cost)")
            }
        } else if let nearest = rest.first {
            closest = name(nearest)
            reason =
                "no backend held it on this machine; \(name(nearest)) came closest: "
                + nearest.shortfalls.joined(separator: ", ")
        } else {
            reason = "no backend ran it"
        }
        entries = held + rest
    }
}

/// What a verdict's entry has whatever it judges: the backend, whether it held the load (on its own in how many of
/// the repetitions), and what it missed.
protocol VerdictEntry {
    var backend: String { get }
    var held: Bool { get }
    var repetitionsHeld: Int { get }
    var repetitions: Int { get }
    var shortfalls: [String] { get }
}

extension VerdictChoice {
    /// A verdict as the report prints it: `header`, a line per entry (held, or what it missed, then its `figures`),
    /// and the choice.
    static func lines(
        header: String, entries: [Entry], figures: (Entry) -> String, best: String?, reason: String
    ) -> [String] {
        var lines = [header]
        for entry in entries {
            lines.append(
                "  \(entry.backend): "
                    + (entry.held
                        ? "held it (\(entry.repetitionsHeld) of \(entry.repetitions) repetitions on their own)"
                        : "did not hold it (" + entry.shortfalls.joined(separator: "; ") + ")") + "; " + figures(entry))
        }
        lines.append(
            best.map { "  Best choice for this load: \($0). Why: \(reason)." } ?? "  No best choice: \(reason).")
        return lines
    }
}
