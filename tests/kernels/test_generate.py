"""transformers' generate() with a static KV cache, compiled as users compile it: the backend takes
torch.compile's mode and options, survives CompileConfig's deep copy and pickling, and replays a
tuned kernel at every site of the decode step that `tune-model --decode` captured (kernels under
Triton's interpreter on CPU; the rest of each graph eager, Inductor's lowering being torch's; CUDA
graphs recorded and replayed by a stand-in)."""
import copy
import logging
import pickle
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import tritune
from models import llama_lm
from test_compiler import fresh_dynamo, store, tuned_calls  # noqa: F401 - fixtures
from test_graph_step import fake_cuda  # noqa: F401 - a fixture: CUDA graphs recorded and replayed on CPU
from tritune.kernels.device import device_info
from tritune.kernels.family import device_key, family
from tritune.kernels.backend import compiler as compiler_module
from tritune.records.database import Database
from tritune.records.result import MeasureResult, Status
from tritune.tuner.cli import cli
from tritune.tuner.model.decode import DecodeShape, cache_tensors, decode_step, teacher_forced
from tritune.tuner.model.subject import subject_tasks

SPEC = f"{__file__}:tiny_llama"


def tiny_llama() -> nn.Module:
    """A Llama-style causal LM small enough for the interpreter: GQA 4/2, SiLU-gated MLP, rotary."""
    return llama_lm(hidden=32, intermediate=48, heads=4, kv_heads=2, vocab=96)


@pytest.fixture
def eager_inductor(monkeypatch):
    """Inductor's lowering (torch's own, measured on the GPU) replaced by running the graph as it is:
    on CPU it would compile C++ for minutes; the modes and options it was asked for are kept."""
    asked = []

    def lowering(mode=None, combo=False, early=False, options=None):
        asked.append((mode, combo, dict(options or {})))
        return lambda gm, example_inputs: gm.forward
    monkeypatch.setattr(compiler_module, "inductor", lowering)
    return asked


def test_the_registered_backend_takes_the_mode_and_options_torch_compile_passes(eager_inductor):
    model, x = nn.Linear(13, 7), torch.randn(5, 13)
    for mode in ("reduce-overhead", "max-autotune", "default", None):
        torch._dynamo.reset()
        with torch.no_grad():
            y = torch.compile(model, backend="tritune", mode=mode, options=None if mode else {"freezing": True})(x)
        assert torch.allclose(y, model(x))
        # the fallback, so asked for (torch.compile passes no mode for its default)
        assert (None if mode == "default" else mode, False, {} if mode else {"freezing": True}) in eager_inductor
    assert ("reduce-overhead", False, {}) in eager_inductor and (None, True, {}) in eager_inductor  # + plain graphs


def test_the_backends_own_mode_wins_over_the_one_torch_compile_passes(eager_inductor, tmp_path):
    backend = tritune.compiler(store(tmp_path / "t.db", []), mode="default")
    model, x = nn.Linear(13, 7), torch.randn(5, 13)
    with torch.no_grad():
        torch.compile(model, backend=backend, mode="reduce-overhead")(x)
    assert {m for m, _, _ in eager_inductor} == {"default"}


def test_an_unknown_mode_from_torch_compile_is_one_clear_error(tmp_path):
    backend = tritune.compiler(store(tmp_path / "t.db", []))
    with pytest.raises(ValueError, match="unknown mode 'fastest'"):
        backend(None, [], mode="fastest")


def test_a_compiler_survives_deepcopy_and_pickle_and_reopens_its_database(tmp_path, tuned_calls):
    model, x = nn.Linear(23, 11), torch.randn(17, 23)
    db = store(tmp_path / "t.db", [tritune.extract_tasks(model, (x,))[0].expr])
    made = tritune.compiler(db, fallback="eager")
    for backend in (copy.deepcopy(made), pickle.loads(pickle.dumps(made))):
        assert backend.db == Path(db)  # a path: each process opens the file itself
        torch._dynamo.reset()
        with torch.no_grad():
            y = torch.compile(model, backend=backend)(x)
        assert torch.allclose(y, model(x), atol=1e-5) and [k for _, k in backend.sites] == ["tuned"]
    assert len(tuned_calls) == 2


@pytest.fixture
def site_calls(monkeypatch):
    """The description of every tuned kernel a compiled graph ran, in order."""
    from tritune.kernels.backend import sites

    calls = []
    for kind in (sites.Site, sites.GatedSite, sites.WideSite, sites.AttentionSite):
        def counting(self, *args, _original=kind.__call__, **kwargs):
            calls.append(self.expr.describe())
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(kind, "__call__", counting)
    return calls


def store_every_task(path, tasks):
    """Each task's family default config as its one trial: every site has a record."""
    with Database(path) as db:
        for task in tasks:
            expr = task.expr
            db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
            result = MeasureResult(family(expr.op).default_config(expr), Status.OK, 1.0, 1.0, 1.0, 1.0)
            db.save(expr.key, device_key(device_info(), expr.op), [result])
    return path


def compile_config(backend, **options):
    from transformers import CompileConfig

    config = CompileConfig(backend=backend, **options)
    config._compile_all_devices = True  # generate() compiles on CUDA only unless told
    return config


@pytest.mark.parametrize("form", ["name", "object"])
@pytest.mark.system
def test_generate_with_a_static_cache_replays_a_tuned_kernel_at_every_site(tmp_path, caplog, eager_inductor,
                                                                           site_calls, fake_cuda, form):
    shape = DecodeShape(batch=2, context=5, new_tokens=4)
    tasks = subject_tasks(SPEC, (), "fp32", "cpu", decode=str(shape))
    assert {t.expr.op for t in tasks} == {"wide", "attention", "matmul", "gated"}
    db = store_every_task(tmp_path / "t.db", tasks)
    torch.manual_seed(0)
    lm = tiny_llama().eval()
    prompt = torch.randint(0, 96, (2, 5))
    tokens = torch.randint(0, 96, (2, 4))
    want, want_cache = teacher_forced(lm, prompt, tokens)
    backend = "tritune" if form == "name" else tritune.compiler(db)
    with tritune.apply_history_best(db), caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        got, cache = teacher_forced(lm, prompt, tokens, compile_config(backend))  # CompileConfig's mode: reduce-overhead
    assert "no tuned record" not in caplog.text
    assert {t.expr.describe() for t in tasks} == set(site_calls)  # every site of the graph generate() compiled
    for t in tasks:  # three steps ran compiled (the first token is the prompt's), each site's kernel in each
        assert site_calls.count(t.expr.describe()) >= 3 * t.count
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    for a, b in zip(cache_tensors(cache, 8), cache_tensors(want_cache, 8)):
        assert torch.allclose(a, b, atol=1e-5)
    assert ("reduce-overhead", False, {}) in eager_inductor


def test_a_decode_step_repeats_as_it_ran_first():
    torch.manual_seed(0)
    step = decode_step(SPEC, DecodeShape(2, 6, 3), "fp32", "cpu")
    run, keys = step.call(step.model.__call__), step.cache.layers[0].keys
    assert step.cache_len in (6 + 3 - 1, 6 + 3)  # as generate() sizes it (by version)
    with torch.no_grad():
        first, again = run().logits.clone(), run().logits.clone()
        assert torch.equal(first, again) and keys[:, :, 6].abs().sum() > 0 and keys[:, :, 7].abs().sum() == 0
        step.model(**step.kwargs)  # not reset: a static cache writes the next position
    assert keys[:, :, 7].abs().sum() > 0


def test_tune_model_decode_lists_the_attention_over_generates_cache():
    cache_len = decode_step(SPEC, DecodeShape(3, 20, 5), "fp32", "cpu", "empty").cache_len
    result = CliRunner().invoke(cli, ["tune-model", "--model", SPEC, "--decode", "3,20,5", "--dtype", "fp32",
                                      "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f"attention 3x4 q1 k{cache_len} d8 fp32" in result.output and "gated silu 3x48x32" in result.output


@pytest.mark.parametrize("args, message", [
    (["--decode", "0,5"], "bad --decode '0,5'"),
    (["--decode", "2,5,1"], "at least 2 new tokens"),
    (["--decode", "2,5", "--input-shape", "2,1,32"], "give --input-shape"),
    ([], "give --input-shape"),
    (["--decode", "2,5", "--model", "tests/helpers/models.py:mlp"], "needs a transformers causal LM"),
])
def test_bad_decode_input_is_one_line_and_exit_code_2(args, message):
    model = [] if "--model" in args else ["--model", SPEC]
    result = CliRunner().invoke(cli, ["tune-model", *model, *args, "--dry-run"])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
