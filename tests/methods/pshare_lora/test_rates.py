"""The learning rate each optimiser step of `train` actually applies under P-ShareLoRA's schedules, read from the
optimiser as every step starts and compared with the rates worked out by hand for a 10-step budget."""

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from collabalign.experiments.pshare_lora.problems.synthetic import ProblemConfig, generate, model_for
from collabalign.methods.pshare_lora import prepare, schedule, train

SMALL = ProblemConfig(d1=6, d2=4, users=3, k=2, n_train=5, n_test=5)
LR = 0.03
DECAY = [LR * (1 - t / 10) for t in range(10)]  # linear: the rate at step t of 10, down towards 0

RATES = {  # (method, linear) -> the rate of each of the 10 steps
    ("global", False): [LR] * 10,
    ("pshare_si", True): DECAY,
    ("pshare_wu", True): DECAY,  # 1 warm-up step, then the same decay goes on through the switch
    ("pshare_g", True): DECAY[:7] + [LR / 3 * (1 - t / 3) for t in range(3)],  # 7 global steps, then lr/3 down to 0
    ("pshare_g", False): [LR] * 7 + [LR / 3] * 3,
}


def applied_rates(method: str, linear: bool) -> list[float]:
    """The learning rate in the optimiser at each step of a 10-step `train` of `method` on the bilinear problem."""
    truth, data, _ = generate(SMALL, 0)
    net = model_for(truth, 2)
    g = torch.Generator().manual_seed(0)
    prepare(net, method, SMALL.users, g)
    rates: list[float] = []
    hook = register_optimizer_step_pre_hook(lambda opt, args, kwargs: rates.append(opt.param_groups[0]["lr"]))
    try:
        train(net, data, schedule(method, 1, 10, LR, linear), SMALL.users, 0, g)
    finally:
        hook.remove()
    return rates


@pytest.mark.parametrize(("method", "linear"), list(RATES), ids=[f"{m}-{'linear' if lin else 'constant'}"
                                                                 for m, lin in RATES])
def test_each_step_applies_the_scheduled_rate(method, linear):
    assert applied_rates(method, linear) == pytest.approx(RATES[method, linear], rel=1e-12)
