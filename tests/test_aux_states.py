"""engine/decoding/aux_states.py: the aux hidden states an EAGLE-3 head reads, captured by pre-hooks on the decoder
layers read, equal transformers' `hidden_states[i]` (what output_hidden_states=True returns) bit for bit, in every model
family the engine decodes and through the batched cache the loop uses (padded rows, a KV cache); a model whose layers
cannot be found falls back to output_hidden_states and still answers the same."""

import pytest
import torch

from engine.decoding.aux_states import AuxStates
from engine.decoding.batched_cache import BatchCache
from tests import tiny_models as tm
from tests.test_engine_sliding import FAMILIES, build

IDS = [3, 1, 2]  # out of order on purpose: the states come in the order asked


def reference(model, ids, **kwargs):
    out = model(output_hidden_states=True, **kwargs)
    return torch.cat([out.hidden_states[i] for i in IDS], -1)


@pytest.mark.parametrize("family", ["llama", *FAMILIES])
def test_hooked_states_equal_output_hidden_states(family):
    model = (tm.llama(0, layers=4) if family == "llama" else build(family)).eval()
    ids = torch.randint(1, 64, (2, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # a left-padded row
    with torch.no_grad(), AuxStates(model, IDS) as aux:
        model(input_ids=ids, attention_mask=mask, **aux.kwargs)
    assert aux.hooked, family  # every family here has findable decoder layers: no output_hidden_states at all
    with torch.no_grad():
        want = reference(model, IDS, input_ids=ids, attention_mask=mask)
        assert torch.equal(aux.states(), want)
    assert not any(layer._forward_pre_hooks for layer in aux.layers)  # the hooks go with the `with`


def test_batched_cache_forward_returns_the_same_states_step_by_step():
    """Through BatchCache (the loop's verify forward): a prefill then two steps with a cache equal one full forward."""
    model = tm.llama(1, layers=4).eval()
    lm = BatchCache(model, 64)
    lm.reset(2)
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    valid = torch.ones_like(ids, dtype=torch.bool)
    parts = []
    with torch.no_grad():
        for lo, hi in ((0, 8), (8, 11), (11, 12)):
            _, states = lm.forward(ids[:, lo:hi], valid[:, lo:hi], hidden_layers=IDS)
            parts.append(states)
        want = reference(model, IDS, input_ids=ids)
    assert torch.allclose(torch.cat(parts, 1), want, atol=1e-5)


def test_a_model_without_findable_layers_is_read_through_output_hidden_states():
    model = tm.gpt2(0, layers=4).eval()  # GPT-2 keeps its blocks in `.h`: no get_decoder().layers
    ids = torch.randint(1, 64, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), AuxStates(model, IDS) as aux:
        out = model(input_ids=ids, **aux.kwargs)
    assert not aux.hooked and aux.kwargs == {"output_hidden_states": True}
    with torch.no_grad():
        assert torch.equal(aux.states(out), reference(model, IDS, input_ids=ids))


def test_an_id_past_the_layers_falls_back_rather_than_reading_no_layer():
    """transformers' hidden_states[L] is after the final norm, no layer's input: not hooked, read as transformers
    gives it."""
    model = tm.llama(0, layers=4).eval()
    aux = AuxStates(model, [1, 4])
    assert not aux.hooked
