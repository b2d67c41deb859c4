import Foundation
import Testing

/// Every ```swift block in README.md and docs/*.md must be one of the compiled snippets in Snippets.swift, so a
/// sample in the docs cannot rot: changing the API breaks the build, changing the docs alone breaks this test.
@Suite("Documentation samples compile")
struct DocSnippetTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// Lines without indentation, blank lines or imports.
    static func normalized(_ text: Substring) -> [Substring] {
        text.split(separator: "\n").map { $0.drop(while: { $0 == " " }) }.map { line in
            var line = line
            while line.last == " " { line = line.dropLast() }
            return line
        }.filter { !$0.isEmpty && !$0.hasPrefix("import ") }
    }

    static func blocks(in text: String) -> [Substring] {
        var blocks: [Substring] = []
        var rest = text[...]
        while let start = rest.range(of: "```swift\n") {
            guard let end = rest[start.upperBound...].range(of: "```") else { break }
            blocks.append(rest[start.upperBound..<end.lowerBound])
            rest = rest[end.upperBound...]
        }
        return blocks
    }

    @Test("Every Swift sample in README.md and docs/ is compiled in Snippets.swift")
    func samplesAreCompiled() throws {
        let snippetFile = try String(
            contentsOf: Self.root.appendingPathComponent("Tests/DocSnippetTests/Snippets.swift"), encoding: .utf8)
        var compiled: [[Substring]] = []
        var rest = snippetFile[...]
        while let start = rest.range(of: "// snippet: ") {
            guard let end = rest[start.upperBound...].range(of: "// end snippet") else { break }
            // The body: after the `static func ...{` line, up to the closing brace before the end marker.
            var lines = Self.normalized(rest[start.upperBound..<end.lowerBound]).dropFirst(2)
            if lines.last == "}" { lines = lines.dropLast() }
            compiled.append(Array(lines))
            rest = rest[end.upperBound...]
        }
        let docs =
            try FileManager.default.contentsOfDirectory(atPath: Self.root.appendingPathComponent("docs").path)
            .filter { $0.hasSuffix(".md") }.map { "docs/\($0)" } + ["README.md"]
        var checked = 0
        for file in docs {
            let text = try String(contentsOf: Self.root.appendingPathComponent(file), encoding: .utf8)
            for block in Self.blocks(in: text) where !block.hasPrefix("// Package.swift") {
                checked += 1
                let lines = Self.normalized(block)
                let found = compiled.contains(lines)
                #expect(
                    found,
                    "\(file): this sample is not in Tests/DocSnippetTests/Snippets.swift (or differs):\n\(block)")
            }
        }
        #expect(checked >= 9)
    }
}
