"""envace.cluster: the Kubernetes side of EnvACE.

`trainjob` builds the Kubeflow Trainer TrainJob that runs `envace train` (pure, no client);
`submit` creates, follows and cancels it through the `kubernetes` client; `prerequisites` checks
what the cluster must already run; `cli` adds `envace cluster submit | status | cancel | check`.
The manifests themselves live in charts/envace (cluster setup) and k8s/ (kubectl-applied jobs).
"""

from envace.cluster.trainjob import TrainJobSpec, build_config_map, build_trainjob

__all__ = ["TrainJobSpec", "build_config_map", "build_trainjob"]
