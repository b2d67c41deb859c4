import ArgumentParser
import BenchmarkDriver
import Foundation
import SocketStyles

/// Two compare runs set row against row: for each backend x transport x scenario both ran, and each figure, the
/// change from the old run to the new one, and whether the new run is faster, slower, or not distinguishable.
///
/// The runs are not paired pass by pass (they ran at different times), so every pass of the new row is set
/// against every pass of the old one: a row is slower when at least 80% of those pairs are worse (the share
/// ``PairedRanking`` asks of a step in a ranking), faster when at least 80% are better, else not distinguishable;
/// with fewer than 5 pairs (one pass on either side) the run cannot say. The change is the interquartile mean of
/// the pairs' ratios with their lowest and highest (``Ratio``).
struct ReportDiff {
    enum Verdict: String {
        case faster, slower
        case same = "not distinguishable"
    }

    struct Line {
        var scenario: Scenario
        var backend: String
        var transport: String
        var figure: String
        var old: Double
        var new: Double
        /// New over old, pass pairs; `nil` when a side has no figure.
        var change: Ratio?
        /// Worse, as a share of the change: +12% is 12% slower whichever way the figure reads.
        var worse: Double
        var verdict: Verdict
        /// Whether this figure is the one the scenario is judged by (always printed).
        var main: Bool
        /// Pass pairs in which the new row was worse, and all pairs.
        var worseCount: Int
        var pairCount: Int
        /// The old and new figures as the figure prints them.
        var shown: (old: String, new: String)
    }

    /// One figure of a row: its name, its value in each pass, how it is printed, and which way is better.
    struct Figure {
        var name: String
        var values: (ScenarioResult) -> Double?
        var show: (Double) -> String
        var higherIsBetter: Bool
        var main: Bool

        /// The same figure over the C floor's in each pass: `1.42x`.
        var overFloor: Figure {
            Figure(
                name: name.replacingOccurrences(of: " us", with: "") + " x floor",
                values: values, show: { "\(fixed($0))x" }, higherIsBetter: higherIsBetter, main: main)
        }
    }

    let old: Report
    let new: Report
    /// Compare the figures themselves, not each over the C floor of its pass.
    let raw: Bool
    /// Every compared figure (see ``compared(old:new:raw:)``), computed once.
    let lines: [Line]

    init(old: Report, new: Report, raw: Bool = false) {
        self.old = old
        self.new = new
        self.raw = raw
        lines = Self.compared(old: old, new: new, raw: raw)
    }

    /// Rows of both runs, in the new run's order (the C floor's left out: see ``floorLines``); rows only one run
    /// has are counted, not compared. Each figure is taken over the C floor's in the same pass when both runs have
    /// that floor row (the machine's speed on the day then cancels: two runs of one build on this VM differed by
    /// 28% in the C floor's own pump), else as it is.
    static func compared(old: Report, new: Report, raw: Bool) -> [Line] {
        new.rows.filter { $0.backend != Report.floorName }.flatMap { row -> [Line] in
            guard let before = old.row(row.backend, row.transport, row.scenario) else { return [] }
            let floors =
                raw
                ? nil : Self.floor(for: before, in: old).flatMap { o in Self.floor(for: row, in: new).map { (o, $0) } }
            return Self.figures(row.scenario, [before, row]).compactMap { figure in
                guard let floors else {
                    return Self.line(
                        row: row, olds: before.repetitions.map(figure.values), news: row.repetitions.map(figure.values),
                        figure: figure)
                }
                return Self.line(
                    row: row, olds: Self.over(before, floors.0, figure), news: Self.over(row, floors.1, figure),
                    figure: figure.overFloor)
            }
        }
    }

    /// The C floor's own rows, old against new: how much faster or slower the machine was.
    var floorLines: [Line] {
        new.rows.filter { $0.backend == Report.floorName }.flatMap { row -> [Line] in
            guard let before = old.row(row.backend, row.transport, row.scenario) else { return [] }
            return Self.figures(row.scenario, [before, row]).filter(\.main).compactMap {
                Self.line(
                    row: row, olds: before.repetitions.map($0.values), news: row.repetitions.map($0.values), figure: $0)
            }
        }
    }

    /// The C floor's row measured in the same passes as `row`, when it has one per pass of `row`.
    static func floor(for row: ReportRow, in report: Report) -> ReportRow? {
        let floor =
            report.floorRow(for: row)
            ?? report.row(Report.floorName, row.transport == "udp" ? "udp" : "tcp", row.scenario)
        guard let floor, floor.repetitions.count == row.repetitions.count else { return nil }
        return floor
    }

    /// Rows in one run only: (in the old only, in the new only).
    var unmatched: (old: Int, new: Int) {
        let oldOnly = old.rows.filter { new.row($0.backend, $0.transport, $0.scenario) == nil }.count
        let newOnly = new.rows.filter { old.row($0.backend, $0.transport, $0.scenario) == nil }.count
        return (oldOnly, newOnly)
    }

    /// What a row is compared by: its main figure (the quiet p50 for closed-loop round trips, as in the rankings),
    /// its p99 where the main figure is another one, and the CPU per message.
    static func figures(_ scenario: Scenario, _ rows: [ReportRow]) -> [Figure] {
        let kind = scenario.kind
        let microseconds: (Double) -> String = { fixed($0 / 1000, 1) }
        var figures: [Figure] = []
        if kind.higherIsBetter {
            figures.append(
                Figure(
                    name: kind.mainFigureName, values: { kind.mainFigure($0) }, show: { fixed($0 / 1e6, 1) },
                    higherIsBetter: true, main: true))
        } else if kind.judgedByP50,
            rows.allSatisfy({ $0.repetitions.allSatisfy { $0.quietP50 != nil } })
        {
            figures.append(
                Figure(
                    name: "quiet p50 us", values: { $0.quietP50.map { Double($0) } }, show: microseconds,
                    higherIsBetter: false, main: true))
        } else {
            figures.append(
                Figure(
                    name: kind.mainFigureName, values: { kind.mainFigure($0) }, show: microseconds,
                    higherIsBetter: false, main: true))
        }
        if kind.mainFigureName != "p99 us", rows.allSatisfy({ $0.median.latency != nil }) {
            figures.append(
                Figure(
                    name: "p99 us", values: { $0.latency.map { Double($0.p99) } }, show: microseconds,
                    higherIsBetter: false, main: false))
        }
        figures.append(
            Figure(
                name: "cpu us/msg", values: { $0.cpuPerMessageNanoseconds }, show: microseconds,
                higherIsBetter: false, main: false))
        return figures
    }

    /// `figure` of each pass of `row` over the floor's in the same pass.
    static func over(_ row: ReportRow, _ floor: ReportRow, _ figure: Figure) -> [Double?] {
        zip(row.repetitions, floor.repetitions).map { mine, floor in
            figure.values(mine).flatMap { value in figure.values(floor).flatMap { $0 > 0 ? value / $0 : nil } }
        }
    }

    /// One figure of a row, from its values in each pass of the old and the new run.
    static func line(row: ReportRow, olds: [Double?], news: [Double?], figure: Figure) -> Line? {
        let olds = olds.compactMap { $0 }.filter { $0 > 0 && $0.isFinite }
        let news = news.compactMap { $0 }.filter { $0 > 0 && $0.isFinite }
        guard let oldCenter = Ratio(olds)?.center, let newCenter = Ratio(news)?.center else { return nil }
        let ratios = news.flatMap { value in olds.map { value / $0 } }
        let change = Ratio(ratios)
        let worseCount = ratios.filter { figure.higherIsBetter ? $0 < 1 : $0 > 1 }.count
        let betterCount = ratios.filter { figure.higherIsBetter ? $0 > 1 : $0 < 1 }.count
        let share = PairedRanking.sureShare * Double(ratios.count)
        let verdict: Verdict =
            ratios.count < PairedRanking.fewestPairs
            ? .same
            : Double(worseCount) >= share ? .slower : Double(betterCount) >= share ? .faster : .same
        let center = change?.center ?? 1
        return Line(
            scenario: row.scenario, backend: row.backend, transport: row.transport, figure: figure.name,
            old: oldCenter, new: newCenter, change: change,
            worse: figure.higherIsBetter ? 1 / center - 1 : center - 1, verdict: verdict, main: figure.main,
            worseCount: worseCount, pairCount: ratios.count, shown: (figure.show(oldCenter), figure.show(newCenter)))
    }

    /// The terminal's text: a table of every row's main figure and of the other figures that changed, then the
    /// counts. Values are printed as the figure's own unit.
    func text(wide: Bool) -> String {
        let all = lines
        let shown = all.filter { $0.main || $0.verdict != .same }
        let header = ["scenario", "backend", "transport", "figure", "old", "new", "new/old", "pairs worse", "verdict"]
        let cells = shown.map { line -> [String] in
            [
                line.scenario.description, line.backend, line.transport, line.figure, line.shown.old, line.shown.new,
                line.change?.text ?? "-", "\(line.worseCount)/\(line.pairCount)", line.verdict.rawValue,
            ]
        }
        var text = Report.render(header, cells) + "\n"
        let counts = Dictionary(grouping: all, by: \.verdict).mapValues(\.count)
        let mains = all.filter(\.main)
        let mainCounts = Dictionary(grouping: mains, by: \.verdict).mapValues(\.count)
        let (oldOnly, newOnly) = unmatched
        var summary = [
            "\(mains.count) rows in both runs, by their main figure: \(mainCounts[.slower] ?? 0) slower, \(mainCounts[.faster] ?? 0) faster, \(mainCounts[.same] ?? 0) not distinguishable.",
            "Every figure (\(all.count), p99 and CPU per message included): \(counts[.slower] ?? 0) slower, \(counts[.faster] ?? 0) faster, \(counts[.same] ?? 0) not distinguishable.",
        ]
        let floors = floorLines
        if !floors.isEmpty {
            summary.append(
                "The C floor's own rows, new over old (the machine's speed, not a backend's; \(raw ? "figures compared as they are" : "the rows above are each over the C floor of its pass where both runs have it")): "
                    + floors.map { "\($0.scenario) \($0.transport) \($0.change?.text ?? "-")" }.joined(separator: ", ")
                    + ".")
        }
        if oldOnly + newOnly > 0 {
            summary.append("Not compared: \(oldOnly) row(s) only in the old run, \(newOnly) only in the new.")
        }
        summary.append(
            "A row is slower (faster) when at least 80% of the pairs of its passes, each new pass against each old one, are worse (better); new/old is their interquartile mean with the lowest and highest."
        )
        text +=
            "\n"
            + (wide ? summary : summary.flatMap { Report.wrap($0, width: Report.terminalWidth) })
            .joined(separator: "\n")
        return text
    }

    /// The lines that break a threshold: slower, by more than `percent`.
    func regressions(over percent: Double) -> [Line] {
        lines.filter { $0.verdict == .slower && $0.worse * 100 > percent }
    }

    /// Reads a report from a results.json, or from the directory `compare --out` wrote it in.
    static func load(_ path: String) throws -> Report {
        var isDirectory: ObjCBool = false
        let file =
            FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) && isDirectory.boolValue
            ? path + "/results.json" : path
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: file))
        } catch {
            throw fail("cannot read \(file): \(error.localizedDescription)")
        }
        do {
            return try JSONDecoder().decode(Report.self, from: data)
        } catch {
            throw fail("\(file) is not a compare report: \(error)")
        }
    }
}

/// `sockbench diff OLD NEW`.
struct DiffCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "diff",
        abstract: "Set two compare runs side by side: per row and figure, faster, slower or not distinguishable.",
        discussion: """
            OLD and NEW are results.json files or directories written by `sockbench compare --out DIR`. Each row both \
            runs measured is compared by its main figure (the quiet p50 for round trips, MB/s for pumps, the p99 \
            for loads), its p99 and its CPU per message, each over the C floor measured in the same pass where \
            both runs have it (the machine's speed on the day cancels; --raw compares the figures as they are); \
            each pass of the new row against each pass of the old. With --fail-slower PCT the exit status is 1 when any figure is slower by more than PCT percent.
            """)

    @Argument(help: "The earlier run: a results.json or a `compare --out` directory.")
    var old: String

    @Argument(help: "The later run: a results.json or a `compare --out` directory.")
    var new: String

    @Option(help: "Exit 1 when any figure is slower by more than this many percent (e.g. 10).")
    var failSlower: Double?

    @Flag(help: "Do not wrap the summary at 120 columns.")
    var wide = false

    @Flag(help: "Compare the figures as they are, not each over the C floor measured in the same pass.")
    var raw = false

    func run() throws {
        let diff = ReportDiff(old: try ReportDiff.load(old), new: try ReportDiff.load(new), raw: raw)
        try diff.report(wide: wide, failSlower: failSlower)
    }
}

extension ReportDiff {
    /// Prints the diff and, with a threshold, fails when a figure breaks it.
    func report(wide: Bool, failSlower: Double?) throws {
        guard !lines.isEmpty else {
            throw fail("the two runs have no row in common (same scenario, backend and transport)")
        }
        Console.line(text(wide: wide))
        guard let failSlower else { return }
        let broken = regressions(over: failSlower)
        guard broken.isEmpty else {
            for line in broken {
                Console.error(
                    "sockbench: \(line.scenario) \(line.backend) \(line.transport) \(line.figure): slower by \(Int((line.worse * 100).rounded()))% (limit \(fixed(failSlower, 0))%)"
                )
            }
            throw ExitCode.failure
        }
    }
}
