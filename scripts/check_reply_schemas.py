"""Run every registered algorithm for one round on a small config with on_bad_reply = "fail":
an algorithm whose honest train replies do not fit its declared reply schema (mmfl.core.replies)
fails here. Usage, from the repository root: python scripts/check_reply_schemas.py [names...]
(docs/attacks.md)."""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch
torch.set_num_threads(1)
from mmfl.config import load_config
from mmfl.engine.runner import Experiment
from mmfl.errors import MMFLError
from mmfl.algorithms import ALGORITHMS
C = Path(__file__).resolve().parents[1] / "mmfl" / "configs"
DIG = ["data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
       "train.local_epochs=1", "train.batch_size=128", "train.lr=0.05"]
MM = ["data.name=mfeat", 'data.views=["pix", "fou"]', 'case="D"', "partition.num_clients=4",
      "model.name=multimodal", "model.feat_dim=16", "model.mlp_hidden=[16]", "train.local_epochs=1",
      "train.batch_size=64", "clients_per_round=3"]
CREAM = ["model.feat_dim=16", "model.cnn_channels=[4,8]", "model.mlp_hidden=[16]", "train.local_epochs=1",
         "data.public_fraction=0.4", "client_data=[]", "client_models=[]", "clients_per_round=3", "algorithm.public_size=64"]
PFL = ["data.num_train=300", "data.num_test=100", "model.feat_dim=16", "model.cnn_channels=[4,4]", "train.batch_size=64"]
single = {"fedavg","fedavgm","feddyn","fedprox","moon","scaffold","local","centralized","fedamp","fedfomo"}
cream = {"creamfl","creamfl_fedavg","creamfl_fediot","fedet","fedgems","fedmd","reamfl_avg","reamfl_iot","reamfl_mean"}
pfl = {"partialfl","partialfl_prox","pfl_centralized","pfl_fedavg","pfl_fedprox","split_learning","split_learning_u"}
names = sys.argv[1:] or ALGORITHMS.names()
failed = False
for name in names:
    if name in single: path, over = None, DIG
    elif name in cream: path, over = C/"creamfl_mfeat.toml", CREAM
    elif name in pfl: path, over = C/"partialfl_digits.toml", PFL + (['privacy.labels="shareable"'] if name=="split_learning" else [])
    elif name == "fedcmi": path, over = None, MM + ["model.two_projector=true"]
    else:  # any other (a new algorithm): the federation its server declares (Server.runs_on)
        runs_on = ALGORITHMS.get(name).factory.server.runs_on
        path, over = {"single": (None, DIG), "public": (C/"creamfl_mfeat.toml", CREAM), "pair": (C/"creamfl_mfeat.toml", CREAM),
                      "shareable": (C/"partialfl_digits.toml", PFL)}.get(runs_on, (None, MM))
    t = time.time()
    try:
        cfg = load_config(path, [*over, f"algorithm.name={name}" if name not in ("split_learning","split_learning_u") else f'algorithm={{name="{name}"}}',
                                 "threads=1", "rounds=1", "on_bad_reply=\"fail\"", "output_dir='/tmp/mmfl_reply_schemas'", f"name={name}"])
        Experiment(cfg, progress=False).run(overwrite=True)
        print(name, "OK", round(time.time()-t,1), flush=True)
    except MMFLError as e:
        print(name, "ERR", e, flush=True)
        failed = True
    except Exception as e:
        print(name, "EXC", repr(e)[:300], flush=True)
        failed = True
sys.exit(1 if failed else 0)
