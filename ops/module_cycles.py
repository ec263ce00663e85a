#!/usr/bin/env python3
"""Module cycles in each crate of the workspace.

Reads every crate's src/ and draws an edge from module A to module B when
A's code names B (`crate::b::...`, `super::b`, `use super::*` naming the
parent, `b::...` naming a child): a module that uses another depends on it,
a parent's use of its child included. Declarations (`mod b;`),
re-exports (`pub use b::...`, a crate's facade) and test code (`#[cfg(test)]`
and what follows it, `tests` modules) draw none. Prints every cycle (each
strongly connected set of modules) and exits 1 if there is any that the
allowance file does not cover: each of its lines is `crate: module, module,
...`, a cycle left to undo, which may shrink but not grow.

    python3 ops/module_cycles.py [--root DIR] [--allow FILE]
"""

import argparse
import re
import sys
from pathlib import Path

USE_CRATE = re.compile(r"\bcrate((?:::\w+)+)")
USE_SUPER = re.compile(r"\b((?:super::)+)(\*|\w+)")
BRACED = re.compile(r"\b(crate|super)::\{([^}]*)\}")


def crates(root):
    """(crate name, its src dir) for the workspace's crates."""
    for manifest in sorted(root.glob("**/Cargo.toml")):
        parts = manifest.relative_to(root).parts
        if "target" in parts or ".git" in parts or parts[:2] == ("ops", "bench"):
            continue
        src = manifest.parent / "src"
        if src.is_dir():
            yield manifest.parent.relative_to(root).as_posix() or ".", src


def module_of(src, path):
    """`a::b` for src/a/b.rs or src/a/b/mod.rs; `crate` for lib.rs/main.rs; bin targets apart."""
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts and parts[0] == "bin":
        return None
    if parts[-1] == "mod":
        parts.pop()
    if parts in (["lib"], ["main"]):
        return "crate"
    return "::".join(parts)


# `#[cfg(test)]`, and `#[cfg(all(test, ...))]`: code built for tests only.
TEST_ONLY = re.compile(r"#\[cfg\((test|all\(test\b.*)\)\]")


def code_lines(text):
    """The file's lines that are not comments, test code (the item after a
    `#[cfg(test)]` or `#[cfg(all(test, ...))]`), declarations or re-exports."""
    out = []
    skipping, depth, started = False, 0, False
    for line in text.splitlines():
        code = line.split("//")[0]
        stripped = code.strip()
        if skipping:
            if stripped.startswith("#["):
                continue
            depth += code.count("{") - code.count("}")
            started = started or "{" in code
            if (started and depth <= 0) or (not started and stripped.endswith(";")):
                skipping, depth, started = False, 0, False
            continue
        if TEST_ONLY.match(stripped):
            skipping = True
            continue
        if re.match(r"(pub(\(\w+\))?\s+)?mod\s+\w+\s*;", stripped):
            continue
        if re.match(r"pub(\(\w+\))?\s+use\s", stripped):
            continue
        out.append(code)
    return out


REEXPORT = re.compile(r"^\s*pub(?:\([\w:]+\))?\s+use\s+(?:crate::|self::)?([\w:]+?)(?:::\{([^}]*)\}|::(\w+))\s*;", re.S | re.M)


def reexports(module, text, modules):
    """Names a module re-exports (`pub use a::b::{X, Y}`), each mapped to
    the module that defines it: `crate::X` names that module, not the facade."""
    here = [] if module == "crate" else module.split("::")
    out = {}
    for match in REEXPORT.finditer(text.replace("\n", " ").replace(";", ";\n")):
        base, names, single = match.group(1), match.group(2), match.group(3)
        names = [single] if single else [n.strip().split(" as ")[-1].strip() for n in names.split(",")]
        target = base if base.split("::")[0] in {m.split("::")[0] for m in modules} else "::".join(here + [base])
        target = resolve(modules, target)
        for name in names:
            if name and target and name != "self":
                out[name] = target
    return out


def resolve(modules, candidate, exported=None):
    """The longest module that `candidate` (a::b::Item) names, if any."""
    if exported and candidate.split("::")[0] in exported:
        return exported[candidate.split("::")[0]]
    parts = candidate.split("::")
    while parts:
        name = "::".join(parts)
        if name in modules:
            return name
        parts.pop()
    return None


def edges_of(modules, module, text, exported):
    found = set()
    here = [] if module == "crate" else module.split("::")
    for line in code_lines(text):
        targets = []
        for match in USE_CRATE.finditer(line):
            targets.append(match.group(1).strip(":"))
        for match in BRACED.finditer(line):
            base = here if match.group(1) == "super" else None
            for item in match.group(2).split(","):
                item = item.strip().split(" as ")[0].strip()
                if not item or item == "self":
                    continue
                if base is None:
                    targets.append(item)
                else:
                    targets.append("::".join(base[:-1] + [item]))
        for match in USE_SUPER.finditer(line):
            ups = match.group(1).count("super::")
            base = here[: max(0, len(here) - ups)]
            name = match.group(2)
            targets.append("::".join(base + ([] if name == "*" else [name])) or "crate")
        # A child named from its parent: `child::Item` (or `use child::...`).
        for match in re.finditer(r"(?<![:\w])(\w+)::", line):
            name = match.group(1)
            if name in ("crate", "super", "self", "std", "core", "alloc"):
                continue
            child = "::".join(here + [name]) if here else name
            if child in modules:
                targets.append(child)
        for target in targets:
            target = target or "crate"
            resolved = resolve(modules, target, exported)
            if resolved is None:
                resolved = "crate"
            if resolved != module:
                found.add(resolved)
    return found


def strongly_connected(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=Path(__file__).resolve().parent.parent, type=Path)
    parser.add_argument("--allow", type=Path, help="cycles left to undo (crate: module, module, ...)")
    args = parser.parse_args()
    allowed = []
    if args.allow:
        for line in args.allow.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                crate, modules = line.split(":", 1)
                allowed.append((crate.strip(), {m.strip() for m in modules.split(",") if m.strip()}))
    cycles = 0
    tolerated = 0
    for name, src in crates(args.root):
        files = {}
        for path in sorted(src.rglob("*.rs")):
            module = module_of(src, path)
            if module is None or module.split("::")[-1] in ("tests",) or module.endswith("_tests"):
                continue
            files[module] = path
        modules = set(files) | {"crate"}
        root_text = files["crate"].read_text(errors="replace") if "crate" in files else ""
        exported = reexports("crate", root_text, modules)
        graph = {m: edges_of(modules, m, files[m].read_text(errors="replace"), exported) for m in files}
        for group in strongly_connected(graph):
            if any(crate == name and set(group) <= known for crate, known in allowed):
                tolerated += 1
                print(f"{name}: a cycle left to undo (allowed): {', '.join(group)}")
                continue
            cycles += 1
            print(f"{name}: a cycle among {', '.join(group)}")
            for module in group:
                into = sorted(graph[module] & set(group))
                print(f"    {module} -> {', '.join(into)}")
    if cycles:
        print(f"{cycles} cycle(s): a module that uses another must not be used by it (README, Architecture)")
        return 1
    print(f"no new module cycles ({tolerated} left to undo)" if tolerated else "no module cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
