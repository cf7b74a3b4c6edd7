"""Public-set knowledge-distillation baselines of CreamFL's Table 1, on CreamFL's server model
and message exchange (presets of :class:`~mmfl.algorithms.creamfl.CreamFLParams`):

- ``fedmd``: FedMD (Li & Wang 2019): mean consensus of the clients' public-set
  representations; each client first *digests* the previous round's consensus (MSE to it on
  the public set) before it revisits its private data;
- ``fedet``: FedET (Cho et al. 2022), adapted: ensemble weights from the variance of each
  client's representation; clients distill from the server's global representations (MSE)
  before private training;
- ``fedgems``: FedGEMS (Cheng et al. 2021), adapted: per sample, the clients whose
  representation has at most the mean entropy are selected and averaged; local distillation
  as FedET.

See docs/algorithms/creamfl.md ("Baselines").
"""

from __future__ import annotations

from mmfl.algorithms.creamfl import CreamFLClient, CreamFLParams, CreamFLServer
from mmfl.algorithms.registry import preset, register


register("fedmd",
         preset("FedMDParams", CreamFLParams, aggregation="mean", inter=False, intra=False, local_distill="consensus"),
         CreamFLServer, CreamFLClient,
         help="FedMD on representations: mean consensus, clients digest it; CreamFL's server model distills")
register("fedet",
         preset("FedETParams", CreamFLParams, aggregation="variance", inter=False, intra=False, local_distill="global"),
         CreamFLServer, CreamFLClient,
         help="FedET on representations: variance-weighted ensemble, clients distill from the server")
register("fedgems",
         preset("FedGEMSParams", CreamFLParams, aggregation="entropy", inter=False, intra=False, local_distill="global"),
         CreamFLServer, CreamFLClient,
         help="FedGEMS on representations: entropy-selected ensemble, clients distill from the server")
