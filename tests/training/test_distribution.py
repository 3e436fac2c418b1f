"""keras_transformer_app/training/distribution.py on 4 virtual CPU devices: data (and,
on JAX, model) parallel training, fed as training/run.py feeds it (`Distributed.feed`),
gives the loss of one device with the same global batch, and the model-parallel layout
really splits the weights; the cluster that the environment names, and what a cluster
refuses (the clusters themselves train in tests/test_multiprocess.py).

Devices are split before the backend starts, so each case runs in a fresh
process for the backend under test."""

import json
import os
import subprocess
import sys

import keras
import pytest
from helpers import REPOSITORY, CharTokenizer

from keras_transformer.data.pipeline import bucket_plan, make_dataset
from keras_transformer_app.training import distribution

BACKEND = keras.backend.backend()

SCRIPT = r"""
import json, sys
import keras
from keras_transformer_app.training import distribution
distribution.virtual_cpu_devices(4)
import numpy as np
import tensorflow as tf
import keras_transformer as kt

kind = sys.argv[1]
config = kt.TransformerConfig.tiny(vocab_size=48, num_layers=1, d_model=32, num_heads=4,
                                   d_ff=64, dropout_rate=0.0)
rng = np.random.default_rng(0)
source = rng.integers(4, 48, size=(8, 12)).astype("int32")
target = rng.integers(4, 48, size=(8, 10)).astype("int32")
for row in range(8):  # different lengths, so replicas hold different token counts
    source[row, 12 - row:] = config.pad_id
    target[row, 10 - row:] = config.pad_id
labels = np.concatenate([target[:, 1:], np.full((8, 1), config.pad_id, "int32")], axis=1)
inputs = {"source": source, "target": target}
keras.utils.set_random_seed(0)
initial = kt.Transformer(config).get_weights()

def train(distributed, dataset=None):
    with distributed.scope():
        model = kt.Transformer(config)
        model.set_weights(initial)
        model.compile(optimizer=kt.paper_adam(config.d_model, 10),
                      loss=kt.LabelSmoothedCrossEntropy(0.1),
                      metrics=[kt.MaskedTokenAccuracy()])
    if dataset is not None:
        history = model.fit(dataset, epochs=4, verbose=0)
    else:
        history = model.fit(inputs, labels, batch_size=8, epochs=4, shuffle=False, verbose=0)
    return model, history.history

_, single = train(distribution.Distributed("none", "one device"))
devices = None
if keras.backend.backend() == "tensorflow":
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
distributed = distribution.setup(kind, model_parallel=2, devices=devices)
# Fed as training/run.py feeds it: the same global batch, through `feed`.
dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(8)
model, parallel = train(distributed, distributed.feed(dataset))
fed = {}
if distributed.strategy is not None:  # MirroredStrategy: `feed`'s rows and devices
    strategy = distributed.strategy
    ours = strategy.experimental_local_results(next(iter(distributed.feed(dataset))))
    keras_way = strategy.experimental_local_results(
        next(iter(strategy.experimental_distribute_dataset(dataset))))
    fed["rows"] = [[x[0]["source"].numpy().tolist(), x[1].numpy().tolist()] for x in ours]
    fed["keras_rows"] = [[x[0]["source"].numpy().tolist(), x[1].numpy().tolist()]
                         for x in keras_way]
    fed["devices"] = sorted({x[1].device for x in ours})
    fed["keras_devices"] = sorted({x[1].device for x in keras_way})
shards = {}
if keras.backend.backend() == "jax":
    for variable in model.variables:
        value = variable.value
        shards[variable.path.split("/", 1)[1]] = [list(variable.shape),
                                 list(value.addressable_shards[0].data.shape),
                                 len(value.sharding.device_set)]
print(json.dumps({"kind": distributed.kind, "description": distributed.description,
                  "batch_multiple": distributed.batch_multiple, "single": single,
                  "parallel": parallel, "shards": shards, "fed": fed}))
"""


def run_parallel(kind):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind], cwd=REPOSITORY, capture_output=True, text=True,
        timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND=BACKEND),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_same_training(outcome):
    for name in ("loss", "token_accuracy"):
        single, parallel = outcome["single"][name], outcome["parallel"][name]
        assert len(single) == 4
        assert max(abs(a - b) for a, b in zip(single, parallel)) <= 1e-4, (name, single,
                                                                           parallel)


@pytest.mark.skipif(BACKEND == "torch", reason="data parallelism runs on jax and tensorflow")
def test_data_parallel_training_matches_one_device():
    outcome = run_parallel("data")
    assert outcome["kind"] == "data"
    if BACKEND == "jax":
        assert outcome["description"] == "keras.distribution.DataParallel over 4 devices"
        assert outcome["batch_multiple"] == 4
    else:
        assert outcome["description"] == "tf.distribute.MirroredStrategy over 4 replicas"
        assert outcome["batch_multiple"] == 4  # equal replica batches, as Keras builds on them
    assert_same_training(outcome)
    if BACKEND == "tensorflow":
        fed = outcome["fed"]
        # Each replica gets the rows Keras's own distribution gives it, read on the host:
        # no MultiDeviceIterator, whose drop at every evaluation ended runs with a
        # segmentation fault (Distributed.feed). Keras's own put them on the 4 devices.
        assert fed["rows"] == fed["keras_rows"] and len(fed["rows"]) == 4
        assert [len(source) for source, _ in fed["rows"]] == [2, 2, 2, 2]
        assert len(fed["devices"]) == 1 and fed["devices"][0].endswith("CPU:0")
        assert len(fed["keras_devices"]) == 4


@pytest.mark.skipif(BACKEND != "jax", reason="model parallelism runs on jax")
def test_model_parallel_layout_splits_the_weights_and_matches_one_device():
    outcome = run_parallel("model")
    assert outcome["kind"] == "model" and outcome["batch_multiple"] == 2
    assert "(2, 2)" in outcome["description"]
    assert_same_training(outcome)
    shards = outcome["shards"]
    # [full shape, one device's shard, devices holding it]
    assert shards["shared_embedding/embeddings"][:2] == [[48, 32], [24, 32]]
    assert shards["encoder_block_0/self_attention/query/kernel"][:2] == [
        [32, 4, 8], [32, 2, 8]]
    assert shards["decoder_block_0/cross_attention/attention_output/kernel"][:2] == [
        [4, 8, 32], [2, 8, 32]]
    assert shards["encoder_block_0/feed_forward/inner_dense/kernel"][:2] == [
        [32, 64], [32, 32]]
    assert shards["decoder_block_0/feed_forward/output_dense/kernel"][:2] == [
        [64, 32], [32, 32]]
    # Layer norms are replicated.
    norm = shards["encoder_block_0/feed_forward_norm/gamma"]
    assert norm[0] == norm[1] and norm[2] == 4


@pytest.mark.backs('docs/distributed.md', "none: Keras's torch backend has no multi-process `fit`")
def test_unsupported_combinations_say_what_to_use():
    with pytest.raises(ValueError, match="must be one of"):
        distribution.setup("pipeline")
    if BACKEND == "torch":
        with pytest.raises(ValueError, match="KERAS_BACKEND=jax"):
            distribution.setup("data")
    if BACKEND == "tensorflow":
        with pytest.raises(ValueError, match="Model parallelism runs on the JAX backend"):
            distribution.setup("model")
    assert distribution.setup("none").batch_multiple == 1


def test_batches_become_multiples_of_the_replica_count():
    _, sizes, _ = bucket_plan(64, 1000, batch_multiple=4)
    assert sizes and all(size % 4 == 0 and size >= 4 for size in sizes)

    tokenizer = CharTokenizer()
    sentences = ["abc", "abcdefgh", "ab", "hgfe", "a", "bad"]
    dataset, _ = make_dataset(sentences, sentences, tokenizer, max_sentence_length=16,
                              tokens_per_batch=64, shuffle=False, verbose=False,
                              batch_multiple=4)
    rows, batches = 0, 0
    for inputs, labels in dataset:
        batches += 1
        assert inputs["source"].shape[0] % 4 == 0
        rows += int((labels.numpy() != tokenizer.pad_id).any(axis=1).sum())
    assert batches > 0
    assert rows == len(sentences), "padding rows hold no tokens"


def jax_cluster(process_id, count=2, addresses="10.0.0.1:1234"):
    return {"KERAS_DISTRIBUTION_JOB_ADDRESSES": addresses,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(count),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(process_id)}


def tf_cluster(jobs, task_type, index):
    return {"TF_CONFIG": json.dumps({"cluster": jobs,
                                     "task": {"type": task_type, "index": index}})}


def test_the_environment_names_the_cluster_by_the_engines_own_variables():
    cluster = distribution.cluster_from_environment
    assert cluster({}) is None
    assert cluster(jax_cluster(1)) == distribution.Cluster(
        "KERAS_DISTRIBUTION_*", 1, 2, "10.0.0.1:1234")
    # Every process's address, or the coordinator's alone: process 0's is the first.
    assert cluster(jax_cluster(0, addresses="10.0.0.1:1234,10.0.0.2:2345")).coordinator == (
        "10.0.0.1:1234")
    two_workers = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
    assert cluster(tf_cluster(two_workers, "worker", 1)) == distribution.Cluster(
        "TF_CONFIG", 1, 2, task="worker 1")
    # A chief task comes first, as in TensorFlow.
    with_chief = {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]}
    assert cluster(tf_cluster(with_chief, "chief", 0)).process_id == 0
    assert cluster(tf_cluster(with_chief, "worker", 0)).process_id == 1
    # One process is no cluster.
    assert cluster(jax_cluster(0, count=1)) is None
    assert cluster(tf_cluster({"worker": ["10.0.0.1:2222"]}, "worker", 0)) is None


@pytest.mark.parametrize("environment, message", [
    ({"KERAS_DISTRIBUTION_PROCESS_ID": "0"}, "KERAS_DISTRIBUTION_JOB_ADDRESSES, "
                                             "KERAS_DISTRIBUTION_NUM_PROCESSES unset"),
    (jax_cluster(2), "PROCESS_ID=2 must be an integer from 0"),
    (jax_cluster("one"), "PROCESS_ID=one must be an integer"),
    (jax_cluster(0, addresses="a:1,b:2,c:3"), "names 3 processes"),
    (tf_cluster({"worker": ["a:1"], "ps": ["b:1"]}, "worker", 0), "chief and worker tasks"),
    (tf_cluster({"worker": ["a:1", "b:1"]}, "worker", 2), "as worker 2"),
    ({"TF_CONFIG": "{worker"}, "TF_CONFIG must be JSON"),
    (dict(jax_cluster(0), TF_CONFIG="{}"), "Both KERAS_DISTRIBUTION_"),
])
def test_a_malformed_cluster_is_refused_naming_the_variable(environment, message):
    with pytest.raises(ValueError, match=message):
        distribution.cluster_from_environment(environment)


@pytest.mark.parametrize("environment", [jax_cluster(1), tf_cluster(
    {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "worker", 1)], ids=["jax", "tensorflow"])
@pytest.mark.backs("docs/distributed.md", "a cluster in the environment is refused")
def test_a_cluster_trains_data_parallel_on_its_own_engine(monkeypatch, environment):
    # Each refusal comes before the engine starts, so the test process can hear it.
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    engine = "jax" if "TF_CONFIG" not in environment else "tensorflow"
    if BACKEND == "torch":
        with pytest.raises(ValueError, match="torch backend has no multi-process fit"):
            distribution.setup("data")
        return
    if BACKEND != engine:
        with pytest.raises(ValueError, match=f"KERAS_BACKEND={engine}"):
            distribution.setup("data")
        return
    with pytest.raises(ValueError, match="pass --distribute data.*each writing the run"):
        distribution.setup("none")
    with pytest.raises(ValueError, match="pass --distribute data.*splits weights across hosts"):
        distribution.setup("model")
    with pytest.raises(ValueError, match="devices cannot be chosen for a cluster"):
        distribution.setup("data", devices=["cpu:0"])


# What each engine raises when a peer is gone, as the tests' killed processes showed it.
LOST_PEER = {
    "jax": "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] "
           "Connection closed by peer [127.0.0.1]:24473",
    "tensorflow": "{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/"
                  "task:0/device:CPU:0}} Collective ops is aborted by: Error reported from "
                  "/job:worker/task:1: The following tasks are unhealthy (stopped sending "
                  "heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have crashed.",
}


@pytest.mark.skipif(BACKEND == "torch", reason="torch trains no cluster")
@pytest.mark.parametrize("raised_as", ["the engine's error", "ValueError"])
def test_a_lost_peer_becomes_one_error_that_names_it(raised_as):
    """A step's collective raises the engine's error; under JAX the same failure in a
    checkpoint's save (`device_put`'s all-gather) comes as a ValueError
    (benchmarks/cluster_faults.py's survivors printed it raw)."""
    cluster = distribution.Cluster("TF_CONFIG", 0, 2, task="worker 0") if (
        BACKEND == "tensorflow") else distribution.Cluster("KERAS_DISTRIBUTION_*", 0, 2, "h:1")
    distributed = distribution.Distributed("data", "two processes", cluster=cluster)
    if BACKEND == "jax":
        import jax

        lost, named = (jax.errors.JaxRuntimeError if raised_as == "the engine's error" else
                       ValueError)(LOST_PEER["jax"]), (
            r"Lost a process of the cluster \(JAX's collectives: .*Connection closed by peer "
            r"\[127.0.0.1\]:24473\)")
    else:
        import tensorflow as tf

        if raised_as == "ValueError":
            pytest.skip("under TensorFlow a lost worker is the engine's error alone")
        lost = tf.errors.UnavailableError(None, None, LOST_PEER["tensorflow"])
        named = "Lost worker 1 of TF_CONFIG, so training stopped"
    with pytest.raises(distribution.PeerLostError, match=named) as peer_lost:
        with distributed.lost_peers():
            raise lost
    # JAX's runtime would wait at exit for the lost process: the command line ends at once.
    assert peer_lost.value.runtime_waits == (BACKEND == "jax")
    with pytest.raises(ValueError, match="not a peer"):  # other errors pass through
        with distributed.lost_peers():
            raise ValueError("not a peer")
