import ConnectionTestKit
import Foundation
import Lessons
import SocketStyles
import Testing

/// The lessons' recorder and picture on in-memory connections (no sockets): which receive each send's arrow ends
/// at, lost datagrams, what another process saw replayed, and one drawn element per recorded event.
@Suite("Lesson trace", .timeLimit(.minutes(20)))  // the kernel-view test waits its turn (SocketTest)
struct LessonTraceTests {
    static func numbered(_ number: Int, size: Int = 8) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: size)
        bytes.withUnsafeMutableBytes { $0.storeBytes(of: UInt32(number), as: UInt32.self) }
        return bytes
    }

    @Test("a byte stream: sends joined on the wire end at the receive that delivered their last byte")
    func joinedSends() async throws {
        let trace = LessonTrace()
        let phase = trace.phase("tcp", .tcp)
        let pair = MemoryConnection.pair(transport: .tcp)
        let client = trace.trace(pair.first, side: .client, phase: phase)
        let server = trace.trace(pair.second, side: .server, phase: phase)
        pair.wire.hold(toward: .toSecond)
        for index in 0..<5 { try await client.send([UInt8](repeating: UInt8(index), count: 10)) }
        pair.wire.release(toward: .toSecond)
        var received = 0
        while received < 50, let message = try await server.receive(maximumLength: 1000) { received += message.count }
        try await server.send([1, 2, 3])
        _ = try await client.receive(exactly: 3)
        await client.close()
        await server.close()

        let events = trace.events
        let sends = events.filter { $0.kind == .send && $0.side == .client }
        let receives = events.filter { $0.kind == .receive && $0.side == .server }
        #expect(sends.count == 5)
        #expect(sends.map(\.number) == [0, 1, 2, 3, 4])
        #expect(receives.map(\.bytes).reduce(0, +) == 50)
        // Every arrow ends at a receive, in order; the last send ends at the last receive, which completed it.
        let arrivals = sends.compactMap(\.arrived)
        #expect(arrivals.count == 5)
        #expect(arrivals == arrivals.sorted())
        #expect(Set(arrivals).isSubset(of: Set(receives.map(\.at))))
        #expect(arrivals.last == receives.last?.at)
        #expect(receives.last?.number == 4)
        // The reply: one arrow the other way.
        let reply = events.filter { $0.kind == .send && $0.side == .server }
        #expect(reply.count == 1 && reply[0].arrived != nil)
    }

    @Test("datagrams: a lost one has no arrival; the others end at their own receive, by number")
    func lostDatagram() async throws {
        let trace = LessonTrace()
        let phase = trace.phase("udp", .udp)
        let pair = MemoryConnection.pair(transport: .udp)
        let number = LessonTrace.leadingNumber
        let client = trace.trace(pair.first, side: .client, phase: phase, number: number)
        let server = trace.trace(pair.second, side: .server, phase: phase, number: number)
        try await client.send(Self.numbered(0))
        try await client.send(Self.numbered(1))
        pair.wire.hold(toward: .toSecond)
        try await client.send(Self.numbered(2))
        #expect(pair.wire.dropHeld(toward: .toSecond) == 1)
        pair.wire.release(toward: .toSecond)
        try await client.send(Self.numbered(3))
        var numbers: [Int] = []
        for _ in 0..<3 {
            let message = try #require(try await server.receive())
            numbers.append(LessonTrace.leadingNumber(message.bytes) ?? -1)
        }
        #expect(numbers == [0, 1, 3])
        await client.close()
        await server.close()

        let sends = trace.events.filter { $0.kind == .send }
        #expect(sends.map(\.number) == [0, 1, 2, 3])
        #expect(sends.map { $0.arrived == nil } == [false, false, true, false])
        let receives = trace.events.filter { $0.kind == .receive }
        #expect(receives.map(\.number) == [0, 1, 3])
        #expect(sends[3].arrived == receives[2].at)
    }

    @Test("what two other processes observed, replayed, draws the arrows a live trace draws")
    func replayMatchesLive() async throws {
        let live = LessonTrace()
        let livePhase = live.phase("tcp", .tcp)
        let clientRecorder = LessonTrace.recorder()
        let serverRecorder = LessonTrace.recorder()
        let pair = MemoryConnection.pair(transport: .tcp)
        // Each end recorded twice: live, and raw (as a probe and `serve --trace` do in their own processes).
        let client = clientRecorder.trace(
            live.trace(pair.first, side: .client, phase: livePhase), side: .client, phase: 0)
        let server = serverRecorder.trace(
            live.trace(pair.second, side: .server, phase: livePhase), side: .server, phase: 0)
        pair.wire.hold(toward: .toSecond)
        for index in 0..<4 { try await client.send([UInt8](repeating: UInt8(index), count: 4)) }
        pair.wire.release(toward: .toSecond)
        var received = 0
        while received < 16, let message = try await server.receive(maximumLength: 6) { received += message.count }
        await client.close()
        await server.close()
        #expect(clientRecorder.observations.count == 4)
        #expect(serverRecorder.observations.count >= 3, "16 bytes read at most 6 at a time")

        let replayed = LessonTrace()
        let phase = replayed.phase("tcp", .tcp)
        replayed.replay(clientRecorder.observations + serverRecorder.observations, into: phase, byteStream: true)
        let shape: ([LessonEvent]) -> [String] = { events in
            events.filter { $0.kind != .mark }.map { "\($0.side) \($0.kind) \($0.bytes) \($0.number ?? -1)" }
        }
        #expect(shape(replayed.events) == shape(live.events))
        // Which receive each send's arrow ends at: the same index among the receives in both.
        func endings(_ events: [LessonEvent]) -> [Int?] {
            let receives = events.filter { $0.kind == .receive }.map(\.at)
            return events.filter { $0.kind == .send }.map { send in send.arrived.flatMap { receives.firstIndex(of: $0) }
            }
        }
        #expect(endings(replayed.events) == endings(live.events))
        #expect(endings(live.events).allSatisfy { $0 != nil })
    }

    @Test(
        "the kernel's view of a real TCP connection is read by its addresses, on every backend",
        arguments: Backend.allCases)
    func kernelView(_ backend: Backend) async throws {
        try await SocketTest.run {
            let trace = LessonTrace()
            let phase = trace.phase("tcp", .tcp)
            let listener = try await backend.listen(on: Endpoint(url: "tcp://127.0.0.1:0"))
            let client = trace.trace(
                try await backend.connect(to: listener.localEndpoint), side: .client, phase: phase, kernel: .afterSends)
            let server = try await listener.accept()
            for _ in 0..<3 {
                try await client.send([1, 2, 3, 4])
                _ = try await server.receive(exactly: 4)
            }
            await client.close()
            await server.close()
            await listener.close()
            let views = trace.events.filter { $0.kind == .kernel }
            #expect(views.count == 3, "a view after each of 3 sends: \(views.map(\.text))")
            #expect(views.allSatisfy { $0.text?.contains(" unacked") == true && $0.text?.contains("rtt ") == true })
        }
    }

    @Test("a recorder for another process keeps at most its limit and counts the rest")
    func recorderLimit() async throws {
        let recorder = LessonTrace.recorder(limit: 3)
        let pair = MemoryConnection.pair(transport: .udp)
        let client = recorder.trace(pair.first, side: .client, phase: 0, number: LessonTrace.leadingNumber)
        for index in 0..<5 { try await client.send(Self.numbered(index)) }
        #expect(recorder.observations.map(\.number) == [0, 1, 2])
        #expect(recorder.notRecorded == 2)
        await client.close()
        await pair.second.close()
    }

    @Test("past the cap, sends and receives are counted, not drawn; the page draws one element per event")
    func capAndPage() async throws {
        let trace = LessonTrace(cap: 10)
        let phase = trace.phase("udp flood", .udp)
        let pair = MemoryConnection.pair(transport: .udp)
        let number = LessonTrace.leadingNumber
        let client = trace.trace(pair.first, side: .client, phase: phase, number: number)
        let server = trace.trace(pair.second, side: .server, phase: phase, number: number)
        for index in 0..<25 { try await client.send(Self.numbered(index)) }
        for _ in 0..<25 { _ = try await server.receive() }
        trace.mark(phase, .between, "a <mark> & \"quotes\"")
        await client.close()
        await server.close()
        let events = trace.events
        #expect(events.filter { $0.kind == .send }.count == 10)
        #expect(events.filter { $0.kind == .receive }.count == 10)
        #expect(trace.phases[phase].notDrawn == 30)

        var report = LessonReport(lesson: "test")
        report.events = events
        report.phases = trace.phases
        report.lines = ["Here it shows.", "", "Why: <b>not markup</b>."]
        report.pointers = [0: phase]
        let html = LessonPage.html(report, summary: "a test", backend: "memory")
        #expect(html.components(separatedBy: "<path class=\"arrow").count - 1 == 10)
        #expect(html.components(separatedBy: "<line class=\"receive\"").count - 1 == 10)
        #expect(html.components(separatedBy: "<circle class=\"mark\"").count - 1 == 1)
        #expect(html.contains("a &lt;mark&gt; &amp; &quot;quotes&quot;"))
        #expect(html.contains("Why: &lt;b&gt;not markup&lt;/b&gt;."))
        #expect(html.contains("<a href=\"#phase-0\">Here it shows.</a>"))
        #expect(html.contains("30 more sends and receives not drawn"))
        for external in ["<script", "<link", "<img", "<iframe", "src=", "url(", "http://", "https://"] {
            #expect(!html.contains(external), "the page refers to \(external)")
        }
    }
}
