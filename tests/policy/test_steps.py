import pytest
import torch

from collabalign.policy import dpo_loss, rloo_advantages


def test_dpo_loss_is_log2_at_a_zero_margin_and_falls_as_the_margin_grows():
    zero = torch.zeros(2)
    losses, margin = dpo_loss(zero, zero, zero, zero, beta=0.1)
    torch.testing.assert_close(losses, torch.full((2,), 0.6931), atol=1e-4, rtol=0)
    pi_c, pi_r, ref_c, ref_r = (torch.tensor([x]) for x in (-1.0, -5.0, -2.0, -3.0))
    losses, margin = dpo_loss(pi_c, pi_r, ref_c, ref_r, 0.5)
    assert float(margin) == pytest.approx(0.5 * (1.0 - (-2.0))) and float(losses) < 0.6931



def test_rloo_advantages_leave_one_out():
    adv = rloo_advantages(torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 6.0]), k=3)
    torch.testing.assert_close(adv, torch.tensor([1 - 2.5, 2 - 2.0, 3 - 1.5, 0 - 3.0, 0 - 3.0, 6 - 0.0]))
