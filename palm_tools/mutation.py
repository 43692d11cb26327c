"""A seeded random sample of mutmut's mutants, run and scored per package (``make mutation-sample``).

All of the core's mutants take about 3.5 hours on an idle 2-core machine (docs/mutation.md); a sample of a few dozen per
package estimates each package's score in well under an hour, with a 95% interval. mutmut (configured in setup.cfg)
still generates every mutant, collects which tests reach which function, and runs the chosen ones; this module only
chooses the names and counts mutmut's verdicts, which it reads from mutmut's per-file ``.meta`` records.

mutmut generates mutants only inside ``mutmut run``, so the first call runs the mutants of one small module
(``--bootstrap``); its names are known before generation, the others are not.
"""
import argparse
import difflib
import json
import math
import random
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# mutmut 3's exit codes of a mutant's test run (mutmut/stats.py)
KILLED, SURVIVED, TIMEOUT, NO_TESTS = "killed", "survived", "timeout", "no tests"
STATUS = {1: KILLED, 3: KILLED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS, 36: TIMEOUT, 24: TIMEOUT, -24: TIMEOUT,
          152: TIMEOUT, 255: TIMEOUT, None: "not checked"}


def package_of(name):
    """``palm_plugin.data.pmlm_dataset.x_f__mutmut_3`` -> ``palm_plugin.data``."""
    return ".".join(name.split(".")[:2])


def read_verdicts(mutants=Path("mutants")):
    """Every generated mutant's name and mutmut's verdict (``not checked`` until it has run)."""
    verdicts = {}
    for meta in mutants.rglob("*.meta"):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            verdicts[name] = STATUS.get(code, "suspicious")
    return verdicts


def read_names(path):
    """Mutant names, one a line; ``#`` starts a comment (the reason a mutant is equivalent)."""
    return {line.split("#")[0].strip() for line in path.read_text().splitlines()} - {""}


# an entry of the equivalent list records, after its reason, the edit its mutant makes (mutant_edit)
EDIT_MARK = "  # mutant: "


def _function_lines(lines, name):
    """The lines of the function ``name`` in a file mutmut wrote (its signature may span lines, closed by ``)``)."""
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith(f"def {name}(")), None)
    if start is None:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
                                or lines[end].lstrip().startswith(")")):
        end += 1
    return [lines[start].replace(name, "f", 1)] + lines[start + 1:end]


def mutant_edit(name, mutants=Path("mutants")):
    """What mutmut's mutant ``name`` changes in its function: the lines it changes as the mutant reads them, stripped
    and joined by " / " (a mutant that only removes lines: each as "-" and the line); None when ``mutants`` holds no
    such function. mutmut numbers a function's mutants in order, so a change to the function renumbers them: an
    entry of the equivalent list records this edit, and an entry whose mutant now makes another is found."""
    module, function = name.rsplit(".", 1)
    base = mutants / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            lines = path.read_text().splitlines()
            orig = _function_lines(lines, re.sub(r"__mutmut_\d+$", "__mutmut_orig", function))
            mutant = _function_lines(lines, function)
            if orig and mutant:
                diff = [d for d in difflib.unified_diff(orig, mutant, n=0, lineterm="")
                        if d[:1] in "+-" and d[:3] not in ("+++", "---")]
                added = [d[1:].strip() for d in diff if d[0] == "+"]
                return " / ".join(added or ["-" + d[1:].strip() for d in diff])
    return None


def stale_entries(path, verdicts, mutants=Path("mutants")):
    """The entries of the equivalent list at ``path`` not to be trusted, each as (name, why): a mutant mutmut no
    longer generates, an entry that records no edit, or a mutant that now makes another edit than the one recorded."""
    stale = []
    for line in path.read_text().splitlines():
        name = line.split("#")[0].strip()
        if name:
            recorded = line.partition(EDIT_MARK)[2].strip()
            edit = mutant_edit(name, mutants) if name in verdicts else None
            if edit is None:
                stale.append((name, "mutmut generates no such mutant now"))
            elif not recorded:
                stale.append((name, f"the entry records no edit; the mutant: {edit}"))
            elif recorded != edit:
                stale.append((name, f"the mutant now: {edit}; the entry: {recorded}"))
    return stale


def choose(names, per_package, seed, packages=None):
    """``per_package`` names of each package (of each of ``packages`` only, when given), drawn without replacement
    by a seeded generator (sorted first, so the draw does not depend on the order mutmut wrote its files in)."""
    by_package = defaultdict(list)
    for name in sorted(names):
        if packages is None or package_of(name) in packages:
            by_package[package_of(name)].append(name)
    rng = random.Random(seed)
    return {package: sorted(rng.sample(found, min(per_package, len(found)))) for package, found in
            sorted(by_package.items())}


def wilson(killed, total, z=1.96):
    """The Wilson score interval (95%) of a proportion, in %; (nan, nan) for no trials."""
    if not total:
        return math.nan, math.nan
    p = killed / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, 100 * (centre - half)), min(100.0, 100 * (centre + half))


def score_rows(sample, verdicts, equivalent=()):
    """Per package: counts of each verdict among the sampled mutants, and the score with its 95% interval.

    The score is Stryker's mutation score: detected (killed, or a timeout: the tests hang on the mutant) over
    detected + survived + no test reaches it; the named ``equivalent`` mutants and those not yet run are left out."""
    rows = []
    for package, names in sample.items():
        counts = defaultdict(int)
        for name in names:
            counts["equivalent" if name in equivalent else verdicts.get(name, "not checked")] += 1
        detected = counts[KILLED] + counts[TIMEOUT]
        judged = detected + counts[SURVIVED] + counts[NO_TESTS]
        low, high = wilson(detected, judged)
        rows.append({"package": package, "sampled": len(names), **counts, "judged": judged,
                     "score": 100 * detected / judged if judged else math.nan, "low": low, "high": high})
    return rows


def markdown(rows):
    head = ("| package | sampled | killed | survived | timeout | no test reaches it | equivalent | not checked | "
            "score (95% interval) |\n|---|---:|---:|---:|---:|---:|---:|---:|---|")
    lines = [f"| {r['package']} | {r['sampled']} | {r.get(KILLED, 0)} | {r.get(SURVIVED, 0)} | {r.get(TIMEOUT, 0)} | "
             f"{r.get(NO_TESTS, 0)} | {r.get('equivalent', 0)} | {r.get('not checked', 0)} | "
             f"{r['score']:.1f}% ({r['low']:.1f}-{r['high']:.1f}) |" for r in rows]
    return "\n".join([head, *lines])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m palm_tools.mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-package", type=int, default=40, help="mutants drawn from each package")
    parser.add_argument("--seed", type=int, default=1, help="seed of the draw")
    parser.add_argument("--packages", nargs="+", action="extend", metavar="PACKAGE",
                        help="draw from these packages only (e.g. palm_tools.convert; default: every package)")
    parser.add_argument("--bootstrap", default="palm_plugin.modules.table_extension.*",
                        help="mutants run first, when none are generated yet (a small module's glob)")
    parser.add_argument("--equivalent", type=Path, help="file with one mutant name a line, judged equivalent by "
                                                        "hand, each with its reason after # and the mutant's edit "
                                                        "after '# mutant:' (an entry without it is not trusted)")
    parser.add_argument("--max-children", type=int, default=2, help="mutmut's parallel test processes")
    parser.add_argument("--mutmut", default="mutmut", help="the mutmut command")
    parser.add_argument("--report-only", action="store_true", help="count the verdicts of the sample, run nothing")
    parser.add_argument("--out", type=Path, help="write the sample's names, verdicts and scores here (JSON)")
    args = parser.parse_args(argv)

    run = [args.mutmut, "run", "--max-children", str(args.max_children)]
    if not args.report_only and not read_verdicts():
        subprocess.run(run + [args.bootstrap], check=True)
    verdicts = read_verdicts()
    if not verdicts:
        sys.exit("mutation: no mutants found under mutants/: run it from the repository root, after `mutmut run`")
    sample = choose(verdicts, args.per_package, args.seed, args.packages)
    if not sample:
        sys.exit(f"mutation: no mutants of {' '.join(args.packages)}; packages are named as palm_plugin.data")
    if not args.report_only:
        subprocess.run(run + [name for names in sample.values() for name in names], check=True)
        verdicts = read_verdicts()
    stale = stale_entries(args.equivalent, verdicts) if args.equivalent else []
    equivalent = (read_names(args.equivalent) if args.equivalent else set()) - {name for name, _ in stale}
    rows = score_rows(sample, verdicts, equivalent)
    print(markdown(rows))
    survivors = [n for names in sample.values() for n in names if verdicts.get(n) == SURVIVED and n not in equivalent]
    print("\nsurvived, not judged equivalent:" if survivors else "\nno survivor left to judge", *survivors, sep="\n")
    if stale:
        print(f"\n{len(stale)} entries of {args.equivalent} not trusted (scored by mutmut's verdict):",
              *(f"{name}: {why}" for name, why in stale), sep="\n")
    if args.out:
        args.out.write_text(json.dumps({"seed": args.seed, "per_package": args.per_package, "rows": rows,
                                        "verdicts": {n: verdicts.get(n) for ns in sample.values() for n in ns},
                                        "stale": dict(stale)}, indent=1))


if __name__ == "__main__":
    main()
