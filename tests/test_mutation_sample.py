"""palm_tools.mutation: the sample it draws and the scores it counts from mutmut's records."""
import json
import math

from palm_tools.mutation import choose, markdown, read_verdicts, score_rows, wilson


def test_wilson_interval_equals_the_textbook_values():
    # 9 of 10: 59.58% to 98.21% (Wilson 1927; e.g. Newcombe 1998, table I, method 3 gives 0.5958-0.9821)
    low, high = wilson(9, 10)
    assert math.isclose(low, 59.58, abs_tol=0.01) and math.isclose(high, 98.21, abs_tol=0.01)
    low, high = wilson(0, 20)  # all survived: the lower end is 0, the upper end 16.1% (Newcombe: 0.0000-0.1611)
    assert low == 0 and math.isclose(high, 16.11, abs_tol=0.01)
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_the_draw_is_per_package_seeded_and_independent_of_listing_order():
    names = [f"palm_plugin.data.m.x_f__mutmut_{i}" for i in range(50)] + \
            [f"palm_tools.convert.bert.x_g__mutmut_{i}" for i in range(5)]
    sample = choose(names, 10, seed=3)
    assert set(sample) == {"palm_plugin.data", "palm_tools.convert"}
    assert len(sample["palm_plugin.data"]) == 10 and len(set(sample["palm_plugin.data"])) == 10
    assert sample["palm_tools.convert"] == sorted(names[50:])  # a package with fewer mutants: all of them
    assert choose(list(reversed(names)), 10, seed=3) == sample
    assert choose(names, 10, seed=4) != sample


def test_scores_count_mutmut_records_and_leave_equivalent_mutants_out(tmp_path):
    names = {f"palm_plugin.models.m.x_f__mutmut_{i}": code for i, code in
             enumerate([1, 1, 1, 3, 0, 0, 36, 33, None])}
    meta = tmp_path / "palm_plugin" / "models" / "m.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": names}))
    verdicts = read_verdicts(tmp_path)
    sample = {"palm_plugin.models": sorted(names)}
    row, = score_rows(sample, verdicts, equivalent={"palm_plugin.models.m.x_f__mutmut_5"})
    # killed 4 (exit codes 1 and 3), survived 1 (one of the two is equivalent), timeout 1, no tests 1, not run 1
    assert (row["killed"], row["survived"], row["timeout"], row["no tests"], row["not checked"],
            row["equivalent"]) == (4, 1, 1, 1, 1, 1)
    # detected: the killed and the timeout (5); undetected: the survivor and the mutant no test reaches (2)
    assert row["judged"] == 7 and math.isclose(row["score"], 100 * 5 / 7)
    assert "| palm_plugin.models | 9 | 4 | 1 | 1 | 1 | 1 | 1 | 71.4% (" in markdown([row])


def test_the_equivalent_list_reads_names_without_their_reasons(tmp_path):
    from palm_tools.mutation import read_names

    listed = tmp_path / "equivalent.txt"
    listed.write_text("# header\npalm_plugin.a.x_f__mutmut_1  # why\n\npalm_plugin.a.x_f__mutmut_2\n")
    assert read_names(listed) == {"palm_plugin.a.x_f__mutmut_1", "palm_plugin.a.x_f__mutmut_2"}


def test_a_draw_from_some_packages_only():
    names = [f"palm_plugin.data.m.x_f__mutmut_{i}" for i in range(50)] + \
            [f"palm_tools.convert.bert.x_g__mutmut_{i}" for i in range(50)]
    sample = choose(names, 10, seed=3, packages=["palm_tools.convert"])
    assert list(sample) == ["palm_tools.convert"] and len(set(sample["palm_tools.convert"])) == 10
    assert set(sample["palm_tools.convert"]) <= set(names[50:])
    assert choose(names, 10, seed=3, packages=["palm_plugin.modules"]) == {}


HAND_SOURCE = '''from dataclasses import dataclass, field


@dataclass
class Config:
    mask_prob: float = field(default=0.15, metadata={"help": "x"})
    layers: int = field(default=0)
    shared: bool = field(default=True)
    name: str = field(default="bert")


@register_model_architecture("m", "m_tiny")
def tiny(args):
    args.dim = getattr(args, "dim", 128)
    _base(args, heads=4)


def spans(tokens, limit):
    if len(tokens) < limit:
        return tokens[:limit]
    return [t for t in range(len(tokens)) if t >= 2]
'''


def test_hand_mutants_change_defaults_and_move_expression_bounds(tmp_path):
    from palm_tools.mutation_hand import apply, bound_mutants, default_mutants
    import ast

    tree, lines = ast.parse(HAND_SOURCE), HAND_SOURCE.splitlines()
    defaults = {(m.line, m.old, m.new) for m in default_mutants("m.py", tree, lines)}
    # floats halved, 0 becomes 1, bools negated, an arch's getattr default and call keyword doubled; strings left
    assert defaults == {(6, "0.15", "0.075"), (7, "0", "1"), (8, "True", "False"), (14, "128", "256"),
                        (15, "4", "8")}
    bounds = {(m.line, m.old, m.new) for m in bound_mutants("m.py", tree, lines)}
    # the expression bounds move the other way from mutmut's < -> <=; the literal 2 is left to mutmut
    assert bounds == {(19, "limit", "(limit) - 1"), (20, "limit", "(limit) - 1"),
                      (21, "len(tokens)", "(len(tokens)) - 1")}
    mutant = next(m for m in bound_mutants("m.py", tree, lines) if m.line == 21)
    assert apply(HAND_SOURCE, mutant).splitlines()[20] == "    return [t for t in range((len(tokens)) - 1) if t >= 2]"


def test_owning_tests_follow_the_import_graph_into_the_selected_files(tmp_path):
    from palm_tools.mutation_hand import Mutant, owning_tests

    files = {
        "setup.cfg": "[mutmut]\npytest_add_cli_args_test_selection =\n    -m\n    not slow\n    tests/test_a.py\n"
                     "    tests/test_b.py\n    tests/test_d.py\n    tests/test_e.py\n",
        "palm_plugin/__init__.py": "import importlib\n",
        "palm_plugin/models/__init__.py": "",
        "palm_plugin/models/stacks.py": "LIMIT = 3\n",
        "palm_plugin/models/palm.py": "from palm_plugin.models.stacks import LIMIT\n",
        "palm_plugin/models/hub.py": "def load():\n    from .palm import LIMIT\n    return LIMIT\n",
        "palm_plugin/models/other.py": "X = 1\n",
        "tests/__init__.py": "",
        "tests/helper.py": "from palm_plugin.models import palm\n",
        "tests/test_a.py": "from palm_plugin.models.hub import load\n",  # stacks <- palm <- hub (inside a function)
        "tests/test_b.py": "from palm_plugin.models import other\n",  # unrelated
        "tests/test_c.py": "import palm_plugin.models.stacks\n",  # reaches it, but not in the selection
        "tests/test_d.py": "from tests.helper import palm\n",  # through a test helper module
        "tests/test_e.py": "import palm_plugin\n",  # the plugin's dynamic imports are not followed
        "tests/test_flex_attention.py": 'def test(patch):\n    patch.setattr("palm_plugin.models.palm.LIMIT", 4)\n',
        "tests/test_copy_triton.py": "from palm_plugin.models import other\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    owners = lambda path, operator="bound": owning_tests(Mutant(path, 1, operator, "3", "4"), tmp_path)
    assert owners("palm_plugin/models/stacks.py") == ["tests/test_a.py", "tests/test_d.py",
                                                      "tests/test_flex_attention.py"]
    assert owners("palm_plugin/models/hub.py") == ["tests/test_a.py"]
    assert owners("palm_plugin/models/other.py", "default") == ["tests/test_b.py", "tests/test_copy_triton.py",
                                                                "tests/test_paper_defaults.py"]


# a file as mutmut writes it under mutants/: each function's unmutated copy and its mutants (trampolines left out)
MUTATED = '''def x_spans__mutmut_orig(tokens, limit):
    if len(tokens) < limit:
        return tokens[:limit]
    return tokens


def x_spans__mutmut_1(tokens, limit):
    if len(tokens) <= limit:
        return tokens[:limit]
    return tokens


def x_spans__mutmut_2(tokens, limit):
    if len(tokens) < limit:
        return tokens[:limit + 1]
    return tokens

mutants_x_spans__mutmut['x_spans__mutmut_1'] = x_spans__mutmut_1 # type: ignore # mutmut generated


class Layer:
    def xǁLayerǁ__init____mutmut_orig(
        self,
        dim: int,
        bias: bool = False,
    ):
        self.dim = dim

    def xǁLayerǁ__init____mutmut_1(
        self,
        dim: int,
        bias: bool = True,
    ):
        self.dim = dim
    xǁLayerǁ__init____mutmut_mutants : ClassVar[MutantDict] = {}
'''


def write_mutants(root, exit_codes):
    module = root / "mutants" / "palm_plugin" / "data"
    module.mkdir(parents=True)
    (module / "m.py").write_text(MUTATED)
    (module / "m.py.meta").write_text(json.dumps({"exit_code_by_key": {f"palm_plugin.data.m.{name}": code for
                                                                       name, code in exit_codes.items()}}))
    return root / "mutants"


def test_a_mutants_edit_is_the_line_it_changes_as_the_mutant_reads_it(tmp_path):
    from palm_tools.mutation import mutant_edit

    mutants = write_mutants(tmp_path, {})
    assert mutant_edit("palm_plugin.data.m.x_spans__mutmut_1", mutants) == "if len(tokens) <= limit:"
    assert mutant_edit("palm_plugin.data.m.x_spans__mutmut_2", mutants) == "return tokens[:limit + 1]"
    # a method whose signature spans lines: the default it changes there, not the end of the function at ")"
    assert mutant_edit("palm_plugin.data.m.xǁLayerǁ__init____mutmut_1", mutants) == "bias: bool = True,"
    assert mutant_edit("palm_plugin.data.m.x_spans__mutmut_3", mutants) is None
    assert mutant_edit("palm_plugin.data.other.x_spans__mutmut_1", mutants) is None


EQUIVALENT = """# header
palm_plugin.data.m.x_spans__mutmut_1  # why  # mutant: if len(tokens) <= limit:
palm_plugin.data.m.x_spans__mutmut_2  # renumbered: this edit is mutant 1's now  # mutant: if len(tokens) <= limit:
palm_plugin.data.m.xǁLayerǁ__init____mutmut_1  # an entry that records no edit
palm_plugin.data.m.x_spans__mutmut_3  # gone  # mutant: if len(tokens) > limit:
"""


def test_entries_whose_mutant_is_gone_or_makes_another_edit_are_stale(tmp_path):
    from palm_tools.mutation import stale_entries

    mutants = write_mutants(tmp_path, {"x_spans__mutmut_1": 0, "x_spans__mutmut_2": 0, "xǁLayerǁ__init____mutmut_1": 0})
    listed = tmp_path / "equivalent.txt"
    listed.write_text(EQUIVALENT)
    assert stale_entries(listed, read_verdicts(mutants), mutants) == [
        ("palm_plugin.data.m.x_spans__mutmut_2",
         "the mutant now: return tokens[:limit + 1]; the entry: if len(tokens) <= limit:"),
        ("palm_plugin.data.m.xǁLayerǁ__init____mutmut_1", "the entry records no edit; the mutant: bias: bool = True,"),
        ("palm_plugin.data.m.x_spans__mutmut_3", "mutmut generates no such mutant now"),
    ]


def test_the_sample_scores_stale_entries_by_mutmuts_verdict_and_names_them(tmp_path, monkeypatch, capsys):
    from palm_tools.mutation import main

    write_mutants(tmp_path, {"x_spans__mutmut_1": 0, "x_spans__mutmut_2": 0, "xǁLayerǁ__init____mutmut_1": 1})
    (tmp_path / "equivalent.txt").write_text(EQUIVALENT)
    monkeypatch.chdir(tmp_path)
    main(["--report-only", "--equivalent", "equivalent.txt", "--out", "sample.json"])
    out = capsys.readouterr().out
    # mutant 1 is equivalent; 2 survives (its entry is stale); the Layer mutant is killed (its entry too)
    assert "| palm_plugin.data | 3 | 1 | 1 | 0 | 0 | 1 | 0 | 50.0% (" in out
    assert "survived, not judged equivalent:\npalm_plugin.data.m.x_spans__mutmut_2\n" in out
    assert "3 entries of equivalent.txt not trusted (scored by mutmut's verdict):" in out
    assert list(json.loads((tmp_path / "sample.json").read_text())["stale"]) == [
        "palm_plugin.data.m.x_spans__mutmut_2", "palm_plugin.data.m.xǁLayerǁ__init____mutmut_1",
        "palm_plugin.data.m.x_spans__mutmut_3"]
