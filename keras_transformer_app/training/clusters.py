"""§5.2 Hardware: the cluster of processes that the environment names, by the
engines' own conventions (`keras_transformer_app.training.distribution` trains on it).

* JAX: `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator, process 0, first),
  `KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`, the
  variables of `keras.distribution.initialize`.
* TensorFlow: a `TF_CONFIG` naming more than one worker.
"""

import dataclasses
import json
import os

# The variables of `keras.distribution.initialize`, which name a JAX cluster.
JAX_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID")


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The processes that the environment says this one trains with.

    Attributes:
        variables: What named the cluster: "KERAS_DISTRIBUTION_*" (JAX) or "TF_CONFIG".
        process_id: This process, 0 (the chief) to `process_count - 1`.
        process_count: The processes in all.
        coordinator: JAX's coordinator address (process 0's host:port); None for TF.
        task: TF_CONFIG's name of this process ("worker 1"); None for JAX.
    """

    variables: str
    process_id: int
    process_count: int
    coordinator: str = None
    task: str = None


def cluster_from_environment(environ=None):
    """The cluster that `KERAS_DISTRIBUTION_*` or `TF_CONFIG` names, or None when they
    name none (unset, or one process).

    Raises:
        ValueError: The variables are incomplete, malformed or both kinds are set.
    """
    environ = os.environ if environ is None else environ
    given = [name for name in JAX_VARIABLES if environ.get(name)]
    if given and environ.get("TF_CONFIG"):
        raise ValueError("Both KERAS_DISTRIBUTION_* (a JAX cluster) and TF_CONFIG (a "
                         "TensorFlow cluster) are set: keep the one of your backend.")
    cluster = (_jax_cluster(environ, given) if given else
               _tf_cluster(environ["TF_CONFIG"]) if environ.get("TF_CONFIG") else None)
    return cluster if cluster is not None and cluster.process_count > 1 else None


def _jax_cluster(environ, given):
    missing = [name for name in JAX_VARIABLES if name not in given]
    if missing:
        raise ValueError(f"A JAX cluster needs all of {', '.join(JAX_VARIABLES)}; "
                         f"{', '.join(missing)} unset.")
    addresses = environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",")
    count, process_id = (environ[f"KERAS_DISTRIBUTION_{name}"] for name in ("NUM_PROCESSES",
                                                                           "PROCESS_ID"))
    if not (count.isdigit() and process_id.isdigit() and int(process_id) < int(count)):
        raise ValueError(f"KERAS_DISTRIBUTION_PROCESS_ID={process_id} must be an integer from "
                         f"0 to KERAS_DISTRIBUTION_NUM_PROCESSES={count} - 1.")
    if len(addresses) not in (1, int(count)):
        raise ValueError(f"KERAS_DISTRIBUTION_JOB_ADDRESSES names {len(addresses)} processes "
                         f"and KERAS_DISTRIBUTION_NUM_PROCESSES={count}: give every process's "
                         "host:port, or the coordinator's (process 0's) alone.")
    return Cluster("KERAS_DISTRIBUTION_*", int(process_id), int(count), addresses[0].strip())


def _tf_cluster(text):
    try:
        config = json.loads(text)
        jobs, task = config.get("cluster", {}), (config["task"]["type"],
                                                 int(config["task"]["index"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError('TF_CONFIG must be JSON such as {"cluster": {"worker": ["host0:port", '
                         '"host1:port"]}, "task": {"type": "worker", "index": 0}}.') from None
    # The chief, if any, then the workers: the order of TensorFlow's own process ids.
    tasks = [(job, i) for job in ("chief", "worker") for i in range(len(jobs.get(job, ())))]
    if set(jobs) - {"chief", "worker"} or task not in tasks:
        raise ValueError(f"TF_CONFIG names the tasks {sorted(jobs)} and this process as "
                         f"{task[0]} {task[1]}: MultiWorkerMirroredStrategy trains with the "
                         "chief and worker tasks of the cluster, and this task must be one.")
    return Cluster("TF_CONFIG", tasks.index(task), len(tasks), task=f"{task[0]} {task[1]}")
