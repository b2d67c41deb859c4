import Foundation
import Testing

/// Every ```swift block in README.md, docs/ and the DocC catalogs must be one of the compiled snippets in Snippets.swift, so a
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
        // README.md, every page under docs/, and the DocC catalogs' articles.
        var docs = ["README.md"]
        for top in ["docs", "Sources"] {
            let tree = FileManager.default.enumerator(atPath: Self.root.appendingPathComponent(top).path)
            while let path = tree?.nextObject() as? String {
                guard path.hasSuffix(".md"), top == "docs" || path.contains(".docc/") else { continue }
                docs.append("\(top)/\(path)")
            }
        }
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
        #expect(checked >= 15)
    }
}
