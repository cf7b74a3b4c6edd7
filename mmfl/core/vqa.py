"""Visual question answering on a model's image and question representations: the soft VQA
accuracy and a head fine-tuned on soft targets (CreamFL's Table 2 evaluation).

**Score** of a predicted answer given the human answers of a question (VQA, Antol et al.
2015; the answers normalised by :func:`mmfl.data.vqa.normalize_answer`):

* :func:`soft_score` (the standard one): ``min(#humans that gave the answer / 3, 1)``;
* :func:`official_score` (the official evaluation script's "10 choose 9" average): the mean,
  over the ten ways of leaving one human answer out, of ``min(#matches among the other nine
  / 3, 1)``; for ``c`` matches of ``n`` answers that is
  ``(c * min((c - 1) / 3, 1) + (n - c) * min(c / 3, 1)) / n``. It gives 0.3 / 0.6 / 0.9 / 1.0
  for 1 / 2 / 3 / 4+ matches where the soft score gives 1/3, 2/3, 1, 1.

Accuracy is the mean score over all test questions; a prediction is always one of the
vocabulary's answers, so questions whose answers lie outside it score 0 (the ``oracle``
row of :func:`evaluate_vqa` is the best any prediction could get).

**Head** (:class:`VQAHead`): the image representation ``z_i`` and question representation
``z_q`` of the model (for CreamFL's server ``normalize(proj[m](encoders[m](x)))``, its
``reps_of``) are each standardised (a layer norm without parameters: a unit-norm
representation has entries of size 1/sqrt(d), and with them the head trained several times
slower -- 32 % train accuracy after 30 epochs on the emoji VQA set instead of 93 %), then fused --
``product``: ``relu(W_i z_i) * relu(W_q z_q)`` (the element-wise
product of the common baselines, Antol et al. 2015, Teney et al. 2018), or ``concat``:
``relu(W [z_i; z_q])`` -- then an MLP (``Linear-ReLU-Dropout-Linear``) gives one logit per
answer. :func:`finetune_vqa` trains it with binary cross-entropy on the soft targets
(:func:`soft_targets`, summed over answers, averaged over the batch; Teney et al. 2018) with
Adam, the model's encoders either ``frozen`` (their representations are computed once) or
``finetune``-d with their own learning rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.data.vqa import NO_ANSWER, VQAData, VQASplit, normalize_answer
from mmfl.core import optim
from mmfl.core.training import shuffled_batches
from mmfl.errors import ConfigError

IMAGE, QUESTION = "image", "text"  # the modalities the representation function is asked for
Represent = Callable[[dict[str, Tensor]], dict[str, Tensor]]  # {"image": [B, d_i], "text": [B, d_t]} -> reps [B, d]


# ----------------------------------------------------------------------------- scores


def soft_score(counts: Tensor) -> Tensor:
    """``min(counts / 3, 1)``: float ``[N]`` from the number of humans ``[N]`` that gave the answer."""
    return (counts.to(torch.float64) / 3.0).clamp(max=1.0)


def official_score(counts: Tensor, n_answers: Tensor) -> Tensor:
    """The official script's average over leaving each of the ``n`` human answers out:
    ``(c * min((c - 1) / 3, 1) + (n - c) * min(c / 3, 1)) / n``; float ``[N]`` from ``counts``
    and ``n_answers`` (both ``[N]``)."""
    c, n = counts.to(torch.float64), n_answers.to(torch.float64).clamp(min=1.0)
    return (c * ((c - 1.0) / 3.0).clamp(0.0, 1.0) + (n - c) * (c / 3.0).clamp(max=1.0)) / n


def answer_counts(pred: Tensor, answers: Tensor) -> Tensor:
    """How many human answers equal the prediction: pred int64 ``[N]`` (vocabulary indices),
    answers int64 ``[N, A]`` (-1 = outside the vocabulary / padding) -> int64 ``[N]``."""
    return ((answers == pred.unsqueeze(1)) & (answers != NO_ANSWER)).sum(1)


def soft_targets(answers: Tensor, num_answers: int) -> Tensor:
    """Per question and vocabulary answer, :func:`soft_score` of that answer: answers int64
    ``[B, A]`` (-1 ignored) -> float32 ``[B, num_answers]``."""
    counts = torch.zeros(answers.shape[0], num_answers + 1, device=answers.device)
    idx = answers.clone()
    idx[idx == NO_ANSWER] = num_answers  # a spare column, dropped
    counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=counts.dtype))
    return soft_score(counts[:, :num_answers]).to(torch.float32)


def vqa_score(pred: str, answers: list[str]) -> float:
    """:func:`soft_score` of one predicted answer string against the human answers (both normalised)."""
    p = normalize_answer(pred)
    return min(sum(normalize_answer(a) == p for a in answers) / 3.0, 1.0)


def vqa_score_official(pred: str, answers: list[str]) -> float:
    """The official "10 choose 9" score of one answer string (see :func:`official_score`)."""
    p = normalize_answer(pred)
    norm = [normalize_answer(a) for a in answers]
    return sum(min(sum(a == p for a in norm[:i] + norm[i + 1:]) / 3.0, 1.0) for i in range(len(norm))) / len(norm)


# ----------------------------------------------------------------------------- the head


class VQAHead(nn.Module):
    """``(z_i [B, d_i], z_q [B, d_q]) -> logits [B, num_answers]``: standardise, fuse, MLP."""

    def __init__(self, dim_image: int, dim_question: int, num_answers: int, hidden: int = 1024,
                 fusion: str = "product", dropout: float = 0.5):
        super().__init__()
        self.fusion = fusion
        if fusion == "product":
            self.image = nn.Linear(dim_image, hidden)
            self.question = nn.Linear(dim_question, hidden)
        elif fusion == "concat":
            self.joint = nn.Linear(dim_image + dim_question, hidden)
        else:
            raise ConfigError(f"fusion: must be 'product' or 'concat', got {fusion!r}")
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, num_answers))

    def forward(self, z_i: Tensor, z_q: Tensor) -> Tensor:
        z_i = F.layer_norm(z_i, z_i.shape[-1:])
        z_q = F.layer_norm(z_q, z_q.shape[-1:])
        if self.fusion == "product":
            h = F.relu(self.image(z_i)) * F.relu(self.question(z_q))
        else:
            h = F.relu(self.joint(torch.cat([z_i, z_q], dim=1)))
        return self.mlp(h)


@dataclass
class VQATrainParams:
    epochs: int = field(default=30, metadata={"help": "passes over the training questions"})
    batch_size: int = field(default=128, metadata={"help": "questions per step"})
    lr: float = field(default=1e-3, metadata={"help": "Adam learning rate of the head"})
    encoders: Literal["frozen", "finetune"] = field(default="frozen", metadata={
        "help": "the model's encoders and projectors: 'frozen' (only the head learns) or 'finetune' "
                "(trained with the head at encoder_lr)"})
    encoder_lr: float = field(default=1e-4, metadata={"help": "Adam learning rate of the encoders (finetune)"})
    hidden: int = field(default=1024, metadata={"help": "width of the fused representation and of the MLP"})
    fusion: Literal["product", "concat"] = field(default="product", metadata={
        "help": "'product': relu(W_i z_i) * relu(W_q z_q); 'concat': relu(W [z_i; z_q])"})
    dropout: float = field(default=0.5, metadata={"help": "dropout in the head's MLP"})
    weight_decay: float = field(default=0.0, metadata={"help": "Adam weight decay (head and encoders)"})
    seed: int = field(default=0, metadata={"help": "seed of the head's initialisation and the batch order"})

    def __post_init__(self):
        for key in ("epochs", "batch_size", "hidden"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"vqa.{key}: must be an integer >= 1, got {v!r}")
        for key in ("lr", "encoder_lr"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"vqa.{key}: must be > 0, got {getattr(self, key)!r}")
        if self.encoders not in ("frozen", "finetune"):
            raise ConfigError(f"vqa.encoders: must be 'frozen' or 'finetune', got {self.encoders!r}")
        if self.fusion not in ("product", "concat"):
            raise ConfigError(f"vqa.fusion: must be 'product' or 'concat', got {self.fusion!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"vqa.dropout: must be in [0, 1), got {self.dropout!r}")
        if self.weight_decay < 0:
            raise ConfigError(f"vqa.weight_decay: must be >= 0, got {self.weight_decay!r}")


# ----------------------------------------------------------------------------- training and evaluation


def _reps(represent: Represent, split: VQASplit, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Representations of questions ``rows`` and of the images they ask about: ``[b, d]`` each."""
    z = represent({IMAGE: split.image[split.image_index[rows]], QUESTION: split.question[rows]})
    if IMAGE not in z or QUESTION not in z:
        raise ConfigError(f"the model gives no representation of {IMAGE!r} or {QUESTION!r} "
                          f"(it holds {sorted(z)})")
    return z[IMAGE], z[QUESTION]


class _Frozen:
    """The representations of a whole split, computed once (frozen encoders)."""

    def __init__(self, represent: Represent, split: VQASplit, chunk: int = 4096):
        zi, zq = [], []
        with torch.no_grad():
            for s in range(0, len(split), chunk):
                rows = torch.arange(s, min(s + chunk, len(split)), device=split.question.device)
                a, b = _reps(represent, split, rows)
                zi.append(a)
                zq.append(b)
        self.zi, self.zq = torch.cat(zi), torch.cat(zq)

    def __call__(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        return self.zi[rows], self.zq[rows]


@torch.no_grad()
def predict(head: VQAHead, reps: Callable[[Tensor], tuple[Tensor, Tensor]], n: int, chunk: int = 4096) -> Tensor:
    """The head's answer (vocabulary index, int64 ``[n]``) for every question (rows: CPU positions)."""
    was = head.training
    head.eval()
    out = [head(*reps(torch.arange(s, min(s + chunk, n), device="cpu"))).argmax(1) for s in range(0, n, chunk)]
    head.train(was)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long, device=next(head.parameters()).device)


def evaluate_vqa(pred: Tensor, split: VQASplit) -> dict:
    """Accuracies in % of predictions ``[N]`` (vocabulary indices) on ``split``: ``accuracy``
    (soft score), ``accuracy_official`` (10 choose 9), per ``answer_type`` and per
    ``question_type`` (soft score), and ``oracle`` (the best answer in the vocabulary for every
    question)."""
    counts = answer_counts(pred.to(split.answers.device), split.answers)
    soft, official = soft_score(counts), official_score(counts, split.n_answers)
    best = answer_counts_max(split.answers)
    out = {"accuracy": 100 * float(soft.mean()), "accuracy_official": 100 * float(official.mean()),
           "oracle": 100 * float(soft_score(best).mean()), "questions": len(split)}
    for key, types in (("by_answer_type", [q.answer_type for q in split.records.questions]),
                       ("by_question_type", [q.question_type for q in split.records.questions])):
        rows = {}
        for t in sorted(set(types)):
            mask = torch.tensor([x == t for x in types], device=soft.device)
            rows[t or "(none)"] = {"accuracy": 100 * float(soft[mask].mean()), "questions": int(mask.sum())}
        out[key] = rows
    return out


def answer_counts_max(answers: Tensor) -> Tensor:
    """Per question, the most human answers any single vocabulary answer got: ``[N, A] -> [N]``."""
    same = (answers.unsqueeze(2) == answers.unsqueeze(1)) & (answers != NO_ANSWER).unsqueeze(2)
    return (same.sum(2).max(1).values if answers.shape[1]
            else torch.zeros(answers.shape[0], dtype=torch.long, device=answers.device))


def finetune_vqa(represent: Represent, encoder_params: list[nn.Parameter], data: VQAData,
                 p: VQATrainParams, modules: list[nn.Module] = ()) -> dict:
    """Train a :class:`VQAHead` on ``data.train`` over ``represent``'s representations and score it
    on ``data.test`` after the last epoch (no model selection on the test split).

    ``encoder_params``: what ``represent`` depends on; trained at ``p.encoder_lr`` when
    ``p.encoders == "finetune"`` (in place), untouched when ``"frozen"``. ``modules``: put in
    train mode while fine-tuning and eval mode otherwise. Returns the metrics (see
    :func:`evaluate_vqa`; plus ``majority``, the accuracy of always answering the most frequent
    training answer, ``train_accuracy``, the per-epoch ``train_loss``) and the predicted answer
    strings (``predictions``, test question order)."""
    k = len(data.vocab)
    train, test = data.train, data.test
    frozen = p.encoders == "frozen"
    for m in modules:
        m.eval()
    if frozen:
        for q in encoder_params:
            q.requires_grad_(False)
        tr_reps, te_reps = _Frozen(represent, train), _Frozen(represent, test)
    else:
        for q in encoder_params:
            q.requires_grad_(True)
        tr_reps = lambda rows: _reps(represent, train, rows)  # noqa: E731
        te_reps = lambda rows: _reps(represent, test, rows)  # noqa: E731
    with torch.no_grad():
        zi, zq = _reps(represent, train, torch.arange(min(2, len(train)), device=train.question.device))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(p.seed)
        with torch.device("cpu"):  # the seeded CPU init on every device, then moved to the representations'
            head = VQAHead(zi.shape[1], zq.shape[1], k, p.hidden, p.fusion, p.dropout).to(zi.device)
        groups = [{"params": list(head.parameters()), "lr": p.lr}]
        if not frozen:
            groups.append({"params": list(encoder_params), "lr": p.encoder_lr})
        opt = optim.Adam(groups, weight_decay=p.weight_decay)
        gen = torch.Generator(device="cpu").manual_seed(p.seed)
        losses = []
        for _ in range(p.epochs):
            head.train()
            for m in modules:
                m.train(not frozen)
            total, steps = 0.0, 0
            for rows in shuffled_batches(len(train), p.batch_size, gen):
                logits = head(*tr_reps(rows))
                target = soft_targets(train.answers[rows], k).to(logits.device)
                loss = F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / rows.numel()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total, steps = total + float(loss.detach()), steps + 1
            losses.append(total / max(steps, 1))
    for m in modules:
        m.eval()
    with torch.no_grad():
        pred = predict(head, te_reps, len(test))
        out = evaluate_vqa(pred, test)
        out["train_accuracy"] = evaluate_vqa(predict(head, tr_reps, len(train)), train)["accuracy"]
        out["majority"] = evaluate_vqa(torch.zeros(len(test), dtype=torch.long, device=test.answers.device),
                                       test)["accuracy"]
    out["majority_answer"] = data.vocab[0]
    out["train_loss"] = losses
    out["predictions"] = [data.vocab[i] for i in pred.tolist()]
    return out
