import ConnectionCore
import NIOCore
import NIOPosix
import POSIXSupport
import Synchronization

/// Reads of a TCP channel into a bounded queue; reading stops (autoRead off) while the queue is full.
/// Made in a channel initializer and handed to its connection, which touches `context` only on the channel's
/// event loop, as the pipeline does.
final class StreamInboxHandler: ChannelInboundHandler, RemovableChannelHandler, Sendable {
    typealias InboundIn = ByteBuffer
    /// Its name in the pipeline (a WebSocket replaces it with frame handlers after the handshake).
    static let name = "socketstyles.inbox"
    let inbox: ReceiveQueue<[UInt8]>
    let executor: EventLoopTaskExecutor

    /// Its context while it is in the pipeline (loop thread only): a send on the loop writes there, to the head of
    /// the pipeline, instead of through the channel (which checks the thread and starts from the tail).
    let context: NIOLoopBoundBox<ChannelHandlerContext?>

    init(inbox: ReceiveQueue<[UInt8]>, executor: EventLoopTaskExecutor) {
        self.inbox = inbox
        self.executor = executor
        context = .makeEmptyBox(eventLoop: executor.loop)
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context.value = context }

    func handlerRemoved(context: ChannelHandlerContext) { self.context.value = nil }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = Self.unwrapInboundIn(data)
        let bytes = buffer.readBytes(length: buffer.readableBytes) ?? []
        // Reading stops before the waiting task runs: room it then makes turns reading back on.
        executor.delivering {
            if !inbox.push(bytes).hasSpace { try? context.channel.syncOptions?.setOption(.autoRead, value: false) }
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed { inbox.finish(.finished) }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        inbox.finish(.failed(connectionError(error, "read")))
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        inbox.finish(.finished)
        context.fireChannelInactive()
    }
}

/// On a server channel: an accept that fails (out of descriptors) turns reading off for a pause, then on again.
/// SwiftNIO would otherwise retry the accept on every turn of its loop while clients wait in the backlog, one
/// core at 100% (its own AcceptBackoffHandler did not stop that here).
final class AcceptPause: ChannelInboundHandler {
    typealias InboundIn = any Channel
    let pause: TimeAmount
    private var paused = false

    init(pause: TimeAmount) { self.pause = pause }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.fireChannelRead(data)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !paused, let options = context.channel.syncOptions {
            paused = true
            BoundsLog.note(.descriptorLimit, "accepting paused for \(pause.nanoseconds / 1_000_000) ms: \(error)")
            try? options.setOption(.autoRead, value: false)
            let channel = context.channel
            context.eventLoop.assumeIsolated().scheduleTask(in: pause) { [self] in
                paused = false
                try? channel.syncOptions?.setOption(.autoRead, value: true)
            }
        }
        context.fireErrorCaught(error)
    }
}
/// Datagrams of a UDP channel into a bounded queue (a datagram that finds it full is dropped), or, for a
/// listener, into a demultiplexer by sender.
final class DatagramInboxHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    let deliver: (AddressedEnvelope<ByteBuffer>) -> Void
    let fail: (ConnectionError) -> Void
    let executor: EventLoopTaskExecutor

    init(
        executor: EventLoopTaskExecutor, deliver: @escaping (AddressedEnvelope<ByteBuffer>) -> Void,
        fail: @escaping (ConnectionError) -> Void
    ) {
        self.executor = executor
        self.deliver = deliver
        self.fail = fail
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        executor.delivering { deliver(Self.unwrapInboundIn(data)) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ECONNREFUSED (an ICMP port unreachable) leaves the channel open, as it leaves the socket usable.
        fail(connectionError(error, "receive"))
    }
}
