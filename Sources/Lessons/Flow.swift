import BenchmarkDriver
import Foundation
import POSIXSupport
import SocketStyles
import Synchronization

extension Lesson {
    /// A slow reader: TCP backs off, UDP overruns.
    static let flow = Lesson(
        name: "flow",
        summary: "a slow reader: the TCP sender is held back; the UDP sender overruns it and datagrams are dropped"
    ) { backend, print in
        let out = LessonOutput("flow", print)
        out.say("A receiver that reads slowly (16 KiB, then a 1 ms pause), and a sender that sends as fast as it can,")
        out.say("for about 1.5 seconds each, with the \(backend) backend.")
        out.say()

        // TCP: the sender can only go as fast as the reader, through flow control.
        let tcpPhase = out.trace.phase("TCP: 64 KiB sends, 16 KiB reads", .tcp)
        let listener = try await backend.listen(on: loopback(.tcp))
        let sender = out.trace.trace(
            try await backend.connect(to: listener.localEndpoint), side: .client, phase: tcpPhase)
        let reader = out.trace.trace(try await listener.accept(), side: .server, phase: tcpPhase)
        let chunk = [UInt8](repeating: 1, count: 64 * 1024)
        let stop = Atomic<Bool>(false)
        let sent = Atomic<Int>(0)
        let blockedNanoseconds = Atomic<Int>(0)
        let sending = Task {
            while !stop.load(ordering: .relaxed) {
                let start = MonotonicClock.nanoseconds()
                guard (try? await sender.send(chunk)) != nil else { break }
                blockedNanoseconds.add(Int(MonotonicClock.nanoseconds() - start), ordering: .relaxed)
                sent.add(chunk.count, ordering: .relaxed)
            }
            try? await sender.closeOutput()
        }
        let start = MonotonicClock.nanoseconds()
        var received = 0
        var maxInFlight = 0
        while MonotonicClock.nanoseconds() - start < 1_500_000_000 {
            guard let message = try await reader.receive(maximumLength: 16 * 1024) else { break }
            received += message.count
            maxInFlight = max(maxInFlight, sent.load(ordering: .relaxed) - received)
            try await Task.sleep(for: .milliseconds(1))
        }
        stop.store(true, ordering: .relaxed)
        let elapsed = Double(MonotonicClock.nanoseconds() - start) / 1e9
        var drained = 0
        while let message = try? await reader.receive() {  // drain so the sender's last send completes
            drained += message.count
        }
        _ = await sending.value
        await sender.close()
        await reader.close()
        await listener.close()
        let rate = Double(received) / elapsed / 1e6
        let blockedShare = Double(blockedNanoseconds.load(ordering: .relaxed)) / 1e9 / elapsed
        out.say(
            "TCP: the reader took \(fixed(rate, 1)) MB/s; the sender managed the same, spending \(Int(blockedShare * 100))% of its time"
        )
        out.say(
            "     waiting inside send(). At most \(grouped(maxInFlight / 1024)) KiB were in flight (socket buffers and the receive queue)."
        )
        let delivered = received + drained
        out.say(
            delivered == sent.load(ordering: .relaxed)
                ? "     Nothing was lost: all \(grouped(delivered / 1024)) KiB sent were read."
                : "     \(grouped(delivered)) of \(grouped(sent.load(ordering: .relaxed))) bytes were read: something was LOST."
        )
        out.figure("tcp.sentBytes", Double(sent.load(ordering: .relaxed)))
        out.figure("tcp.deliveredBytes", Double(delivered))
        out.figure("tcp.readerMBps", rate)
        out.figure("tcp.senderBlockedShare", blockedShare)
        out.figure("tcp.maxInFlightBytes", Double(maxInFlight))

        // UDP: nothing slows the sender; the receiver's buffers overflow.
        let options = ConnectionOptions.with {
            $0.receiveBufferSize = 64 * 1024
            $0.receiveQueueLimit = 64 * 1024
        }
        let total = 20_000
        let udpPhase = out.trace.phase("UDP flood: every 100th datagram", .udp)
        let udpListener = try await backend.listen(on: loopback(.udp), options: options)
        let udpSender = out.trace.trace(
            try await backend.connect(to: udpListener.localEndpoint), side: .client, phase: udpPhase,
            number: LessonTrace.leadingNumber, every: 100)
        let kernelDropsBefore = udpReceiveBufferErrors()
        // Numbered, so that the picture can tell which ones arrived.
        func datagram(_ number: Int) -> [UInt8] {
            var bytes = [UInt8](repeating: 2, count: 1000)
            bytes.withUnsafeMutableBytes { $0.storeBytes(of: UInt32(number), as: UInt32.self) }
            return bytes
        }
        try await udpSender.send(datagram(0))
        let peer = out.trace.trace(
            try await udpListener.accept(), side: .server, phase: udpPhase, number: LessonTrace.leadingNumber,
            every: 100)
        var udpReceived = 0
        let reading = Task {
            var count = 0
            var sincePause = 0
            while let message = try? await withDeadline(.milliseconds(300), { try await peer.receive() }),
                message != nil
            {
                count += 1
                sincePause += 1
                if sincePause == 16 {
                    sincePause = 0
                    try? await Task.sleep(for: .milliseconds(1))
                }
            }
            return count
        }
        for number in 1..<total { try? await udpSender.send(datagram(number)) }
        udpReceived = await reading.value
        let kernelDrops = udpReceiveBufferErrors() - kernelDropsBefore
        await udpSender.close()
        await peer.close()
        await udpListener.close()
        let lost = total - udpReceived
        out.say(
            "UDP: \(grouped(total)) datagrams of 1,000 bytes sent flat out; \(grouped(udpReceived)) received; \(grouped(lost)) lost"
        )
        if lost > 0 {
            out.say(
                "     (\(Int(Double(lost) / Double(total) * 100))%). The kernel counted \(grouped(kernelDrops)) receive-buffer overflows (Udp: RcvbufErrors);"
            )
            out.say(
                "     the rest, \(grouped(max(0, lost - kernelDrops))), were dropped by the backend's bounded receive queue, for the same reason."
            )
        }
        out.figure("udp.sent", Double(total))
        out.figure("udp.received", Double(udpReceived))
        out.figure("udp.kernelDrops", Double(kernelDrops))
        out.say()
        out.say("Why: TCP has flow control. The receiver advertises how much buffer it has left; when it is full the")
        out.say("sender's send() waits, so a fast sender is slowed to the reader's pace and nothing is lost. UDP has")
        out.say("none: the sender never learns the receiver is behind, the receive buffer fills, and the kernel")
        out.say("drops whatever arrives next. An application on UDP must pace itself, or accept the loss.")
        // What this run showed, against that explanation.
        if blockedShare >= 0.5 {
            out.say(
                "Here the TCP sender was held back: it spent \(Int(blockedShare * 100))% of the run waiting in send().",
                pointingAt: tcpPhase)
        } else {
            out.say(
                "Here the TCP sender was not held back much (\(Int(blockedShare * 100))% of the run in send()): the reader's",
                pointingAt: tcpPhase)
            out.say(
                "pauses were absorbed by buffers (kernel socket buffers and the backend's read-ahead, up to \(grouped(maxInFlight / 1024)) KiB in flight)."
            )
        }
        if lost > 0 {
            out.say(
                "Here UDP lost \(grouped(lost)) of \(grouped(total)) datagrams: the reader could not keep up and nothing told the sender.",
                pointingAt: udpPhase)
        } else {
            out.say("Here UDP lost nothing: this reader kept up with this sender on this machine (the receive buffer")
            out.say("absorbed the burst), so the overrun did not show; run it again, or with another backend.")
        }
        return out.report
    }
}

/// `Udp: RcvbufErrors` from /proc/net/snmp (this network namespace).
func udpReceiveBufferErrors() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/net/snmp", encoding: .utf8) else { return 0 }
    let lines = text.split(separator: "\n").filter { $0.hasPrefix("Udp:") }
    guard lines.count >= 2 else { return 0 }
    let names = lines[0].split(separator: " ")
    let values = lines[1].split(separator: " ")
    guard let index = names.firstIndex(of: "RcvbufErrors"), index < values.count else { return 0 }
    return Int(values[index]) ?? 0
}
