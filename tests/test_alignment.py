"""Products do not depend on where a tensor's memory lies (MKL's strict mode, set by importing collabalign): without
it, F.linear on float32 inputs read from numpy at 12 of 16 offsets differs in the last bits for these shapes, which
made a deployed node's adapters differ from the simulator's now and then."""

import os
import subprocess
import sys

CHECK = """
import collabalign
import numpy as np, torch
torch.manual_seed(0)
differ = 0
for n, k, m in [(8, 64, 4), (5, 384, 2), (24, 576, 8), (3, 8, 576)]:
    x, w = torch.randn(n, k), torch.randn(m, k)
    reference = torch.nn.functional.linear(x, w)
    memory = np.zeros(n * k + 16, dtype=np.float32)
    for offset in range(16):
        moved = memory[offset:offset + n * k].reshape(n, k)
        moved[:] = x.numpy()
        differ += not torch.equal(torch.nn.functional.linear(torch.from_numpy(moved), w), reference)
print(differ)
"""


def test_a_product_is_the_same_wherever_its_input_lies_in_memory():
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "0"
