import BenchmarkDriver
import SocketStyles

/// A performance target the docs state (docs/benchmarks.md), as data: what is compared with what, and the limit.
struct PerformanceTarget {
    /// How the target reads in the report.
    var text: String
    /// `true`: the ratio must be at least the limit; `false`: at most.
    var atLeast: Bool
    /// The limit for a backend.
    var limit: (String) -> Double
    /// Which backends it applies to.
    var appliesTo: (String) -> Bool = { _ in true }
    /// The backend's ratio in this report, `nil` when the run did not measure it.
    var ratio: (Report, String) -> Ratio?
}

extension Report {
    /// Every backend but the reference (nio): SwiftNIO's own path is what ours are set against, not ours to tune.
    /// The reference's name (SwiftNIO's), for the targets' text.
    private static var referenceName: String { Backend.reference?.name ?? "the reference" }

    private static func ours(_ backend: String) -> Bool { Backend(rawValue: backend)?.isReference != true }

    /// The targets the docs state, in the order the report lists them.
    func performanceTargets() -> [PerformanceTarget] {
        var targets: [PerformanceTarget] = []
        let floorPing = row(Self.floorName, "tcp", .pingpong(size: 64))
        targets.append(
            PerformanceTarget(
                text: "64 B tcp round trip in native style <= 1.3x the C floor (\(Backend.bsd.name) <= 1.1x)",
                atLeast: false,
                limit: { $0 == Backend.bsd.name ? 1.1 : 1.3 },
                ratio: { report, backend in
                    let native = report.row(backend, "tcp", .native(size: 64))
                    return report.p50Ratio(native, over: native.flatMap(report.floorRow(for:)))
                }
            ))
        targets.append(
            PerformanceTarget(
                text: "the same through Connection <= 1.5x the floor (\(Self.referenceName) <= 1.6x)", atLeast: false,
                limit: { Self.ours($0) ? 1.5 : 1.6 },
                ratio: { report, backend in
                    report.p50Ratio(report.row(backend, "tcp", .pingpong(size: 64)), over: floorPing)
                }))
        for transport in plan.transports {
            targets.append(
                PerformanceTarget(
                    text: "\(transport) round trip through Connection at or below SwiftNIO's", atLeast: false,
                    limit: { _ in 1.0 }, appliesTo: Self.ours,
                    ratio: { report, backend in
                        report.p50Ratio(
                            report.row(backend, transport, .pingpong(size: 64)),
                            over: Backend.reference.flatMap { report.row($0.name, transport, .pingpong(size: 64)) })
                    }))
        }
        // The open-loop rows against the C floor's paced client at the same rate and transport (the trust issue's
        // second "done when"): p50 from the actual send time in each row's quiet stretches, as the rate tables'
        // "x C floor" column (the machine's speed moved a whole repetition's plain p50 by up to 1.9x).
        for perSecond in plan.scenarios.compactMap({ $0.as(RateScenario.self)?.perSecond }) {
            for transport in plan.transports {
                targets.append(
                    PerformanceTarget(
                        text:
                            "rate-\(perSecond) \(transport) p50 from the actual send time <= 1.3x the C floor's open-loop p50 at the same rate, both in their quiet stretches (every backend but \(Self.referenceName))",
                        atLeast: false, limit: { _ in 1.3 }, appliesTo: Self.ours,
                        ratio: { report, backend in
                            report.openLoopRatio(
                                report.row(backend, transport, .rate(perSecond: perSecond)),
                                over: report.row(Self.floorName, transport, .rate(perSecond: perSecond)))
                        }))
            }
        }
        let bulkReference =
            row("iperf3", "tcp", .pump(size: 65536)).map { ("iperf3", $0) }
            ?? row(Self.floorName, "tcp", .pump(size: 65536)).map { (Self.floorName, $0) }
        if let (name, reference) = bulkReference {
            targets.append(
                PerformanceTarget(
                    text:
                        "tcp pump in 64 KiB writes >= 0.9x \(name)'s single stream (every backend but \(Self.referenceName))",
                    atLeast: true, limit: { _ in 0.9 }, appliesTo: Self.ours,
                    ratio: { report, backend in
                        report.ratio(report.row(backend, "tcp", .pump(size: 65536)), over: reference, \.bytesPerSecond)
                    }))
        }
        targets.append(
            PerformanceTarget(
                text: "tcp pump in 1,400-byte writes >= 0.7x the C floor's (every backend but \(Self.referenceName))",
                atLeast: true,
                limit: { _ in 0.7 }, appliesTo: Self.ours,
                ratio: { report, backend in report.pumpFloorRatio(for: report.row(backend, "tcp", .pump(size: 1400))) }
            ))
        targets.append(
            PerformanceTarget(
                text:
                    "udp 1,400-byte datagrams received per second at the sink >= 0.9x the C floor's (goodput; every backend but \(Self.referenceName); loss in the pump-1400 table)",
                atLeast: true, limit: { _ in 0.9 }, appliesTo: Self.ours,
                ratio: { report, backend in report.pumpFloorRatio(for: report.row(backend, "udp", .pump(size: 1400))) }
            ))
        targets.append(
            PerformanceTarget(
                text:
                    "ws pump in 64 KiB messages >= 0.8x the same backend's tcp pump (every backend but \(Self.referenceName))",
                atLeast: true, limit: { _ in 0.8 }, appliesTo: Self.ours,
                ratio: { report, backend in
                    report.ratio(
                        report.row(backend, "ws", .pump(size: 65536)),
                        over: report.row(backend, "tcp", .pump(size: 65536)),
                        \.bytesPerSecond)
                }))
        targets.append(
            PerformanceTarget(
                text: "WebSocket echo <= 1.25x the same backend's tcp round trip (64 B here)", atLeast: false,
                limit: { _ in 1.25 },
                ratio: { report, backend in
                    report.p50Ratio(
                        report.row(backend, "ws", .pingpong(size: 64)),
                        over: report.row(backend, "tcp", .pingpong(size: 64)))
                }))
        return targets
    }

    /// What the targets are, above them in report.md and report.html.
    static let targetsPreamble =
        "Goals SocketStyles set for its own backends, checked against this run's ratios: they say how the library is doing, not which backend suits you. `--check-targets` prints them and exits 1 when one is missed."

    /// The targets checked against this run's ratios: each says met or missed (by the median over the
    /// repetitions), with every backend's ratio and range; a range that crosses the limit is said to.
    func targets() -> [String] {
        performanceTargets().compactMap { target in
            let ratios = plan.backends.filter(target.appliesTo).compactMap { backend in
                ratio(for: target, backend).map { (backend, $0) }
            }
            guard !ratios.isEmpty else { return nil }
            let missed = ratios.filter { backend, ratio in
                target.atLeast ? ratio.center < target.limit(backend) : ratio.center > target.limit(backend)
            }.map(\.0)
            let unsure = ratios.filter { backend, ratio in ratio.straddles(target.limit(backend)) }.map(\.0)
            let figures = ratios.map { "\($0.0) \($0.1.text)" }.joined(separator: ", ")
            return "- Target, \(target.text): "
                + (missed.isEmpty ? "met" : "MISSED by \(missed.joined(separator: ", "))")
                + " (\(figures))"
                + (unsure.isEmpty
                    ? "." : "; the repetitions of \(unsure.joined(separator: ", ")) fall on both sides of the limit.")
        }
    }

    private func ratio(for target: PerformanceTarget, _ backend: String) -> Ratio? {
        target.ratio(self, backend)
    }
}
