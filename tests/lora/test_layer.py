import copy

import pytest
import torch
from torch import nn

from collabalign.lora import Blocks, LoRALinear, inject_lora, lora_layers, routed


def make_layer(parties_a=None, parties_b=None, rank=8, seed=0):
    torch.manual_seed(seed)
    layer = LoRALinear(nn.Linear(12, 10), rank, alpha=16, parties_a=parties_a, parties_b=parties_b)
    with torch.no_grad():
        layer.B.normal_()  # non-zero B so every path is exercised
    return layer


def test_sliced_rank_gradients_equal_masked_reference():
    layer = make_layer().double()
    x = torch.randn(5, 3, 12, dtype=torch.float64)
    idx = torch.tensor([1, 4, 6])
    layer.route(rank_idx=idx)
    layer(x).square().sum().backward()
    ga, gb = layer.A.grad.clone(), layer.B.grad.clone()
    assert layer.scale == pytest.approx(16 / 8 * 8 / 3)

    A = layer.A.detach().clone().requires_grad_()
    B = layer.B.detach().clone().requires_grad_()
    mask = torch.zeros(8, dtype=torch.float64)
    mask[idx] = 1
    ref = layer.base(x) + (16 / 8) * (8 / 3) * (x @ (A * mask[:, None]).T) @ (B * mask[None, :]).T
    ref.square().sum().backward()
    torch.testing.assert_close(ga, A.grad)
    torch.testing.assert_close(gb, B.grad)
    outside = torch.tensor([i for i in range(8) if i not in idx.tolist()])
    assert ga[outside].abs().max() == 0 and gb[:, outside].abs().max() == 0


@pytest.mark.parametrize("pa, pb", [(4, 4), (None, 4), (4, None)])
@pytest.mark.parametrize("sliced", [False, True])
def test_per_sample_routing_equals_each_party_alone(pa, pb, sliced):
    layer = make_layer(pa, pb)
    with torch.no_grad():
        layer.A.normal_()
    x = torch.randn(9, 3, 12)
    party = torch.tensor([0, 3, 1, 1, 2, 0, 3, 2, 2])
    idx = torch.tensor([0, 2, 5]) if sliced else None
    layer.route(party, idx)
    mixed = layer(x)
    for p in range(4):
        layer.route(p, idx)
        alone = layer(x[party == p])
        torch.testing.assert_close(mixed[party == p], alone)


@pytest.mark.parametrize("pa, pb", [(4, 4), (None, 4), (4, None)])
def test_per_sample_routing_gradients_equal_the_sum_over_parties_alone(pa, pb):
    layer = make_layer(pa, pb).double()
    x = torch.randn(9, 3, 12, dtype=torch.float64)
    party = torch.tensor([0, 3, 1, 1, 2, 0, 3, 2, 2])  # unsorted, party 1 twice in a row
    weights = torch.linspace(-1, 1, 9 * 3 * 10, dtype=torch.float64).view(9, 3, 10)
    layer.route(party)
    (layer(x) * weights).sum().backward()
    mixed = layer.A.grad.clone(), layer.B.grad.clone()
    layer.zero_grad()
    for p in range(4):
        layer.route(p)
        (layer(x[party == p]) * weights[party == p]).sum().backward()
    torch.testing.assert_close(mixed, (layer.A.grad, layer.B.grad), rtol=0, atol=1e-12)


@pytest.mark.parametrize("pa, pb", [(4, 4), (None, 4), (4, None)])
@pytest.mark.parametrize("sliced", [False, True])
def test_block_routing_equals_row_routing_with_gradients(pa, pb, sliced):
    layer = make_layer(pa, pb).double()
    x = torch.randn(2 * 4 * 3, 5, 12, dtype=torch.float64)  # 2 runs of 4 party blocks of 3 rows
    party = torch.arange(4).repeat_interleave(3).repeat(2)
    idx = torch.tensor([0, 2, 5]) if sliced else None
    grads = []
    for routing in (party, Blocks(4, repeats=2)):
        layer.zero_grad()
        layer.route(routing, idx)
        y = layer(x)
        (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
        grads.append((y.detach(), layer.A.grad.clone(), layer.B.grad.clone()))
    for by_row, by_block in zip(*grads, strict=True):
        torch.testing.assert_close(by_block, by_row)


def test_float32_factors_on_a_bfloat16_base_keep_the_base_dtype_and_train_in_float32():
    layer = make_layer(4, None)
    layer.base.to(torch.bfloat16)
    x = torch.randn(6, 12, dtype=torch.bfloat16)
    layer.route(torch.tensor([0, 1, 2, 3, 0, 1]))
    y = layer(x)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and layer.A.grad.dtype == layer.B.grad.dtype == torch.float32
    with torch.no_grad():
        update = torch.einsum("or,nri,ni->no", layer.B, layer.A[layer.party], x.float())
        expected = layer.base(x) + (layer.scale * update).to(torch.bfloat16)
    torch.testing.assert_close(y, expected)


def test_blocks_must_match_the_party_count():
    layer = make_layer(parties_a=3)
    layer.route(Blocks(4))
    with pytest.raises(ValueError, match="3 parties but the rows are in blocks of 4"):
        layer(torch.randn(8, 12))


def test_routing_without_party_is_a_clear_error():
    layer = make_layer(parties_a=3)
    with pytest.raises(ValueError, match="no party was routed"):
        layer(torch.randn(2, 12))


@pytest.mark.parametrize("pb", [None, 3])
def test_merge_keeps_function_and_clears_adapter(pb):
    layer = make_layer(parties_b=pb)
    x = torch.randn(4, 12)
    party = None if pb is None else 1
    layer.route(party)
    before = layer(x)
    layer.merge_(party)
    torch.testing.assert_close(layer(x), before)
    layer.enabled = False
    torch.testing.assert_close(layer(x), before)  # the base alone now carries the adapter
    B = layer.B[party] if pb else layer.B
    assert B.abs().max() == 0


def test_inject_and_route_by_name():
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
    ref = copy.deepcopy(model)
    layers = inject_lora(model, ["0"], rank=2)
    assert list(layers) == ["0"] and isinstance(model[0], LoRALinear) and isinstance(model[2], nn.Linear)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["0.A", "0.B"]
    x = torch.randn(3, 6)
    torch.testing.assert_close(model(x), ref(x))  # B = 0 at init
    with routed(model, rank_idx={"0": torch.tensor([1])}):
        assert lora_layers(model)["0"].active_rank == 1
    assert lora_layers(model)["0"].active_rank == 2
    with pytest.raises(ValueError, match="no linear layer of the model matches"):
        inject_lora(ref, ["query"], rank=2)


def test_set_factors_trains_a_copy_with_the_given_scale():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(6, 5), rank=8)
    A, B = torch.randn(3, 6), torch.randn(5, 3)
    layer.set_factors(A, B, scale=0.7)
    x = torch.randn(4, 6)
    torch.testing.assert_close(layer(x), layer.base(x) + 0.7 * x @ A.T @ B.T)
    layer(x).sum().backward()
    with torch.no_grad():
        layer.A -= layer.A.grad
    assert not torch.equal(layer.A, A) and layer.rank == 3  # the caller's tensor is untouched
