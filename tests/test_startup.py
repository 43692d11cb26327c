"""tests/startup/sitecustomize.py, the start of the suite's tool processes: scikit-learn and scipy.stats load when
fairseq first uses them, and what fairseq computes with them is unchanged."""
import json
import subprocess
import sys

import numpy as np
from scipy import stats
from sklearn import metrics

from tests.conftest import tool_env

PROBE = """
import json, sys
import fairseq, palm_plugin
loaded_at_start = {name: getattr(sys.modules.get(name), "__file__", None) is not None
                   for name in ("sklearn", "sklearn.metrics", "scipy.stats")}
import numpy as np
from fairseq.criterions.sentence_prediction import acc_and_f1, matthews_corrcoef, pearson_and_spearman
import fairseq.tasks.audio_classification as audio
from scipy.stats import norm
preds, labels = np.array([1, 0, 1, 1, 0, 1]), np.array([1, 0, 0, 1, 1, 1])
print(json.dumps({"loaded_at_start": loaded_at_start, "f1": acc_and_f1(preds, labels)["f1"],
                  "mcc": matthews_corrcoef(preds, labels),
                  "spearman": pearson_and_spearman(preds * 1.0, labels * 1.0)["spearmanr"],
                  "auc": float(audio.sklearn_metrics.roc_auc_score(labels, preds)), "norm": float(norm.cdf(1.0)),
                  "real": [getattr(sys.modules[n], "__file__", None) is not None for n in ("sklearn.metrics",
                                                                                           "scipy.stats")]}))
"""


def test_tool_processes_defer_sklearn_and_scipy_stats_and_compute_the_same():
    result = subprocess.run([sys.executable, "-c", PROBE], env=tool_env(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["loaded_at_start"] == {"sklearn": False, "sklearn.metrics": False, "scipy.stats": False}
    preds, labels = np.array([1, 0, 1, 1, 0, 1]), np.array([1, 0, 0, 1, 1, 1])
    assert out["f1"] == metrics.f1_score(labels, preds)
    assert out["mcc"] == metrics.matthews_corrcoef(labels, preds)
    assert out["spearman"] == stats.spearmanr(preds, labels)[0]
    assert out["auc"] == metrics.roc_auc_score(labels, preds) and out["norm"] == stats.norm.cdf(1.0)
    assert out["real"] == [True, True]
