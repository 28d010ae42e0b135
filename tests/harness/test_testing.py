"""The public graph-safety harness in graphshard.harness.testing."""

from __future__ import annotations

import pytest
import torch

import graphshard.harness.testing as gt
from graphshard.harness.testing import GraphSafetyError, assert_replay_equals_eager, check_graph_safe

ROWS, VOCAB = 8, 32


def _static():
    inputs = {
        "logits": torch.zeros(ROWS, VOCAB),
        "temperature": torch.ones(ROWS),
        "n": torch.zeros(1, dtype=torch.int64),
    }
    outputs = {"tokens": torch.zeros(ROWS, dtype=torch.int64), "max_logit": torch.zeros(ROWS)}
    return inputs, outputs


def _make_inputs(i):
    g = torch.Generator().manual_seed(100 + i)
    return {
        "logits": torch.randn(ROWS, VOCAB, generator=g),
        "temperature": torch.rand(ROWS, generator=g) + 0.5,
        "n": torch.tensor([i % (ROWS + 1)]),
    }


def safe_step(inputs, outputs):
    """Greedy pick over the first n rows; padding rows get -1, with n kept on the device."""
    scaled = inputs["logits"] / inputs["temperature"][:, None]
    best, token = scaled.max(dim=-1)
    valid = torch.arange(ROWS) < inputs["n"]
    outputs["tokens"].copy_(torch.where(valid, token, -1))
    outputs["max_logit"].copy_(torch.where(valid, best, 0.0))


def unsafe_step(inputs, outputs):
    """The same step sliced by a host copy of n: eager-correct, wrong inside a graph."""
    n = int(inputs["n"][0])
    outputs["tokens"].fill_(-1)
    outputs["tokens"][:n].copy_(inputs["logits"][:n].argmax(dim=-1))


def test_safe_step_replays_equal_eager():
    inputs, outputs = _static()
    graph = assert_replay_equals_eager(_make_inputs, safe_step, inputs, outputs, num_sets=24)
    assert graph.num_replays == 24
    assert any(op.name == "torch.Tensor.max" for op in graph.trace)


def test_unsafe_user_step_is_caught():
    inputs, outputs = _static()
    with pytest.raises(GraphSafetyError, match=r"torch\.Tensor\.__int__ inside a graph-captured step"):
        assert_replay_equals_eager(_make_inputs, unsafe_step, inputs, outputs)


def test_graph_that_diverges_from_eager_is_reported():
    """Outputs are compared: a step updating state it keeps across replays runs twice and differs."""
    inputs, outputs = _static()
    step_count = torch.zeros(1)

    def counting_step(ins, outs):
        safe_step(ins, outs)
        step_count.add_(1)
        outs["max_logit"].add_(step_count)

    with pytest.raises(AssertionError, match="input set 0: output 'max_logit' differs between graph replay"):
        assert_replay_equals_eager(_make_inputs, counting_step, inputs, outputs, num_sets=4,
                                   extra_static={"step_count": step_count})


def test_check_graph_safe_catches_host_state_between_replays():
    inputs, outputs = _static()
    state = {"rows": 4}

    def step():
        outputs["tokens"][: state["rows"]].copy_(inputs["logits"][: state["rows"]].argmax(dim=-1))

    def grow(i):
        state["rows"] = 4 + i

    check_graph_safe(step, {**inputs, **outputs}, replays=1, before_replay=grow)
    with pytest.raises(GraphSafetyError, match="replay differs from the capture"):
        check_graph_safe(step, {**inputs, **outputs}, replays=3, before_replay=grow)


def test_check_graph_safe_refuses_fresh_outputs():
    inputs, _ = _static()
    with pytest.raises(GraphSafetyError, match="fresh allocation"):
        check_graph_safe(lambda: inputs["logits"].softmax(-1), list(inputs.values()))


def test_check_graph_safe_passes_safe_step_and_returns_trace():
    inputs, outputs = _static()
    for name, value in _make_inputs(3).items():
        inputs[name].copy_(value)
    graph = check_graph_safe(lambda: safe_step(inputs, outputs), [*inputs.values(), *outputs.values()], replays=50)
    assert graph.num_replays == 50
    assert outputs["tokens"][3:].eq(-1).all()


def test_bad_make_inputs_is_a_clear_error():
    inputs, outputs = _static()
    with pytest.raises(ValueError, match=r"make_inputs\(0\)\['logits'\] has shape \(4, 32\)"):
        assert_replay_equals_eager(lambda i: {**_make_inputs(i), "logits": torch.zeros(4, VOCAB)},
                                   safe_step, inputs, outputs)
    with pytest.raises(ValueError, match="did not produce input"):
        assert_replay_equals_eager(lambda i: {"n": torch.tensor([1])}, safe_step, inputs, outputs)


def test_module_documents_usage():
    assert "Example::" in gt.__doc__
    assert set(gt.__all__) == {"GraphSafetyError", "assert_replay_equals_eager", "check_graph_safe"}


def test_docstring_example_runs():
    """The usage example in the module docstring is real code."""
    example = gt.__doc__.split("Example::", 1)[1].split("\n\n", 1)[1]
    lines = []
    for line in example.splitlines():
        if line.strip() and not line.startswith("    "):
            break
        lines.append(line[4:])
    exec(compile("\n".join(lines), "<graphshard.harness.testing example>", "exec"), {})
