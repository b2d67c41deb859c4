import ArgumentParser
import SocketStyles

/// `--socket-buffer BYTES` of `serve`, `floor-serve` and `pump`: SO_RCVBUF and SO_SNDBUF, as iperf3's `-w`.
struct SocketBufferOption: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "SO_RCVBUF and SO_SNDBUF of the sockets, in bytes, as iperf3's -w (default: the system's; Linux grants twice the size asked, up to twice net.core.rmem_max / wmem_max).",
            valueName: "bytes"))
    var socketBuffer: Int?

    func validate() throws {
        if let socketBuffer, socketBuffer < 1 { throw ValidationError("--socket-buffer must be at least 1") }
    }

    /// Sets both buffer sizes in `options` when asked.
    func apply(to options: inout ConnectionOptions) {
        options.receiveBufferSize = socketBuffer
        options.sendBufferSize = socketBuffer
    }
}
