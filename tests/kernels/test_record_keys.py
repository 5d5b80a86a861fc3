"""Record keys that survive a tidy: a family's template key is its template version and the compiled
text of its sources (`tritune.kernels.template_key`), so a comment, docstring or blank-line edit
keeps every stored trial, while a code change or a version bump retires them. Trials stored under
the former byte keys are carried over where their code is today's (`tune-cli carry-over`), and the
shipped recordings name no template key at all."""
import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tritune.kernels import former_keys
from tritune.kernels.family import family, ops, parse_expr
from tritune.kernels.template_key import compiled_text, files_key, template_key
from tritune.records.database import Database
from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.config import Config
from tritune.tuner.cli import main
from tritune.tuner.recordings import BUNDLED, Recording

KERNELS = Path(family("softmax").source_paths()[0]).parent
ROWS = (KERNELS / "rows" / "template.py").read_text()
CONTRACTION = (KERNELS / "contraction" / "template.py").read_text()


def _key(text: str, version: int = 1) -> str:
    return template_key(version, [text])


def _edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


# ----- what keeps a key: comments, docstrings, blank lines, trailing spaces
TIDIES = {
    "a comment reworded": ("# keep x in L2 for the second pass", "# x stays in L2: the second pass reads it again"),
    "a comment added": ("\n        scale = 1.0 / total\n",
                        "\n        # one division per row\n        scale = 1.0 / total\n"),
    "a comment at a line's end": ("        scale = 1.0 / total\n", "        scale = 1.0 / total  # per row\n"),
    "the module docstring": ("Each program owns ROWS rows.", "Each program owns ROWS consecutive rows."),
    "a docstring added": ("def _row_ptrs(X, Y, M, stride_xm, stride_ym, ROWS: tl.constexpr):\n",
                          'def _row_ptrs(X, Y, M, stride_xm, stride_ym, ROWS: tl.constexpr):\n'
                          '    """Pointers to the program\'s rows\n\n    (clamped to M - 1).\n    """\n'),
    "blank lines": ("@triton.jit\ndef _load(", "\n\n\n@triton.jit\n\ndef _load("),
    "trailing spaces": ("        big = new\n", "        big = new   \n"),
}
# what retires it: anything Python compiles differently
CHANGES = {
    "a constant": ("scale = 1.0 / total", "scale = 2.0 / total"),
    "a name": ("        big = new\n", "        big = new\n        big2 = new\n"),
    "a string": ('"evict_last")\n            new', '"evict_first")\n            new'),
    "indentation": ("        scale = 1.0 / total\n", "        scale = (1.0 /\n                 total)\n"),
}


@pytest.mark.parametrize("name", sorted(TIDIES))
def test_a_tidy_keeps_the_key(name):
    tidied = _edit(ROWS, *TIDIES[name])
    assert tidied != ROWS
    assert _key(tidied) == _key(ROWS)


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_code_change_retires_the_key(name):
    assert _key(_edit(ROWS, *CHANGES[name])) != _key(ROWS)


def test_a_version_bump_retires_the_key():
    assert _key(ROWS, version=2) != _key(ROWS)


def test_text_inside_a_string_is_code():
    # the GEMM templates write kernel source as strings: a comment or blank line there is what Triton reads
    start = CONTRACTION.index("    # {description}")
    assert CONTRACTION.index('"""', start) > start  # inside a generated-source string
    for edited in (CONTRACTION[:start] + "    # the tile's K loop\n" + CONTRACTION[start:],
                   CONTRACTION[:start] + "\n" + CONTRACTION[start:]):
        assert _key(edited) != _key(CONTRACTION)


def test_compiled_text_drops_only_what_does_not_compile():
    source = ('"""Module."""\nimport os  # why\n\n\ndef f(x):\n    """Doc\n\n    more."""\n'
              '    s = """a\n\n  # not a comment\n"""  \n    return f"{x}#" + s\n')
    assert compiled_text(source) == ('import os\ndef f(x):\n    s = """a\n\n  # not a comment\n"""\n'
                                     '    return f"{x}#" + s')


def test_the_order_of_sources_counts():
    assert template_key(1, ["a = 1", "b = 2"]) != template_key(1, ["b = 2", "a = 1"])


@pytest.mark.parametrize("op", ["softmax", "matmul", "attention"])
def test_a_family_key_is_that_of_its_sources(op, tmp_path):
    # copies of the family's sources, one of them tidied: the key computed on them is the family's
    paths = family(op).source_paths()
    copies = [tmp_path / f"{i}.py" for i in range(len(paths))]
    for path, copy in zip(paths, copies):
        shutil.copy(path, copy)
    assert files_key(family(op).template_version, copies) == family(op).template_hash()
    template = paths.index(next(p for p in paths if p.name == "template.py"))
    text = copies[template].read_text()
    copies[template].write_text("# tidied\n\n" + text + "\n\n# the end\n")
    assert files_key(family(op).template_version, copies) == family(op).template_hash()
    copies[template].write_text(text + "\nTIDY = 1\n")
    assert files_key(family(op).template_version, copies) != family(op).template_hash()


def test_bumping_a_family_version_retires_its_keys(monkeypatch):
    before = {op: family(op).template_hash() for op in ops()}
    monkeypatch.setattr(type(family("softmax")), "template_version", 2)
    after = {op: family(op).template_hash() for op in ops()}
    assert {op for op in ops() if after[op] != before[op]} == {"softmax", "layernorm"}  # one family class


def test_every_family_names_its_version():
    assert all(isinstance(family(op).template_version, int) and family(op).template_version >= 1 for op in ops())


# ----- carrying stored trials over from former keys
OLD = "0123456789abcdef"
GPU = DeviceKey("NVIDIA H100", "9.0", "3.6.0", "2.11.0", OLD)


def _trial(config: Config, t: float) -> MeasureResult:
    return MeasureResult(config, Status.OK, t, t, t, t, 1.0, 1000.0)


def _db(path: Path) -> tuple[Database, dict[str, str]]:
    """A database with two matmul trials and one softmax trial under the former key OLD."""
    db = Database(path)
    keys = {}
    for op, shape in (("matmul", "64"), ("softmax", "64,128")):
        expr = parse_expr(op, shape, "fp16")
        db.add_workload(expr.key, op, "fp16", expr.to_json())
        keys[op] = expr.key
    db.save(keys["matmul"], GPU, [_trial(Config.of(BLOCK_M=16), 2.0), _trial(Config.of(BLOCK_M=32), 1.0)])
    db.save(keys["softmax"], GPU, [_trial(Config.of(ROWS=1), 1.0)])
    db.save_verdict(keys["matmul"], GPU, Config.of(BLOCK_M=16), {})
    db.save_graph_verdict("graph", GPU, "default", "tritune", {})
    return db, keys


def _today(op: str) -> DeviceKey:
    return replace(GPU, template=family(op).template_hash())


def test_trials_of_todays_code_are_carried_over(tmp_path, monkeypatch):
    monkeypatch.setattr(former_keys, "FORMER", {"matmul": {OLD: family("matmul").template_hash()}})
    db, keys = _db(tmp_path / "t.db")
    assert former_keys.carry_over(db) == {op: 2 if op == "matmul" else 0 for op in ops()}
    moved = db.trials(keys["matmul"], _today("matmul"))
    assert [r.config for r in moved] == [Config.of(BLOCK_M=16), Config.of(BLOCK_M=32)]
    assert db.best(keys["matmul"], _today("matmul")).config == Config.of(BLOCK_M=16)  # the verdict moved too
    assert db.graph_verdict("graph", _today("matmul"), "default") == "tritune"
    assert len(db.trials(keys["softmax"], GPU)) == 1  # another op's trials stay under their key
    assert former_keys.carry_over(db) == {op: 0 for op in ops()}  # once is enough


def test_a_config_stored_under_both_keys_keeps_both(tmp_path, monkeypatch):
    monkeypatch.setattr(former_keys, "FORMER", {"matmul": {OLD: family("matmul").template_hash()}})
    db, keys = _db(tmp_path / "t.db")
    db.save(keys["matmul"], _today("matmul"), [_trial(Config.of(BLOCK_M=16), 3.0)])
    assert former_keys.carry_over(db)["matmul"] == 1
    assert sorted(r.t_median for r in db.trials(keys["matmul"], _today("matmul"))) == [1.0, 3.0]
    assert [r.t_median for r in db.trials(keys["matmul"], GPU)] == [2.0]  # not deleted: left where it was
    assert len(db.trials(keys["matmul"])) == 3


def test_trials_of_other_code_stay_retired(tmp_path, monkeypatch):
    # the former key's code is not today's (changed since, or the version bumped): nothing moves
    monkeypatch.setattr(former_keys, "FORMER", {"matmul": {OLD: "fedcba9876543210"}})
    db, keys = _db(tmp_path / "t.db")
    assert former_keys.carry_over(db) == {op: 0 for op in ops()}
    assert db.trials(keys["matmul"], _today("matmul")) == []
    assert len(db.trials(keys["matmul"], GPU)) == 2


def test_carry_over_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(former_keys, "FORMER", {"matmul": {OLD: family("matmul").template_hash()}})
    _db(tmp_path / "t.db")[0].close()
    main(["carry-over", "--db", str(tmp_path / "t.db")])
    assert capsys.readouterr().err.strip() == "carried over 2 trials (matmul 2)"
    with pytest.raises(SystemExit) as exit_:
        main(["carry-over", "--db", str(tmp_path / "none.db")])
    assert exit_.value.code == 2 and not (tmp_path / "none.db").exists()


def test_former_keys_name_every_op_once():
    assert set(former_keys.FORMER) <= set(ops())
    assert all(len(former) == 1 for former in former_keys.FORMER.values())


# ----- the shipped recordings: keyed on the GPU and versions, never on a template
FIXTURES = Path(__file__).parents[1] / "fixtures" / "spaces"
RECORDINGS = sorted(BUNDLED.glob("*.jsonl.gz")) + sorted(FIXTURES.rglob("*.jsonl.gz"))


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_recordings_replay_under_any_template_key(path):
    with gzip.open(path, "rt") as fp:
        meta = json.loads(fp.readline())["meta"]
    assert "template" not in meta["device"]
    rec = Recording.load(path)
    assert rec.device_key().template == "recorded"
    assert rec.task(rec.device_key()).space.valid(rec.best_config)
