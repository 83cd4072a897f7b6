"""The loaders on the real files in ../shared/data (skipped where that folder is absent)."""

import pytest

from collabalign.data import DataError, load_glue, load_hh_rlhf
from tests.data.helpers import SHARED, needs_shared_data

pytestmark = needs_shared_data

# Data rows per dev file. CoLA dev has 1,043 rows (as the hub's cola validation split): its last line has no
# trailing newline, so `wc -l` (and the shared README) say 1,042.
DEV_ROWS = {"SST-2": 872, "MRPC": 408, "RTE": 277, "CoLA": 1043, "STS-B": 1500}


@pytest.mark.parametrize("task", DEV_ROWS)
def test_glue_dev_sets(task):
    data = load_glue(task, "dev", SHARED / "glue")
    assert len(data) == len(data.labels) == DEV_ROWS[task]
    assert data.text_b is None or len(data.text_b) == len(data)


def test_hh_rlhf_harmless_test():
    path = SHARED / "hh-rlhf" / "harmless-base-test.jsonl.gz"
    pairs = load_hh_rlhf(path, drop_invalid=True)
    # 2,312 rows: 4 end in an empty final reply and 5 have a chosen reply that itself contains "\n\nAssistant:"
    # (so the last-turn split gives a different prompt); both kinds are counted, not hidden.
    assert len(pairs) + sum(pairs.dropped.values()) == 2312
    assert pairs.dropped == {"chosen: empty text": 4, "rejected: prompt differs from chosen's": 5}
    assert {p.attributes["topic"] for p in pairs} == {"violence", "drugs", "crime", "sex", "hate", "other"}
    with pytest.raises(DataError, match=r"harmless-base-test.jsonl.gz:87: field 'chosen': empty text"):
        load_hh_rlhf(path)

