"""Where a run measures: this host's GPUs (`start`: options, `--devices`, the workers and compile
pool), several workloads spread over them (`spread`), and a Dask cluster of GPU hosts (`cluster`,
its host side `cluster_host` and its client side `cluster_client`)."""
