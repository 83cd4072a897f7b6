import numpy as np
import pytest

from collabalign.data import GLUE_TASKS, glue_metric, glue_path, load_glue
from tests.data.helpers import MNLI_HEAD, mnli_row, write

# Tiny files in each task's original layout, with the quirks of the real ones: stray quotes, a BOM (MRPC), no
# header (CoLA), trailing spaces (SST-2), ten columns (STS-B), twelve (MNLI train).
FILES = {
    "SST-2": "sentence\tlabel\nit 's a \"charming\" film . \t1\nbleak and desperate \t0\n",
    "MRPC": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    '1\t11\t12\tHe said " no " .\tHe said no .\n0\t21\t22\tIt rained .\tIt was sunny .\n',
    "RTE": "index\tsentence1\tsentence2\tlabel\n0\tA cat sat.\tAn animal sat.\tentailment\n"
    "1\tA dog ran.\tA cat flew.\tnot_entailment\n",
    "CoLA": "gj04\t1\t\tThe sailors rode the breeze.\ngj04\t0\t*\tThe rope stretched the weights over.\n",
    "STS-B": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA man dances.\tA man is dancing.\t4.750\n"
    "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA cat eats.\tA plane flies.\t0.000\n",
    "QNLI": "index\tquestion\tsentence\tlabel\n0\tWho sat?\tThe cat sat.\tentailment\n"
    "1\tWhat \"flew\"?\tIt rained.\tnot_entailment\n",
    "QQP": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n7\t1\t2\tHow do I cook rice?\tHow to cook rice?\t1\n"
    "8\t3\t4\tWhy is the sky blue?\tWhat is 2+2?\t0\n",
    "MNLI": MNLI_HEAD + "label1\tgold_label\n" + mnli_row(0, "A man sleeps.", "A person rests.", *["entailment"] * 2)
    + mnli_row(1, "A man sleeps.", "A man runs.", *["contradiction"] * 2),
}
EXPECTED = {
    "SST-2": (["it 's a \"charming\" film .", "bleak and desperate"], None, [1, 0], 2, "accuracy"),
    "MRPC": (['He said " no " .', "It rained ."], ["He said no .", "It was sunny ."], [1, 0], 2, "accuracy"),
    "RTE": (["A cat sat.", "A dog ran."], ["An animal sat.", "A cat flew."], [0, 1], 2, "accuracy"),
    "CoLA": (["The sailors rode the breeze.", "The rope stretched the weights over."], None, [1, 0], 2, "matthews"),
    "STS-B": (["A man dances.", "A cat eats."], ["A man is dancing.", "A plane flies."], [4.75, 0.0], 1, "pearson"),
    "QNLI": (["Who sat?", 'What "flew"?'], ["The cat sat.", "It rained."], [0, 1], 2, "accuracy"),
    "QQP": (["How do I cook rice?", "Why is the sky blue?"], ["How to cook rice?", "What is 2+2?"], [1, 0], 2,
            "accuracy"),
    "MNLI": (["A man sleeps.", "A man sleeps."], ["A person rests.", "A man runs."], [0, 2], 3, "accuracy"),
}


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_each_layout(tmp_path, task):
    (tmp_path / task).mkdir()
    write(tmp_path / task / "train.tsv", FILES[task])
    data = load_glue(task, "train", tmp_path)
    text_a, text_b, labels, num_labels, metric = EXPECTED[task]
    assert (data.text_a, data.text_b, data.num_labels, data.metric, data.task) == (
        text_a, text_b, num_labels, metric, task
    )
    assert data.labels.dtype == (np.float32 if task == "STS-B" else np.int64)
    np.testing.assert_array_equal(data.labels, np.asarray(labels, data.labels.dtype))
    assert len(data) == 2


def test_mnli_dev_is_dev_matched_with_five_annotator_labels(tmp_path):
    (tmp_path / "MNLI").mkdir()
    assert glue_path("MNLI", "dev", tmp_path) == tmp_path / "MNLI" / "dev_matched.tsv"
    assert glue_path("RTE", "dev", tmp_path) == tmp_path / "RTE" / "dev.tsv"
    labels = "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
    write(tmp_path / "MNLI" / "dev_matched.tsv", MNLI_HEAD + labels
          + mnli_row(0, "A dog barks.", "An animal barks.", "entailment", "entailment", "neutral", "entailment",
                     "entailment", "entailment")
          + mnli_row(1, "A dog barks.", "The dog is loud.", *["neutral"] * 6)
          + mnli_row(2, "A dog barks.", "A cat meows.", *["contradiction"] * 6))
    data = load_glue("MNLI", "dev", tmp_path)
    assert (data.text_b, data.num_labels, data.metric) == (["An animal barks.", "The dog is loud.", "A cat meows."],
                                                          3, "accuracy")
    np.testing.assert_array_equal(data.labels, [0, 1, 2])


def test_unknown_task_and_split(tmp_path):
    expected = "unknown GLUE task 'WNLI'; expected one of CoLA, SST-2, MRPC, RTE, STS-B, QNLI, QQP, MNLI"
    with pytest.raises(ValueError, match=expected):
        load_glue("WNLI", "dev", tmp_path)
    with pytest.raises(ValueError, match="unknown GLUE split 'test'"):
        load_glue("RTE", "test", tmp_path)


def test_metrics_by_hand():
    assert glue_metric("RTE", np.array([0, 1, 1, 0]), np.array([0, 1, 0, 0])) == 0.75
    # tp=2, fp=1, tn=2, fn=0: (2*2 - 1*0) / sqrt(3*2*2*3) = 2/3
    assert glue_metric("CoLA", np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 0, 1])) == pytest.approx(2 / 3)
    assert glue_metric("CoLA", np.ones(4, np.int64), np.array([1, 0, 1, 0])) == 0.0  # undefined -> 0
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=50), rng.normal(size=50)
    assert glue_metric("STS-B", x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert glue_metric("STS-B", np.ones(3), np.array([1.0, 2.0, 3.0])) == 0.0
    with pytest.raises(ValueError, match="must be equal"):
        glue_metric("SST-2", np.zeros(3), np.zeros(4))


def test_matthews_matches_sklearn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    preds, labels = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    assert glue_metric("CoLA", preds, labels) == pytest.approx(metrics.matthews_corrcoef(labels, preds))
