"""Mutants mutmut does not make (issue 39, item 5), planted one at a time and run against the tests that own them.

mutmut's operators change literals and operators (``n`` -> ``n + 1``, ``<`` -> ``<=``, a string to ``"XX..XX"``); two
kinds of careless change it never makes, and which a reviewer planted by hand:

- ``default``: an option's default replaced by another plausible value of the same kind: a dataclass field's
  ``default=`` (tasks, criteria, models), or a value an architecture function sets (``getattr(args, name, value)``
  and the keyword arguments of the calls inside it). A bool is negated, a number halved or doubled (0 becomes 1 or
  0.1); strings (choices) are left to mutmut.
- ``bound``: a comparison's bound moved by one the other way from mutmut's (``a < b`` -> ``a < b - 1``, ``a <= b`` ->
  ``a <= b + 1``, and the mirror images), and the stop of a ``range(...)`` or of a slice moved down by one, where
  the bound is not a literal (mutmut already moves literals).

Each mutant is written into a copy of the repository (the checkout is never touched) and runs the fast tests of the
mutmut selection (setup.cfg, plus the FlexAttention and Triton copy tests) that import the mutated module or a module
importing it, transitively, plus tests/test_paper_defaults.py for the defaults, with ``-x``; it is detected when they
fail or time out. ``python -m palm_tools.mutation_hand --per-package 10 --seed 1`` draws a seeded sample per package
and operator and prints the score per package (docs/mutation.md); ``--rerun`` runs an earlier run's undetected again.
"""
import argparse
import ast
import configparser
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from palm_tools.mutation import wilson

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("palm_plugin/criterions", "palm_plugin/data", "palm_plugin/models", "palm_plugin/modules",
            "palm_plugin/tasks")
DEFAULT_OWNERS = ("palm_plugin/criterions", "palm_plugin/models", "palm_plugin/tasks")


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to the repository
    line: int
    operator: str
    old: str  # the source segment replaced
    new: str

    @property
    def name(self):
        return f"{self.path}:{self.line}:{self.operator}:{self.old} -> {self.new}"


def _other_value(value):
    """A plausible replacement of a literal default, or None when there is none (None itself, bytes)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value else 1
    if isinstance(value, float):
        return value / 2 if value else 0.1
    return None


def _segment(source_lines, node):
    """The exact source text of ``node`` (one line; multi-line nodes are not mutated)."""
    if node.lineno != node.end_lineno:
        return None
    return source_lines[node.lineno - 1][node.col_offset:node.end_col_offset]


def _is_dataclass_field(call):
    return isinstance(call.func, ast.Name) and call.func.id == "field"


def _is_arch_function(function):
    return any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "register_model_architecture"
               for d in function.decorator_list)


def default_mutants(path, tree, lines):
    """Defaults of dataclass fields and of architecture functions."""
    mutants = []

    def literal(node):
        if isinstance(node, ast.Constant) and not isinstance(node.value, str):
            new = _other_value(node.value)
            old = _segment(lines, node)
            if new is not None and old is not None:
                mutants.append(Mutant(path, node.lineno, "default", old, repr(new)))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_dataclass_field(node):
            for keyword in node.keywords:
                if keyword.arg == "default":
                    literal(keyword.value)
        if isinstance(node, ast.FunctionDef) and _is_arch_function(node):
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    if getattr(call.func, "id", "") in ("getattr", "safe_getattr") and len(call.args) == 3:
                        literal(call.args[2])
                    for keyword in call.keywords:
                        literal(keyword.value)
    return mutants


_MOVE = {ast.Lt: " - 1", ast.LtE: " + 1", ast.Gt: " + 1", ast.GtE: " - 1"}


def bound_mutants(path, tree, lines):
    """Comparison bounds, range stops and slice stops that are expressions, moved by one."""
    mutants = []

    def move(node, shift):
        old = _segment(lines, node)
        if old is not None and not isinstance(node, ast.Constant):
            mutants.append(Mutant(path, node.lineno, "bound", old, f"({old}){shift}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _MOVE:
            move(node.comparators[0], _MOVE[type(node.ops[0])])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "range" and node.args:
            move(node.args[0] if len(node.args) == 1 else node.args[1], " - 1")
        elif isinstance(node, ast.Slice) and node.upper is not None:
            move(node.upper, " - 1")
    return mutants


def all_mutants(repo=REPO):
    mutants = []
    for package in PACKAGES:
        for file in sorted((repo / package).glob("*.py")):
            text = file.read_text()
            tree, lines, path = ast.parse(text), text.splitlines(), str(file.relative_to(repo))
            if package in DEFAULT_OWNERS:
                mutants += default_mutants(path, tree, lines)
            mutants += bound_mutants(path, tree, lines)
    return mutants


def apply(text, mutant):
    """``text`` with the mutant's segment replaced on its line (the first occurrence there)."""
    lines = text.split("\n")
    line = lines[mutant.line - 1]
    if mutant.old not in line:
        raise ValueError(f"{mutant.name}: the segment is not on its line any more")
    lines[mutant.line - 1] = line.replace(mutant.old, mutant.new, 1)
    return "\n".join(lines)


# Tests the hand mutants run besides mutmut's selection: the FlexAttention masks and the copy layer's Triton kernels
# (under Triton's interpreter), whose modules mutmut does not mutate but the bound operator does.
HAND_EXTRA_TESTS = ("tests/test_flex_attention.py", "tests/test_copy_triton.py")


def selected_tests(repo=REPO):
    """The fast test files mutmut runs (setup.cfg) and the hand mutants' extra ones."""
    config = configparser.ConfigParser()
    config.read(repo / "setup.cfg")
    entries = config["mutmut"]["pytest_add_cli_args_test_selection"].split()
    return [e for e in entries if e.startswith("tests/")] + [t for t in HAND_EXTRA_TESTS if (repo / t).exists()]


def _module_name(path, repo):
    parts = path.relative_to(repo).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(tree, module):
    """Every dotted name ``tree`` imports, anywhere in it (imports inside functions too): ``from a import b`` gives
    ``a`` and ``a.b``, since b may be a module; relative imports resolved against ``module``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[:-node.level]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(repo=REPO):
    """{module: the modules of palm_plugin and tests it imports}, statically. A test also counts a module it names in
    a string (``monkeypatch.setattr("palm_plugin.x.f", ...)``). palm_plugin/__init__.py's import of every
    registering module is dynamic and left out: a test that only imports ``palm_plugin`` would own every mutant."""
    files = {_module_name(f, repo): f for part in ("palm_plugin", "tests") for f in (repo / part).rglob("*.py")}
    graph = {}
    for module, file in files.items():
        text = file.read_text()
        names = _imported_names(ast.parse(text), module)
        if module.startswith("tests."):
            names.update(re.findall(r"palm_plugin(?:\.\w+)+", text))
        # a.b.c names a.b.c if it is a module, else its longest module prefix (a.b.c may be a class of a.b)
        graph[module] = {next((p for p in (".".join(name.split(".")[:i]) for i in range(name.count(".") + 1, 0, -1))
                               if p in files and p not in ("palm_plugin", "tests")), None) for name in names} - {None}
    return graph


def owning_tests(mutant, repo=REPO, graph=None):
    """The selected test files that import the mutated module or any module that imports it, transitively (a test
    module imported by a test counts as that test's code)."""
    graph = import_graph(repo) if graph is None else graph
    reached, frontier = set(), {mutant.path[:-3].replace("/", ".")}
    while frontier:
        reached |= frontier
        frontier = {m for m, imports in graph.items() if imports & frontier} - reached
    tests = [t for t in selected_tests(repo) if t[:-3].replace("/", ".") in reached]
    if mutant.operator == "default":
        tests.append("tests/test_paper_defaults.py")
    return sorted(set(tests))


def run_one(mutant, work, python, timeout, graph=None):
    """Plant ``mutant`` in the copy ``work``, run its tests, restore the file; 'killed', 'survived', 'timeout' or
    'no tests'."""
    tests = owning_tests(mutant, work, graph)
    if not tests:
        return "no tests"
    target = work / mutant.path
    original = target.read_text()
    target.write_text(apply(original, mutant))
    try:
        result = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                                 *tests], cwd=work, capture_output=True, timeout=timeout,
                                env=dict(os.environ, PYTHONPATH=str(work), OMP_NUM_THREADS="1"))
        return "survived" if result.returncode == 0 else "killed"
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        target.write_text(original)


def run_all(mutants, timeout):
    """{name: verdict} of each mutant, planted one at a time in one copy of the repository; prints each verdict."""
    verdicts = {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for part in ("palm_plugin", "palm_tools", "tests", "setup.cfg", "pytest.ini", "docs", "examples"):
            source = REPO / part
            (shutil.copytree if source.is_dir() else shutil.copy)(source, work / part)
        graph = import_graph(work)
        for mutant in mutants:
            started = time.time()
            verdicts[mutant.name] = run_one(mutant, work, sys.executable, timeout, graph)
            print(f"{verdicts[mutant.name]:9} {time.time() - started:5.0f} s  {mutant.name}", flush=True)
    return verdicts


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m palm_tools.mutation_hand", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-package", type=int, default=10, help="mutants drawn per package and operator")
    parser.add_argument("--seed", type=int, default=1, help="seed of the draw")
    parser.add_argument("--timeout", type=int, default=600, help="seconds a mutant's tests may take")
    parser.add_argument("--operators", nargs="+", action="extend", choices=["default", "bound"],
                        help="which kinds of mutant to draw (default: both)")
    parser.add_argument("--list", action="store_true", help="print every mutant's name and the counts; run nothing")
    parser.add_argument("--out", type=Path, help="write the verdicts here (JSON)")
    parser.add_argument("--rerun", type=Path, metavar="JSON",
                        help="run again the mutants an earlier --out left undetected (after writing their tests)")
    args = parser.parse_args(argv)
    if args.rerun:
        earlier = json.loads(args.rerun.read_text())["mutants"]
        run_all([Mutant(**{k: v for k, v in m.items() if k != "verdict"}) for m in earlier
                 if m["verdict"] in ("survived", "no tests")], args.timeout)
        return 0
    if args.per_package < 1:
        parser.error(f"--per-package {args.per_package}: give 1 or more")
    mutants = all_mutants()
    groups = {}
    for mutant in mutants:
        if mutant.operator in (args.operators or ("default", "bound")):
            groups.setdefault((str(Path(mutant.path).parent).replace("/", "."), mutant.operator), []).append(mutant)
    if args.list:
        for mutant in mutants:
            print(mutant.name)
        for (package, operator), found in sorted(groups.items()):
            print(f"{package} {operator}: {len(found)}")
        return 0
    rng = random.Random(args.seed)
    sample = {key: rng.sample(found, min(args.per_package, len(found))) for key, found in sorted(groups.items())}
    verdicts = run_all([m for chosen in sample.values() for m in chosen], args.timeout)
    print("\n| package | operator | sampled | detected | survived | no tests | score (95% interval) |\n"
          "|---|---|---:|---:|---:|---:|---|")
    rows = []
    for (package, operator), chosen in sample.items():
        counts = [verdicts[m.name] for m in chosen]
        detected = counts.count("killed") + counts.count("timeout")
        judged = detected + counts.count("survived") + counts.count("no tests")
        low, high = wilson(detected, judged)
        rows.append({"package": package, "operator": operator, "sampled": len(chosen), "detected": detected,
                     "survived": counts.count("survived"), "no_tests": counts.count("no tests")})
        score = f"{100 * detected / judged:.0f}% ({low:.0f}-{high:.0f})" if judged else "—"
        print(f"| {package} | {operator} | {len(chosen)} | {detected} | {counts.count('survived')} | "
              f"{counts.count('no tests')} | {score} |")
    if args.out:
        args.out.write_text(json.dumps({"seed": args.seed, "per_package": args.per_package, "rows": rows,
                                        "mutants": [dict(asdict(m), verdict=verdicts[m.name])
                                                    for chosen in sample.values() for m in chosen]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
