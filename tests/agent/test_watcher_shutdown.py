"""The node watcher (rayfabric.init(watch_new_nodes=True)) of a driver that leaves Ray with
ray.shutdown() and no rayfabric.shutdown(): it ends without a word (it used to print "could not
start an agent on a new node: ... Ray has not been started yet" every 2 s), and a later
ray.init() + rayfabric.init() in the same process gets a watcher that runs. A driver process
against a real 1-node cluster, its stderr read whole."""
import subprocess
import sys
import textwrap

from ray.cluster_utils import Cluster

from ray_test_cluster import use_this_checkout

DRIVER = textwrap.dedent("""
    import sys, time
    import ray, rayfabric
    from rayfabric import api
    ray.init(address=sys.argv[1], logging_level="ERROR")
    rayfabric.init(watch_new_nodes=True)
    first = api._watcher
    ray.shutdown()
    time.sleep(3 * first.interval_s + 1)
    print("first watcher alive after ray.shutdown:", first.is_alive(), flush=True)
    ray.init(address=sys.argv[1], logging_level="ERROR")
    rayfabric.init(watch_new_nodes=True)
    second = api._watcher
    time.sleep(second.interval_s + 1)
    print("second watcher is new and alive:", second is not first and second.is_alive(), flush=True)
    rayfabric.shutdown()
    ray.shutdown()
""")


def test_watcher_ends_quietly_with_ray_shutdown_and_a_new_init_gets_one():
    use_this_checkout()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 100 << 20,
                                                      "include_dashboard": False})
    try:
        out = subprocess.run([sys.executable, "-c", DRIVER, c.address], capture_output=True, text=True,
                             timeout=300)
    finally:
        c.shutdown()
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stderr
    assert "first watcher alive after ray.shutdown: False" in out.stdout
    assert "second watcher is new and alive: True" in out.stdout
    assert "could not start an agent" not in out.stderr, out.stderr
