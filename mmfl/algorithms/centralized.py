"""Centralized upper bound: all clients' data pooled into one training set.

Implemented as FedAvg over a federation of one client holding every sample
(the ``pooled`` flag of the spec asks the engine for that federation), so
one "round" is ``train.local_epochs`` epochs over the pooled data. Its byte
counts are those of that single client and mean nothing for communication.
"""

from mmfl.algorithms.registry import register
from mmfl.algorithms.fedavg import FedAvgClient, FedAvgServer

register("centralized", None, FedAvgServer, FedAvgClient, pooled=True,
         help="centralized upper bound: one model trained on all client data pooled")
