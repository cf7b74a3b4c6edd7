"""Shared pieces of the split-learning tests (tests/test_split.py, tests/test_split_u.py): a toy
two-modality problem (client 1 without 'features', per-sample masks), a transport that runs each
message on its client in process, the split server and pooled client models, the unsplit model's
objective, and the tiny mfeat_pair run config."""

from __future__ import annotations


import torch

from mmfl.algorithms.base import ClientContext, ServerContext
from mmfl.algorithms.multimodal import MFedAvgClient, MFedAvgParams
from mmfl.algorithms.split import SplitClient, SplitParams, SplitServer
from mmfl.data.base import PRESENT, ArrayDataset, DatasetMeta
from mmfl.core.training import seed_torch
from mmfl.models.multimodal import MultimodalModel


META = DatasetMeta("toy", 3, {"features": (10,), "image": (1, 8, 8)})
HOLDS = [("features", "image"), ("image",)]


def make_model(dropout=0.3, two_projector=False):
    torch.manual_seed(0)
    return MultimodalModel(dict(META.modalities), META.num_classes, feat_dim=6, cnn_channels=[4], mlp_hidden=[8],
                           dropout=dropout, two_projector=two_projector)


def toy_data(n=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    present = torch.ones(n, dtype=torch.bool)
    present[[1, 4, 5]] = False  # three samples lack 'features'
    feats = {"image": torch.randn(n, 1, 8, 8, generator=g), "features": torch.randn(n, 10, generator=g),
             PRESENT + "features": present}
    return ArrayDataset(feats, torch.randint(0, 3, (n,), generator=g))


class DirectTransport:
    """Delivers each message to the client's handler in this process, with a persistent state per
    client (what the engine's store does), and records every (route, message, reply)."""

    def __init__(self, data, train, pools, params=None):
        self.num_clients = len(data)
        self.params = params
        self.data, self.train, self.pools = data, train, pools
        self.states = {cid: {} for cid in data}
        self.log = []

    def send(self, route, messages):
        out = {}
        for cid, msg in messages.items():
            ctx = ClientContext(cid=cid, rnd=0, seed=1000 + len(self.log), data=self.data[cid], test_data=None,
                                meta=META, train=self.train, state=dict(self.states[cid]),
                                model_pool=lambda key, c=cid: self.pools[c], modalities=HOLDS[cid])
            seed_torch(ctx.seed)
            reply = SplitClient(self.params, ctx).handle(route, msg)
            self.log.append((cid, route, msg, reply, dict(ctx.state)))
            self.states[cid] = ctx.state
            out[cid] = reply
        return out


def setup(train, data=None, dropout=0.3, **params):
    data = data or toy_data()
    datas = {0: data, 1: data.with_features(["image"])}
    params = SplitParams(**params)
    server = SplitServer(params, ServerContext(META, train, seed=0, num_clients=2,
                                               make_model=lambda: make_model(dropout), client_modalities=HOLDS))
    pools = {c: make_model(dropout).keep_only(HOLDS[c]) for c in (0, 1)}
    for p in pools.values():  # the pooled models start from other weights: the session must load them
        with torch.no_grad():
            for t in p.parameters():
                t.add_(1.0)
    return server, DirectTransport(datas, train, pools, params), datas


def unsplit_loss(model, out, labels):
    """MFedAvg's local objective (``MultimodalClient.loss``: joint cross-entropy + linear probes)
    on the unsplit model's output ``out = model(inputs)``."""
    client = MFedAvgClient(MFedAvgParams(), None)
    return client.task_loss(model, out, labels) + client.probe_loss(model, out, labels)


def raw_config(tmp_path, algo="split_learning", **over):
    """mfeat_pair (image [1,16,15] + features): client 0 holds both, 1 the image, 2 the features."""
    raw = {"name": algo, "rounds": 1, "seed": 0, "output_dir": str(tmp_path), "threads": 1,
           "data": {"name": "mfeat_pair"},
           "partition": {"name": "iid", "num_clients": 3},
           "modalities": {"name": "explicit", "holds": [["image", "features"], ["image"], ["features"]]},
           "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
           "algorithm": {"name": algo},
           "train": {"optimizer": "sgd", "lr": 0.01, "local_epochs": 2, "batch_size": 64}}
    raw.update(over)
    return raw
