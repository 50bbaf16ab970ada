"""Classification scores for member predictions, and expert-utilisation statistics of MoE routing.

Inputs are numpy arrays: ``probs`` (N, K) predictive probabilities (the mean over ensemble members),
``member_probs`` (M, N, K), ``labels`` (N,) ints. ROC quantities use scikit-learn's ``roc_curve``.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

ECE_BINS = 15


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of samples whose arg-max class is the label."""
    return float(np.mean(probs.argmax(axis=1) == labels))


def nll(probs: np.ndarray, labels: np.ndarray, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood −ln p(label) in nats (probabilities clipped at ``eps``)."""
    return float(-np.mean(np.log(np.clip(probs[np.arange(len(labels)), labels], eps, None))))


def brier(probs: np.ndarray, labels: np.ndarray) -> float:
    """Multi-class Brier score Σ_k (p_k − 1[k = label])², averaged over samples (range 0..2)."""
    onehot = np.eye(probs.shape[1])[labels]
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def ece(probs: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error with ``bins`` equal-width confidence bins (default 15):
    Σ_b (n_b/N)·|accuracy_b − mean confidence_b|, bins (i/B, (i+1)/B], confidence = max probability."""
    conf = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    which = np.clip(np.ceil(conf * bins).astype(int) - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        sel = which == b
        if sel.any():
            total += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    return float(total)


def member_diversity_kl(member_probs: np.ndarray, eps: float = 1e-12) -> float:
    """Mean pairwise KL(p_i ‖ p_j) over ordered member pairs i ≠ j and samples (E³ paper); 0 for M = 1."""
    m = member_probs.shape[0]
    if m < 2:
        return 0.0
    logp = np.log(np.clip(member_probs, eps, None))
    total = [np.mean(np.sum(member_probs[i] * (logp[i] - logp[j]), axis=1))
             for i in range(m) for j in range(m) if i != j]
    return float(np.mean(total))


def ood_scores(probs_in: np.ndarray, probs_out: np.ndarray) -> dict[str, float]:
    """Out-of-distribution detection with the max softmax probability (MSP) of the mean prediction.

    In-distribution is the positive class, score = MSP. Returns AUROC and the false-positive rate
    (OOD accepted) at the first threshold reaching 95 % true-positive rate.
    """
    score = np.concatenate([probs_in.max(axis=1), probs_out.max(axis=1)])
    truth = np.concatenate([np.ones(len(probs_in)), np.zeros(len(probs_out))])
    fpr, tpr, _ = roc_curve(truth, score)
    return {"ood_auroc": float(roc_auc_score(truth, score)), "ood_fpr95": float(fpr[np.argmax(tpr >= 0.95)])}


def classification_scores(member_probs: np.ndarray, labels: np.ndarray,
                          ood_member_probs: np.ndarray | None = None) -> dict[str, float]:
    """All scores for (M, N, K) member probabilities: prediction = mean over members."""
    probs = member_probs.mean(axis=0)
    out = {"accuracy": accuracy(probs, labels), "nll": nll(probs, labels), "ece": ece(probs, labels),
           "brier": brier(probs, labels), "diversity_kl": member_diversity_kl(member_probs)}
    if ood_member_probs is not None:
        out.update(ood_scores(probs, ood_member_probs.mean(axis=0)))
    return out


def expert_class_matrix(gates: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(E, K) mean gate weight of each expert over the samples of each class; ``gates`` (N, E)."""
    out = np.zeros((gates.shape[1], num_classes))
    for c in range(num_classes):
        sel = labels == c
        if sel.any():
            out[:, c] = gates[sel].mean(axis=0)
    return out


def utilisation(gates: np.ndarray, dead_threshold: float = 0.01) -> dict[str, float]:
    """Expert utilisation of (N, E) sparse gate weights (CNN-MoE paper, Table I).

    cv_samples: CV of the number of samples routed to each expert; cv_importance: CV of Σ gate weight;
    alive: experts whose mean importance share is ≥ ``dead_threshold`` (1 %).
    """
    samples = (gates > 0).sum(axis=0).astype(float)
    importance = gates.sum(axis=0)
    share = importance / max(importance.sum(), 1e-12)

    def cv(v: np.ndarray) -> float:
        return float(v.std() / v.mean()) if v.mean() > 0 else float("nan")

    return {"cv_samples": cv(samples), "cv_importance": cv(importance), "alive": int((share >= dead_threshold).sum()),
            "experts": int(gates.shape[1])}
