"""Evaluation metrics of the FedAPA paper (Section VI-D): accuracy, macro-F1, MAE."""

from __future__ import annotations

import numpy as np


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(y_true == y_pred)) if len(y_true) else 0.0


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the labels seen in y_true or y_pred."""
    labels = np.union1d(y_true, y_pred)
    if not len(labels):
        return 0.0
    scores = []
    for label in labels:
        tp = np.sum((y_pred == label) & (y_true == label))
        fp = np.sum((y_pred == label) & (y_true != label))
        fn = np.sum((y_pred != label) & (y_true == label))
        denom = 2 * tp + fp + fn
        scores.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(scores))


def mean_absolute_error(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """For crowd counting the class index is the head count, so MAE is in people."""
    return (
        float(np.mean(np.abs(y_true.astype(np.int64) - y_pred.astype(np.int64))))
        if len(y_true)
        else 0.0
    )


def classification_report(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    return {
        "accuracy": accuracy(y_true, y_pred),
        "f1": macro_f1(y_true, y_pred),
        "mae": mean_absolute_error(y_true, y_pred),
    }
