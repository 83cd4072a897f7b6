"""The paper's baselines (spec §3.5) and the two the spec adds, on the LM-head policy of `text.py`, one module each:
SFT, PPO on training-domain prompts (TR) or training plus target prompts (TR+TE) with a BT reward model, DPO, HPL,
BT reward model + reward-weighted regression, and the oracle (reward-weighted regression on the judge)."""

from collabalign.methods.meta_reward.baselines.bt_rwr import bt_rewards, bt_rwr
from collabalign.methods.meta_reward.baselines.dpo import dpo
from collabalign.methods.meta_reward.baselines.hpl import hpl
from collabalign.methods.meta_reward.baselines.oracle import oracle
from collabalign.methods.meta_reward.baselines.ppo import ppo
from collabalign.methods.meta_reward.baselines.sft import sft

__all__ = ["bt_rewards", "bt_rwr", "dpo", "hpl", "oracle", "ppo", "sft"]
