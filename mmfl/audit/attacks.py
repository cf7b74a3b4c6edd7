"""Standard attacks of an honest-but-curious server, each on what the server received.

- :func:`label_inference` — the labels in a client's model update. For cross-entropy over a
  softmax, the gradient of the last layer's bias is ``mean_i (p_i - y_i)``: negative only for
  the classes present (iDLG, Zhao et al. 2020, sec. 3: for one sample the true class is the
  one entry of the opposite sign), so the update ``w_new - w_sent`` (minus the summed
  gradients) raises the bias of the classes the client holds most. With one sample the
  argmax is the label exactly (iDLG); with a batch, the ranking of the bias update estimates
  the client's label distribution (the batch-label idea of LLG, Wainakh et al. 2022, sec. 4,
  on the bias instead of the weight rows).
- :func:`invert_update` — gradient inversion (Geiping et al. 2020, "Inverting Gradients",
  eq. 4): dummy inputs ``x`` optimized (Adam) to maximize the cosine between the gradient
  of the model sent to the client at ``(x, y_hat)`` and the received direction
  ``-(w_new - w_sent)``, ``y_hat`` from :func:`label_inference`. Scored by the cosine of the
  reconstruction to the nearest of the client's rows (and a random input's, for chance).
- :func:`probe_rows` — per-sample arrays the server receives (PartialFL's shareable
  modality, split learning's cut activations): a ridge decoder to the private modality and
  a logistic-regression probe to the label, trained on auxiliary data the server can make
  the same way (the run's test split, stated), applied to the received rows.
- :func:`membership_auc` — loss-threshold membership inference (Yeom et al. 2018, sec. 4.2,
  the "threshold adversary"): score ``-CE(model(x), y)``, members = training rows, non-members
  = test rows; the ROC AUC (0.5 = no leak) and the advantage max(TPR - FPR).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


# ----------------------------------------------------------------------------- labels from an update

def classifier_keys(arrays: dict[str, Tensor], num_classes: int) -> tuple[str, str] | None:
    """``(weight key, bias key)`` of the last layer mapping to the ``num_classes`` logits among
    ``arrays`` (a model's tensors in state-dict order): the last ``X.weight [C, d]`` with an
    ``X.bias [C]``, preferring a key naming a classifier or head."""
    pairs = []
    for k, w in arrays.items():
        if k.endswith(".weight") and w.dim() == 2 and w.shape[0] == num_classes:
            b = k[: -len("weight")] + "bias"
            if b in arrays and arrays[b].shape == (num_classes,):
                pairs.append((k, b))
    if not pairs:
        return None
    named = [p for p in pairs if "classifier" in p[0] or "fc_out" in p[0]]
    return (named or pairs)[-1]


def bias_update(sent: dict[str, Tensor], reply: dict[str, Tensor], num_classes: int) -> Tensor | None:
    """``b_new - b_sent`` of the classifier's bias (float64), or None when the reply has none."""
    keys = classifier_keys(reply, num_classes)
    if keys is None or keys[1] not in sent:
        return None
    return reply[keys[1]].detach().double().cpu() - sent[keys[1]].detach().double().cpu()


def label_inference(delta_b: Tensor, counts: np.ndarray) -> dict:
    """What the bias update says of the client's labels ``counts`` ``[C]``: the predicted
    majority class (argmax; for a one-sample update the label itself, iDLG) and the Spearman
    rank correlation between the update and the true counts."""
    from scipy.stats import spearmanr

    d = delta_b.numpy()
    rho = float(spearmanr(d, counts).statistic) if np.ptp(d) > 0 and np.ptp(counts) > 0 else 0.0
    return {"predicted": int(np.argmax(d)), "majority": int(np.argmax(counts)),
            "hit": bool(int(np.argmax(d)) == int(np.argmax(counts))), "spearman": rho}


# ----------------------------------------------------------------------------- gradient inversion

def _loss_grads(model: nn.Module, params: dict[str, Tensor], buffers: dict[str, Tensor], x: dict[str, Tensor],
                y: Tensor) -> list[Tensor]:
    from torch.func import functional_call

    out = functional_call(model, {**params, **buffers}, (x,))
    logits = out["logits"] if isinstance(out, dict) else out
    loss = F.cross_entropy(logits, y)
    grads = torch.autograd.grad(loss, list(params.values()), create_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params.values())]  # unused: no signal


def invert_update(model: nn.Module, sent: dict[str, Tensor], reply: dict[str, Tensor], like: dict[str, Tensor],
                  label: int, steps: int = 300, lr: float = 0.1, seed: int = 0) -> dict[str, Tensor]:
    """Inputs (one sample, shapes of ``like`` ``{m: [1, ...]}``) whose loss gradient at the sent model
    points along ``-(reply - sent)`` (Geiping et al. 2020, eq. 4, cosine distance, no prior)."""
    model = model.eval()
    names = [n for n, _ in model.named_parameters()]
    keys = {n: k for n in names for k in (n, "model/" + n) if k in sent and k in reply}
    params = {n: sent[k].detach().float().clone().requires_grad_(True) for n, k in keys.items()}
    target = [-(reply[k].detach().float() - sent[k].detach().float()) for k in keys.values()]
    buffers = {n: sent[k].detach().float() if b.is_floating_point() else sent[k]
               for n, b in model.named_buffers() for k in (n, "model/" + n) if k in sent}
    if not keys:
        raise ValueError("the update holds none of the model's parameters")
    device = next(iter(params.values())).device  # the run's device: where the sent model lives
    model = model.to(device)
    g = torch.Generator().manual_seed(seed)  # drawn on the CPU (the same start on any device), then moved
    x = {m: torch.randn(t.shape, generator=g).to(device).requires_grad_(True) for m, t in like.items()}
    y = torch.tensor([label], device=device)
    opt = torch.optim.Adam(list(x.values()), lr=lr)
    tnorm = torch.sqrt(sum((t ** 2).sum() for t in target))
    for _ in range(steps):
        opt.zero_grad()
        grads = _loss_grads(model, params, buffers, x, y)
        dot = sum((a * b).sum() for a, b in zip(grads, target))
        gnorm = torch.sqrt(sum((a ** 2).sum() for a in grads)) + 1e-12
        loss = 1 - dot / (gnorm * tnorm)
        loss.backward()
        opt.step()
    return {m: v.detach() for m, v in x.items()}


def nearest_cosine(x: Tensor, rows: Tensor) -> float:
    """The largest cosine between ``x`` (one sample) and any of ``rows`` ``[n, ...]``."""
    a = x.reshape(1, -1).double().cpu()
    b = rows.reshape(len(rows), -1).double().cpu()
    return float(F.cosine_similarity(a, b, dim=1).max())


# ----------------------------------------------------------------------------- per-sample arrays

def probe_rows(aux_x: np.ndarray, aux_private: np.ndarray | None, aux_y: np.ndarray, got_x: np.ndarray,
               true_private: np.ndarray | None, true_y: np.ndarray, seed: int = 0) -> dict:
    """A server's decoders from per-sample arrays, fit on auxiliary rows (``aux_*``), scored on
    what it received (``got_x``) against the truth: label accuracy (logistic regression) next
    to the majority-class rate; the private modality's reconstruction (ridge): mean cosine to
    the true rows, next to the mean cosine of the auxiliary mean (what a server knows without
    the reply)."""
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler().fit(aux_x)
    clf = LogisticRegression(max_iter=2000, random_state=seed).fit(sc.transform(aux_x), aux_y)
    acc = float((clf.predict(sc.transform(got_x)) == true_y).mean())
    out = {"label_accuracy": acc, "label_chance": float(np.bincount(true_y).max() / len(true_y))}
    if aux_private is not None and true_private is not None:
        mean = aux_private.reshape(len(aux_private), -1).mean(0)
        rec = Ridge(alpha=1.0).fit(sc.transform(aux_x), aux_private.reshape(len(aux_private), -1))
        pred = rec.predict(sc.transform(got_x))
        # centred cosine: the reconstruction and the truth minus the auxiliary mean row (what a
        # server knows without the reply), so 0 = nothing beyond the average row, 1 = the row itself
        out["reconstruction_cosine"] = _mean_cos(pred - mean, true_private.reshape(len(true_private), -1) - mean)
    return out


def _mean_cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    num = (a * b).sum(1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12
    return float((num / den).mean())


# ----------------------------------------------------------------------------- membership

def per_sample_loss(model: nn.Module, data, max_rows: int = 2000, seed: int = 0,
                    keep: tuple[str, ...] | None = None) -> np.ndarray:
    """Cross-entropy of ``model`` on up to ``max_rows`` seeded rows of ``data`` (an ArrayDataset);
    ``keep``: only these modalities of the rows (and their ``present/`` / ``length/`` entries)."""
    n = len(data.label_array())
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_rows]
    x, y = data.get(rows)  # get moves the positions to the data's device
    if keep is not None:
        x = {k: v for k, v in x.items() if k.rpartition("/")[2] in keep}
    model = model.eval()
    with torch.no_grad():
        out = model(x)
        logits = out["logits"] if isinstance(out, dict) else out
        return F.cross_entropy(logits.float(), y.to(logits.device), reduction="none").cpu().numpy()


def membership_auc(member_loss: np.ndarray, nonmember_loss: np.ndarray) -> dict:
    """Yeom et al. 2018's threshold adversary: score -loss; ROC AUC and max(TPR - FPR)."""
    from sklearn.metrics import roc_auc_score, roc_curve

    y = np.r_[np.ones(len(member_loss)), np.zeros(len(nonmember_loss))]
    s = -np.r_[member_loss, nonmember_loss]
    fpr, tpr, _ = roc_curve(y, s)
    return {"auc": float(roc_auc_score(y, s)), "advantage": float((tpr - fpr).max())}
