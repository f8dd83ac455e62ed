"""The page's ES modules import one way (issue 48): a circle of imports, even through a lazy
`import()`, means a module can run before the one it needs has finished, and one job is spread
over two files. who.js -> people.js -> settings.js -> who.js was one; this keeps it the last."""

from __future__ import annotations

import re
from pathlib import Path

WEB = Path(__file__).resolve().parents[2] / "web"

# `import {a} from './x.js'`, `import './x.js'` and `import('./x.js')`: the relative
# specifiers the page uses (the vendored libraries are classic scripts, not imports).
IMPORT = re.compile(r"""(?:^\s*import\s+(?:[^'";]*?\s+from\s+)?|\bimport\s*\(\s*)['"](\.{1,2}/[^'"]+)['"]""", re.M)


def imports(file: Path) -> set[Path]:
    return {(file.parent / spec).resolve() for spec in IMPORT.findall(file.read_text(encoding="utf-8"))}


def graph(root: Path = WEB) -> dict[Path, set[Path]]:
    return {f.resolve(): imports(f) for f in root.rglob("*.js") if "vendor" not in f.parts}


def cycle(edges: dict[Path, set[Path]]) -> list[Path]:
    """One circle of imports (its modules in order, the first again at the end), or []."""
    state: dict[Path, int] = {}  # 1: on the current path, 2: done
    path: list[Path] = []

    def visit(node: Path) -> list[Path]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_parser_finds_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "a.js").write_text("import { b } from './b.js';\nimport './c.js';\n"
                                   "export const d = () => import('./d.js');\nconst s = 'import x';\n")
    assert imports(tmp_path / "a.js") == {(tmp_path / n).resolve() for n in ("b.js", "c.js", "d.js")}


def test_a_circle_is_found_also_through_a_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "who.js").write_text("export const load = () => import('./people.js');\n")
    (tmp_path / "people.js").write_text("import { askKey } from './settings.js';\n")
    (tmp_path / "settings.js").write_text("import { load } from './who.js';\n")
    (tmp_path / "page.js").write_text("export const els = {};\n")
    found = cycle(graph(tmp_path))
    assert [p.name for p in found] == ["people.js", "settings.js", "who.js", "people.js"]
    (tmp_path / "settings.js").write_text("import { els } from './page.js';\n")
    assert cycle(graph(tmp_path)) == []


def test_every_import_names_a_file_that_is_there() -> None:
    edges = graph()
    assert len(edges) > 20  # the page's modules were found
    missing = sorted(f"{src.relative_to(WEB)} -> {dst.name}" for src, dsts in edges.items() for dst in dsts if not dst.is_file())
    assert missing == []


def test_the_page_imports_without_a_circle() -> None:
    found = cycle(graph())
    assert found == [], "a circle of imports: " + " -> ".join(str(p.relative_to(WEB)) for p in found)
