"""The autoscaler's planner on a reference table of synthetic clusters, written from the rules
in autoscaler/planner.py's docstring (expected sizes worked out by hand), plus its input
checks and the reasons it gives. Where EDL's `scaleAllDryRun` answers differently, the case
says what EDL answers and why (our reading of its `pkg/autoscaler.go`)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from autoscaler import Cluster, Job, Node, plan

pytestmark = pytest.mark.unit

GIB = 2**30


@dataclass(frozen=True)
class Other:
    """What other pods (pservers, masters, other workloads) request on a node."""

    cpu: int = 0
    gib: int = 0
    gpu: int = 0


def node(name: str, *, cpu: int, gib: int, gpu: int = 0, other: Other = Other()) -> tuple:
    return name, cpu, gib, gpu, other


def job(name: str, lo: int, hi: int, size: int, *, cpu: int, gib: int = 1, gpu: int = 0,
        on: str = "") -> Job:
    """A job whose placed trainers are on the nodes named by the letters of `on`."""
    return Job(name=name, min_trainers=lo, max_trainers=hi, trainers=size, cpu_milli=cpu,
               memory_bytes=gib * GIB, gpu=gpu, nodes=tuple(on))


def cluster(nodes: list[tuple], jobs: list[Job]) -> Cluster:
    """Nodes whose idle figures follow from their other pods and the trainers placed on them."""
    built = []
    for name, cpu, gib, gpu, other in nodes:
        here = [j for j in jobs for n in j.nodes if n == name]
        built.append(Node(name=name, cpu_milli=cpu, memory_bytes=gib * GIB, gpu=gpu,
                          idle_cpu_milli=cpu - other.cpu - sum(j.cpu_milli for j in here),
                          free_memory_bytes=(gib - other.gib) * GIB - sum(j.memory_bytes for j in here),
                          free_gpu=gpu - other.gpu - sum(j.gpu for j in here)))
    return Cluster(nodes=tuple(built), jobs=tuple(jobs))


@dataclass(frozen=True)
class Case:
    name: str
    nodes: list[tuple]
    jobs: list[Job]
    expected: dict[str, int]
    max_load: float = 0.97


CASES = [
    Case("grows_to_its_max_on_an_empty_node",
         [node("a", cpu=8000, gib=32)],
         [job("j", 1, 4, 1, cpu=1000, on="a")],
         {"j": 4}),
    Case("grows_by_what_fits_a_node_and_no_more",
         [node("a", cpu=4000, gib=64)],
         [job("j", 1, 10, 1, cpu=1500, on="a")],  # 2500m idle: one more 1500m trainer
         {"j": 2}),
    # EDL answers 4: after choosing node a for a trainer, its dry run *adds* the trainer's
    # 1000m to a's idle CPU, so a (1000m idle) is offered again until the cluster-wide budget
    # (97% of 16000m) runs out, and a is over-committed by 2000m.
    Case("overcommit_edl_gets_wrong_places_on_a_node_once",
         [node("a", cpu=4000, gib=16, other=Other(cpu=2000)),
          *(node(x, cpu=4000, gib=16, other=Other(cpu=3100)) for x in "bcd")],
         [job("j", 1, 10, 1, cpu=1000, on="a")],
         {"j": 2}),
    # EDL answers 3: its scale-down looks at CPU and GPU load only, and CPU is at 9%.
    Case("memory_counts_on_scale_down",
         [node("a", cpu=16000, gib=16, other=Other(gib=10))],
         [job("j", 1, 4, 3, cpu=500, gib=2, on="aaa")],  # 16 of 16 GiB: over 97%, down to 14
         {"j": 2}),
    Case("needs_cpu_and_memory_on_the_same_node",
         [node("a", cpu=16000, gib=8, other=Other(gib=6)),         # CPU, no memory
          node("b", cpu=16000, gib=4, other=Other(gib=3)),         # CPU, 1 GiB
          node("c", cpu=1000, gib=64, other=Other(cpu=1000))],     # memory, no CPU
         [job("j", 1, 4, 1, cpu=500, gib=2, on="a")],
         {"j": 1}),
    Case("gpu_job_grows_on_gpu_nodes_only",
         [node("a", cpu=32000, gib=128, gpu=4), node("b", cpu=32000, gib=128)],
         [job("g", 1, 8, 1, cpu=1000, gpu=1, on="a")],
         {"g": 4}, max_load=1.0),
    # EDL never settles here: it grows the job to 4 GPUs (its scale-up checks GPUs against
    # 100%), then shrinks it to 3 (its scale-down checks them against 97%), every round.
    Case("gpus_capped_by_max_load_desired_without_flapping",
         [node("a", cpu=32000, gib=128, gpu=4), node("b", cpu=32000, gib=128)],
         [job("g", 1, 8, 1, cpu=1000, gpu=1, on="a")],
         {"g": 3}),
    # EDL shrinks this CPU-only job because the *GPUs* are over 97%, which frees no GPU, and
    # grows it back for its CPU room: its dry run never settles.
    Case("cpu_job_not_shrunk_for_busy_gpus",
         [node("a", cpu=32000, gib=128, gpu=4, other=Other(gpu=4))],
         [job("c", 1, 3, 3, cpu=1000, on="aaa")],
         {"c": 3}),
    Case("fixed_job_is_load_never_resized",
         [node("a", cpu=8000, gib=32)],
         [job("fixed", 2, 2, 2, cpu=1000, on="aa"), job("e", 1, 8, 1, cpu=1000, on="a")],
         {"fixed": 2, "e": 6}, max_load=1.0),
    Case("fixed_job_below_its_size_is_not_grown",
         [node("a", cpu=8000, gib=32)],
         [job("fixed", 3, 3, 1, cpu=1000, on="a")],
         {"fixed": 1}),
    Case("least_fulfilled_grows_first",
         [node("a", cpu=5000, gib=32)],
         [job("half", 1, 5, 3, cpu=1000, on="aaa"), job("none", 1, 5, 1, cpu=1000, on="a")],
         {"half": 3, "none": 2}, max_load=1.0),
    Case("tie_on_fulfillment_broken_by_requests",
         [node("a", cpu=3500, gib=32)],  # 1500m idle: room for one trainer of either
         [job("big", 1, 4, 1, cpu=1000, gib=2, on="a"), job("small", 1, 4, 1, cpu=1000, gib=1, on="a")],
         {"big": 1, "small": 2}, max_load=1.0),
    Case("tie_on_fulfillment_cpu_before_memory",
         [node("a", cpu=4500, gib=32)],  # 2000m idle
         [job("cpu2", 1, 4, 1, cpu=1500, gib=1, on="a"), job("cpu1", 1, 4, 1, cpu=1000, gib=8, on="a")],
         {"cpu2": 1, "cpu1": 3}, max_load=1.0),  # cpu1 first, twice: cpu2 (1500m) never fits
    # Same fulfillment (0), same CPU and memory: only the GPU limit tells them apart, and the
    # job with fewer GPUs goes first. 1000m idle is room for one trainer of either (the node
    # has GPUs to spare), so "cpu_only" takes it; by name ("alpha" < "cpu_only") alpha would.
    Case("tie_on_fulfillment_fewer_gpus_first",
         [node("a", cpu=3000, gib=32, gpu=4)],  # 1000m idle, 3 GPUs free
         [job("alpha", 1, 4, 1, cpu=1000, gpu=1, on="a"), job("cpu_only", 1, 4, 1, cpu=1000, on="a")],
         {"alpha": 1, "cpu_only": 2}, max_load=1.0),
    Case("room_shared_round_robin_by_fulfillment",
         [node("a", cpu=6000, gib=32)],
         [job("x", 1, 5, 1, cpu=1000, on="a"), job("y", 1, 5, 1, cpu=1000, on="a")],
         {"x": 3, "y": 3}, max_load=1.0),
    Case("pservers_are_load_on_their_node",
         [node("a", cpu=8000, gib=32, other=Other(cpu=5000, gib=8))],  # two pservers
         [job("j", 1, 8, 1, cpu=1000, on="a")],
         {"j": 3}, max_load=1.0),
    Case("above_max_brought_down_to_max",
         [node("a", cpu=8000, gib=32)],
         [job("j", 1, 4, 6, cpu=1000, on="aaaaaa")],
         {"j": 4}),
    Case("below_min_grows_into_room",
         [node("a", cpu=8000, gib=32, other=Other(cpu=5000))],
         [job("j", 2, 6, 1, cpu=1000, on="a")],
         {"j": 3}, max_load=1.0),
    Case("below_min_without_room_stays",
         [node("a", cpu=2000, gib=32, other=Other(cpu=1000))],
         [job("j", 2, 6, 1, cpu=1000, on="a")],
         {"j": 1}),
    Case("over_cpu_load_shrinks_the_most_fulfilled_only_as_needed",
         [node("a", cpu=10000, gib=64)],  # 100% of CPU requested: one trainer off gets under 97%
         [job("full", 1, 5, 5, cpu=1000, on="aaaaa"), job("half", 1, 9, 5, cpu=1000, on="aaaaa")],
         {"full": 4, "half": 5}),
    # EDL answers the same sizes, by another road: it counts the newcomer's pending requests
    # in the load and shrinks until the load is under 97%.
    Case("wholly_pending_newcomer_makes_elastic_give_way_to_its_min",
         [node("a", cpu=5000, gib=32)],
         [job("e", 1, 5, 4, cpu=1200, on="aaaa"), job("new", 2, 2, 2, cpu=1000)],
         {"e": 2, "new": 2}),
    Case("most_fulfilled_gives_way_first",
         [node("a", cpu=11000, gib=64)],
         [job("e1", 1, 5, 5, cpu=1000, on="aaaaa"), job("e2", 1, 9, 5, cpu=1000, on="aaaaa"),
          job("new", 1, 1, 1, cpu=1500)],
         {"e1": 4, "e2": 5, "new": 1}),
    # EDL answers e = 1: the newcomer's 6000m of pending requests keep the load over 97% of
    # 5000m whatever e does, so e shrinks to its min and the newcomer still does not fit.
    Case("no_give_way_for_a_newcomer_that_cannot_fit",
         [node("a", cpu=5000, gib=32)],
         [job("e", 1, 4, 4, cpu=1200, on="aaaa"), job("new", 3, 3, 3, cpu=2000)],
         {"e": 4, "new": 3}),
    Case("newcomer_fits_on_the_freed_node_only",
         [node("a", cpu=3000, gib=16), node("b", cpu=3000, gib=16)],
         [job("e", 1, 6, 5, cpu=1000, on="aaabb"), job("new", 1, 1, 1, cpu=2000)],
         {"e": 4, "new": 1}, max_load=1.0),  # e's last trainer (on b) leaves: b has 2000m
    Case("waiting_trainers_placed_before_anyone_grows",
         [node("a", cpu=4000, gib=32)],
         [job("w", 1, 4, 3, cpu=1000, on="a"), job("g", 1, 4, 1, cpu=1000, on="a")],
         {"w": 3, "g": 1}, max_load=1.0),  # w's two waiting trainers take the 2000m left
    Case("no_jobs_no_changes",
         [node("a", cpu=4000, gib=16)],
         [],
         {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reference_table(case: Case):
    result = plan(cluster(case.nodes, case.jobs), max_load_desired=case.max_load)
    assert dict(result.sizes) == case.expected
    changed = {c.job for c in result.changes}
    assert changed == {j.name for j in case.jobs if case.expected[j.name] != j.trainers}
    for change in result.changes:
        assert change.reasons, change


def test_the_table_is_large_enough():
    assert len(CASES) >= 20
    assert len({c.name for c in CASES}) == len(CASES)


def test_overcommit_case_places_each_trainer_within_its_node():
    (case,) = [c for c in CASES if c.name.startswith("overcommit")]
    result = plan(cluster(case.nodes, case.jobs))
    assert result.placements["j"] == ("a", "a")  # a had room for one more, and only one


def test_reasons_name_the_rule():
    grow = plan(cluster([node("a", cpu=8000, gib=32)], [job("j", 1, 4, 1, cpu=1000, on="a")]))
    assert grow.changes[0].reasons == ("room on the nodes and under max_load_desired",)
    memory = plan(cluster([node("a", cpu=16000, gib=16, other=Other(gib=10))],
                          [job("j", 1, 4, 3, cpu=500, gib=2, on="aaa")]))
    assert memory.changes[0].reasons == ("cluster memory load 100.0% > max_load_desired 97%",)
    (case,) = [c for c in CASES if c.name.startswith("wholly_pending_newcomer")]
    way = plan(cluster(case.nodes, case.jobs))
    assert way.changes[0].reasons == ("gave way to job 'new', placed below its min (2)",)
    over = plan(cluster([node("a", cpu=8000, gib=32)], [job("j", 1, 4, 6, cpu=1000, on="aaaaaa")]))
    assert over.changes[0].reasons == ("above its max (4)",)


def test_newcomer_placed_where_the_freed_room_is():
    (case,) = [c for c in CASES if c.name == "newcomer_fits_on_the_freed_node_only"]
    result = plan(cluster(case.nodes, case.jobs), max_load_desired=1.0)
    assert result.placements == {"e": ("a", "a", "a", "b"), "new": ("b",)}


def test_trainers_that_cannot_be_placed_wait():
    (case,) = [c for c in CASES if c.name == "no_give_way_for_a_newcomer_that_cannot_fit"]
    result = plan(cluster(case.nodes, case.jobs))
    assert result.waiting("new") == 3 and result.waiting("e") == 0


# ---- input checks: each error names the bad value ------------------------------------------


@pytest.mark.parametrize(("make", "message"), [
    (lambda: job("j", 4, 2, 3, cpu=1), "maximum number of trainers of job 'j' (2) must be at least its minimum (4)"),
    (lambda: job("j", 0, 2, 1, cpu=1), "minimum number of trainers of job 'j' (0) must be an integer >= 1"),
    (lambda: job("j", 1, 2, -1, cpu=1), "number of trainers of job 'j' (-1)"),
    (lambda: job("j", 1, 2, 1, cpu=-5), "CPU request (millicores) of job 'j' (-5)"),
    (lambda: job("j", 1, 2, 1, cpu=1, gib=-1), "memory request (bytes) of job 'j' (-1073741824)"),
    (lambda: job("j", 1, 2, 1, cpu=1, gpu=-1), "GPU limit of job 'j' (-1)"),
    (lambda: job("j", 1, 2, 1, cpu=1, on="ab"), "2 placed trainers but a size of 1"),
    (lambda: job("", 1, 2, 1, cpu=1), "name of a job ('')"),
    (lambda: Job(name="j", min_trainers=1, max_trainers=2, trainers=1, cpu_milli=1, memory_bytes=1,
                 nodes=["a"]), "nodes of job 'j' (['a']) must be a tuple"),
    (lambda: Node(name="a", cpu_milli=1000, memory_bytes=1, idle_cpu_milli=2000), "idle_cpu_milli of node 'a' (2000)"),
    (lambda: Node(name="a", cpu_milli=-1, memory_bytes=1), "allocatable CPU (millicores) of node 'a' (-1)"),
    (lambda: Node(name="a", cpu_milli=1, memory_bytes=1, free_gpu=-2), "free_gpu of node 'a' (-2)"),
    (lambda: Cluster(nodes=(Node("a", 1, 1), Node("a", 1, 1)), jobs=()), "['a'] appear more than once"),
    (lambda: Cluster(nodes=(Node("a", 1000, 1),), jobs=(job("j", 1, 2, 1, cpu=1, on="b"),)),
     "trainer on node 'b', which is not in the snapshot"),
    (lambda: Cluster(nodes=(Node("a", 1000, GIB),), jobs=(job("j", 1, 2, 1, cpu=1, on="a"),)),
     "request more than its used part"),
    (lambda: plan(Cluster(nodes=(), jobs=()), max_load_desired=1.5), "max_load_desired (1.5)"),
    (lambda: plan(Cluster(nodes=(), jobs=()), max_load_desired=0), "max_load_desired (0)"),
])
def test_bad_input_is_refused_naming_the_value(make, message):
    with pytest.raises(ValueError) as error:
        make()
    assert message in str(error.value)


def test_plan_takes_a_cluster():
    with pytest.raises(TypeError, match="takes a Cluster, not dict"):
        plan({})


def test_node_defaults_to_empty():
    empty = Node(name="a", cpu_milli=4000, memory_bytes=GIB, gpu=2)
    assert (empty.idle_cpu_milli, empty.free_memory_bytes, empty.free_gpu) == (4000, GIB, 2)
