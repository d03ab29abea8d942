"""List the public definitions of ``helpers`` that nothing uses (issue 31: no dead public definition).

    python tools/dead_code.py              # prints what it finds; exit status 1 if anything is found
    python tools/dead_code.py -v           # also how many definitions were checked

A definition is a top-level function or class of a ``helpers`` module, or a method of such a class;
it is public when its name has no leading underscore. It is **used** when its name is read (a name,
an attribute, or a ``"module:function"`` string such as the practice deck's checker references) by

* a code cell, or a markdown code fence, of a notebook (``notebooks/**/*.ipynb``);
* a script in ``experiments/``, ``benchmarks/``, ``tools/`` or ``examples/``;
* the module-level code of a ``helpers`` module (a table, a ``__main__`` block), or the body of
  another ``helpers`` definition that is itself used (so a helper that only a dead function calls is
  dead too; private definitions count as callers when they are used).

Tests do not count as a use, nor do imports (an import alone reads nothing) or ``__all__`` lists, so
a re-export in an ``__init__.py`` does not keep a name alive. Exempt: dunder methods, and methods
that override a base class from outside ``helpers`` (``forward`` of an ``nn.Module``, ``backward``
of an ``autograd.Function``, ``__torch_dispatch__`` ...), whose caller is that base; they live and
die with their class. Names are matched by spelling, not by binding: a name used anywhere keeps
every definition of that spelling alive (so the tool can miss dead code, never invent it).

``ALLOWED`` below lists the few names that are API by design although nothing here calls them,
each with its reason; an entry that no longer exists, or that is used after all, is reported too.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Corpora whose uses count, relative to the root (tests/ is deliberately absent).
SCRIPT_DIRS = ("experiments", "benchmarks", "tools", "examples")

#: API by design: used by nothing in the corpora above, kept on purpose (qualified name -> why).
ALLOWED: dict[str, str] = {
    # The worked solutions of the practice checkers: the learner's reference answer for each card,
    # run by tests/test_checkers.py and tests/test_practice_*.py to prove each checker passes a right
    # answer (a checker that fails a correct solution would be a broken exercise).
    "helpers.practice.attention.causal_sdpa_solution": "worked solution of a practice card",
    "helpers.practice.heads.head_importance_solution": "worked solution of a practice card",
    "helpers.practice.kvcache.kv_decode_step_solution": "worked solution of a practice card",
    "helpers.practice.positional.sinusoidal_solution": "worked solution of a practice card",
    "helpers.practice.positional.alibi_slopes_solution": "worked solution of a practice card",
    "helpers.practice.regularization.dropout_solution": "worked solution of a practice card",
    "helpers.practice.rope.rotation_matrix_solution": "worked solution of a practice card",
}

_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:([A-Za-z_]\w*)$")  # "helpers.practice.rope:check_rope"
_IDENT = re.compile(r"[A-Za-z_]\w*")
_FENCE = re.compile(r"^```[ \t]*(?:python|py|ipython|python3)?[ \t]*\n(.*?)^```", re.M | re.S)


# ------------------------------------------------------------------------------ reading names
def _names(tree: ast.AST) -> set[str]:
    """Every name a tree reads: names, attributes, and ``"module:function"`` strings (not imports)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = _ENTRY_POINT.match(node.value)
            if m:
                out.add(m.group(1))
    return out


def _source_names(src: str) -> set[str]:
    """The names a piece of source reads; every identifier if it does not parse (a notebook's error cell)."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return set(_IDENT.findall(src))
    return _names(_strip_imports(tree))


def _strip_imports(tree: ast.Module) -> ast.Module:
    """The module without its import statements and ``__all__`` assignments (they read nothing)."""
    class Strip(ast.NodeTransformer):
        def visit_Import(self, node):
            return None

        visit_ImportFrom = visit_Import

        def visit_Assign(self, node):
            return None if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets) else node

        def visit_AugAssign(self, node):
            return None if isinstance(node.target, ast.Name) and node.target.id == "__all__" else node

    return Strip().visit(tree)


def _notebook_sources(path: Path) -> list[str]:
    """The code cells of a notebook (magics and shell lines commented out) and its markdown code fences."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for cell in nb.get("cells", []):
        src = "".join(cell.get("source", []))
        if cell.get("cell_type") == "code":
            out.append("\n".join("#" + ln if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines()))
        elif cell.get("cell_type") == "markdown":
            out.extend(m.group(1) for m in _FENCE.finditer(src))
    return out


# ------------------------------------------------------------------------------ definitions
@dataclass
class Definition:
    module: str  # dotted module name
    path: Path
    line: int
    end: int
    name: str
    cls: str | None = None  # the class of a method
    kind: str = "def"  # "def", "class" or "method"
    reads: set[str] = field(default_factory=set)  # the names its own code reads
    exempt: bool = False  # a dunder or an override of an outside base: lives with its class

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.cls}.{self.name}" if self.cls else f"{self.module}.{self.name}"


def _own_reads(node: ast.ClassDef) -> set[str]:
    """What a class statement reads outside its methods: bases, decorators, class-level statements."""
    parts = list(node.bases) + list(node.keywords) + list(node.decorator_list)
    parts += [s for s in node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    out: set[str] = set()
    for p in parts:
        out |= _names(p)
    return out


def _outside_overrides(module: str, cls_name: str, package: str) -> set[str]:
    """The attribute names the class inherits from bases outside ``package`` (torch, the standard library)."""
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError):
        return set()
    names: set[str] = set()
    for base in getattr(cls, "__mro__", ())[1:]:
        if not (base.__module__ or "").startswith(package) and base is not object:
            names |= set(vars(base))
    return names


def definitions(package_dir: Path, package: str) -> tuple[list[Definition], set[str]]:
    """Every top-level definition and method of the package, and the names its module-level code reads."""
    defs: list[Definition] = []
    module_reads: set[str] = set()
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts)
        tree = _strip_imports(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.append(Definition(module, path, node.lineno, node.end_lineno, node.name, reads=_names(node)))
            elif isinstance(node, ast.ClassDef):
                defs.append(Definition(module, path, node.lineno, node.end_lineno, node.name, kind="class",
                                       reads=_own_reads(node)))
                outside = None
                for item in node.body:
                    if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    dunder = item.name.startswith("__") and item.name.endswith("__")
                    if not dunder and outside is None:
                        outside = _outside_overrides(module, node.name, package) if node.bases else set()
                    defs.append(Definition(module, path, item.lineno, item.end_lineno, item.name, cls=node.name,
                                           kind="method", reads=_names(item),
                                           exempt=dunder or item.name in (outside or set())))
            else:
                module_reads |= _names(node)
    return defs, module_reads


def corpus_reads(root: Path) -> set[str]:
    """The names read by the notebooks and the scripts (not the tests)."""
    reads: set[str] = set()
    for nb in sorted((root / "notebooks").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in nb.parts or nb.name.startswith("."):
            continue
        for src in _notebook_sources(nb):
            reads |= _source_names(src)
    for d in SCRIPT_DIRS:
        for path in sorted((root / d).rglob("*.py")):
            if path.resolve() != Path(__file__).resolve():
                reads |= _source_names(path.read_text(encoding="utf-8"))
    return reads


def _live(defs: list[Definition], names: set[str], roots: set[str] = frozenset()) -> tuple[set[int], set[tuple]]:
    """Indices of the live definitions, and the live classes: grown from the names read by live code
    (a method lives only with its class); ``roots`` (qualified names) are live whatever reads them."""
    names = set(names)
    live: set[int] = set()
    live_classes: set[tuple[str, str]] = set()
    changed = True
    while changed:
        changed = False
        for i, d in enumerate(defs):
            if i in live:
                continue
            if d.kind == "method":
                ok = (d.module, d.cls) in live_classes and (d.exempt or d.name in names or d.qualname in roots)
            else:
                ok = d.name in names or d.qualname in roots
            if ok:
                live.add(i)
                names |= d.reads
                if d.kind == "class":
                    live_classes.add((d.module, d.name))
                changed = True
    return live, live_classes


def find_dead(root: Path, package: str = "helpers") -> tuple[list[Definition], list[Definition], list[str]]:
    """``(dead public definitions, all definitions, allow-list problems)``."""
    defs, module_reads = definitions(root / package, package)
    names = corpus_reads(root) | module_reads
    allowed = ALLOWED if package == "helpers" else {}
    problems = []
    live, _ = _live(defs, names)
    quals = {d.qualname: i for i, d in enumerate(defs)}
    for q in allowed:
        if q not in quals:
            problems.append(f"ALLOWED lists {q}, which does not exist")
        elif quals[q] in live:
            problems.append(f"ALLOWED lists {q}, which is used: remove it from the list")
    live, live_classes = _live(defs, names, roots=set(allowed))  # what an allowed definition calls is used
    dead = []
    for i, d in enumerate(defs):
        if i in live or d.name.startswith("_") or d.exempt:
            continue
        if d.kind == "method" and ((d.module, d.cls) not in live_classes or d.cls.startswith("_")):
            continue  # its class is reported instead (or is private)
        dead.append(d)
    return dead, defs, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    ap.add_argument("--package", default="helpers", help="the package to check (default: helpers)")
    ap.add_argument("-v", "--verbose", action="store_true", help="also print how many definitions were checked")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    dead, defs, problems = find_dead(root, args.package)
    for d in dead:
        rel = d.path.relative_to(root)
        print(f"{rel}:{d.line}: {d.kind} {d.cls + '.' if d.cls else ''}{d.name} ({d.end - d.line + 1} lines) "
              f"is used by no notebook, module or script")
    for p in problems:
        print(p)
    if args.verbose or not (dead or problems):
        public = sum(not d.name.startswith("_") and not d.exempt for d in defs)
        print(f"{public} public definitions checked ({len(ALLOWED) if args.package == 'helpers' else 0} allowed "
              f"by design); {len(dead)} unused")
    return 1 if dead or problems else 0


if __name__ == "__main__":
    sys.exit(main())
